//! The interface the batching worker drives a model through.
//!
//! The model owns the KV storage, indexed by block id; the worker owns which
//! blocks belong to which sequence (through [`crate::BlockLease`]s) and passes
//! each sequence's block table with every call.

use crate::Error;

/// One row of a batched decode step.
#[derive(Debug, Clone, Copy)]
pub struct DecodeRow<'a> {
    /// The token to feed.
    pub token: u32,
    /// Its position in the sequence (tokens already in the KV).
    pub pos: usize,
    /// The sequence's block table.
    pub blocks: &'a [u32],
}

/// A chunk of one sequence's prompt in a mixed step.
#[derive(Debug, Clone, Copy)]
pub struct PrefillChunk<'a> {
    /// The sequence's block table.
    pub blocks: &'a [u32],
    /// The prompt tokens to run, starting at `pos`.
    pub tokens: &'a [u32],
    /// Position of the first token (prompt tokens already in the KV).
    pub pos: usize,
    /// Whether the logits after the chunk's last token are wanted (the final
    /// chunk of a prompt).
    pub want_logits: bool,
}

/// Logits of a mixed step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepLogits {
    /// One per prefill chunk, in order: `Some` where the chunk wanted logits.
    pub prefill: Vec<Option<Vec<f32>>>,
    /// One per decode row, in order.
    pub decode: Vec<Vec<f32>>,
}

/// A decoder that runs many sequences, each with its own paged KV.
pub trait BatchModel: Send {
    /// Size of the logit rows returned.
    fn vocab_size(&self) -> usize;

    /// Tokens per KV block.
    fn block_size(&self) -> usize;

    /// Runs `tokens`, a chunk of one sequence's prompt starting at position
    /// `pos`, into that sequence's KV. Returns the logits after the chunk's last
    /// token when `want_logits` (the final chunk), else `None`. Chunks of any
    /// size give the same result as one whole prefill.
    fn prefill(
        &mut self,
        blocks: &[u32],
        tokens: &[u32],
        pos: usize,
        want_logits: bool,
    ) -> Result<Option<Vec<f32>>, Error>;

    /// One batched decode step: feeds each row's token at its position and
    /// returns one row of logits per input row, in the same order.
    fn decode(&mut self, rows: &[DecodeRow<'_>]) -> Result<Vec<Vec<f32>>, Error>;

    /// One mixed step: prefill chunks of several prompts and decode rows,
    /// which a model may run as a single forward pass. The default runs each
    /// chunk through [`BatchModel::prefill`], then the rows (if any) through
    /// one [`BatchModel::decode`].
    fn step(
        &mut self,
        prefill: &[PrefillChunk<'_>],
        decode: &[DecodeRow<'_>],
    ) -> Result<StepLogits, Error> {
        let prefill = prefill
            .iter()
            .map(|c| self.prefill(c.blocks, c.tokens, c.pos, c.want_logits))
            .collect::<Result<Vec<_>, Error>>()?;
        let decode = if decode.is_empty() {
            Vec::new()
        } else {
            self.decode(decode)?
        };
        Ok(StepLogits { prefill, decode })
    }
}
