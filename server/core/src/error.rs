//! The one error type of this crate.

/// Errors from the core.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The pool has fewer free blocks than asked for.
    #[error("KV pool exhausted: asked for {asked} blocks, {free} of {total} free")]
    PoolExhausted {
        /// Blocks asked for.
        asked: usize,
        /// Blocks free.
        free: usize,
        /// Blocks in the pool.
        total: usize,
    },
    /// A sequence asked for more blocks than its lease reserved.
    #[error("a sequence asked for {asked} KV blocks but reserved {reserved}")]
    OverReservation {
        /// Blocks its table would have.
        asked: usize,
        /// Blocks it reserved.
        reserved: usize,
    },
    /// A model forward pass failed.
    #[error("forward pass failed: {0}")]
    Forward(String),
    /// The tokenizers library failed (load, build, encode or decode).
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A GGUF vocabulary names a pre-tokenizer this crate does not know.
    #[error("unknown GGUF pre-tokenizer {0:?}")]
    UnknownPreTokenizer(String),
    /// A GGUF vocabulary is of a model type this crate does not know.
    #[error("unsupported GGUF tokenizer model {0:?}")]
    UnsupportedVocab(String),
    /// A GGUF vocabulary is inconsistent (lengths, ids, merges).
    #[error("invalid GGUF vocabulary: {0}")]
    InvalidVocab(String),
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A chat template failed to compile or render, or a config lacks one.
    #[error("chat template: {0}")]
    ChatTemplate(String),
}
