//! The one error type of the grammar crate.

/// Why a grammar engine could not be built or a grammar not compiled.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GrammarError {
    /// The tokenizer's vocabulary cannot drive a grammar (start-up).
    #[error("the vocabulary cannot drive structured outputs: {0}")]
    Vocabulary(String),
    /// The schema or grammar is invalid, uses what is not supported, or is
    /// beyond the limits: the client's error.
    #[error("{0}")]
    Compile(String),
}
