//! What a step carries for each of its sequences: its new tokens' place,
//! its block tables and its state slot.

/// The new tokens of one sequence in a step.
#[derive(Debug, Clone)]
pub struct SeqSpan {
    /// The sequence's block table in each KV group (`Decoder::kv_groups`
    /// order). A windowed group's entries before its window may be released
    /// (any value): attention never reads them.
    pub tables: Vec<Vec<u32>>,
    /// Position of the first new token.
    pub start_pos: usize,
    /// New tokens (1 for a decode row, the chunk length for prefill).
    pub n_tokens: usize,
    /// The sequence's slot in the state store (models with recurrent
    /// layers; `None` otherwise).
    pub state: Option<u32>,
}
