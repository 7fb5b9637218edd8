//! The one error type of the router's library.

/// Why a request could not be routed, or the router could not start.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RouterError {
    /// The model's waiting line is full.
    #[error("{limit} requests are already waiting for model `{model}` to have a ready replica")]
    QueueFull {
        /// The model.
        model: String,
        /// Its line's bound.
        limit: usize,
    },
    /// The request waited its whole timeout for a ready replica.
    #[error("no replica of model `{model}` became ready within {secs} s")]
    Timeout {
        /// The model.
        model: String,
        /// The timeout.
        secs: u64,
    },
    /// No endpoint serves the model asked for.
    #[error("The model `{0}` does not exist.")]
    UnknownModel(String),
    /// The request is malformed (a 400).
    #[error("{0}")]
    BadRequest(String),
    /// A `--endpoint` flag that is not `model=url`.
    #[error("--endpoint {0:?}: expected MODEL=URL (http://host:port)")]
    BadEndpoint(String),
}
