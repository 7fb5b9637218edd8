//! The one error type of this crate.

/// Why a prompt could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PromptError {
    /// A request field is invalid (a 400 naming it).
    #[error("{message}")]
    Invalid {
        /// The field, as OpenAI's `param`.
        param: String,
        /// What is wrong.
        message: String,
    },
    /// Tokenizing or templating failed.
    #[error("{0}")]
    Prompt(String),
}

impl PromptError {
    /// An invalid-field error.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        PromptError::Invalid {
            param: param.to_string(),
            message: message.into(),
        }
    }
}
