//! The one error type of the engine crate.

/// Why a request was refused or failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    /// The request itself is invalid (bad parameter, empty prompt...).
    #[error("{message}")]
    Invalid {
        /// What is wrong, for the client.
        message: String,
        /// The offending request field, if any.
        param: Option<String>,
    },
    /// The request could never fit, even on an empty server.
    #[error(
        "this request needs {needed_tokens} tokens ({prompt_tokens} prompt + {max_tokens} max_tokens), \
         more than the server's limit of {limit_tokens} tokens ({limit})"
    )]
    TooLong {
        /// Tokens in the prompt.
        prompt_tokens: usize,
        /// Tokens asked for.
        max_tokens: usize,
        /// Prompt plus max_tokens.
        needed_tokens: usize,
        /// The most tokens one sequence may use here.
        limit_tokens: usize,
        /// What sets that limit: the longest sequence served, or the pool
        /// that cannot hold more, with its numbers.
        limit: String,
    },
    /// The waiting line is full; retry later.
    #[error("the server's waiting line is full ({max_queue} requests); retry later")]
    QueueFull {
        /// The configured bound on waiting requests.
        max_queue: usize,
    },
    /// The server is shutting down and accepts no new work.
    #[error("the server is draining and accepts no new requests")]
    Draining,
    /// The worker thread is gone.
    #[error("the batching worker is not running")]
    WorkerGone,
    /// The pools the scheduler was given are not the model's KV cache: a
    /// wiring bug, refused at start rather than found as a stray block.
    #[error(
        "the model's KV cache holds {model_pools} in blocks of {model_block_size} tokens, \
         but the engine was configured for {pools} in blocks of {block_size}"
    )]
    PoolMismatch {
        /// The model's pools (`blocks` or `blocks (window w)` each).
        model_pools: String,
        /// Tokens per block in the model's cache.
        model_block_size: usize,
        /// The pools the engine's config asked for, spelt the same way.
        pools: String,
        /// Tokens per block the engine's config asked for.
        block_size: usize,
    },
    /// The server's configuration cannot be served (a lower KV tier that
    /// cannot be written, or larger than its volume), refused at start.
    #[error("{0}")]
    Config(String),
    /// The model failed while running this request.
    #[error("model error: {0}")]
    Model(String),
}

impl EngineError {
    /// The request field to blame, if one is.
    pub fn param(&self) -> Option<&str> {
        match self {
            EngineError::Invalid { param, .. } => param.as_deref(),
            EngineError::TooLong { .. } => Some("max_tokens"),
            _ => None,
        }
    }

    /// An [`EngineError::Invalid`] naming `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        EngineError::Invalid {
            message: message.into(),
            param: Some(param.to_string()),
        }
    }
}
