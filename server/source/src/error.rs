//! Why a source string was refused.

/// A source string that is not one of the accepted shapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// The source as given.
    pub input: String,
    /// What is wrong with it.
    pub reason: String,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid model source {:?}: {}", self.input, self.reason)
    }
}

impl std::error::Error for ParseError {}
