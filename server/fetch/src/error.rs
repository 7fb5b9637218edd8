//! The crate's one error type, and how HTTP statuses map onto it.

use std::path::PathBuf;

impl From<ferrox_source::ParseError> for Error {
    fn from(e: ferrox_source::ParseError) -> Self {
        Error::Parse {
            input: e.input,
            reason: e.reason,
        }
    }
}

/// Everything that can go wrong turning a model source into a local path.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The source string is not one of the accepted shapes.
    #[error("invalid model source {input:?}: {reason}")]
    Parse {
        /// The source as given.
        input: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A local path (or `file://` URI) that does not exist.
    #[error("model path {0} does not exist")]
    LocalMissing(PathBuf),
    /// The server answered 401 or 403.
    #[error(
        "{what}: access denied (HTTP {status}); {hint} (the repo may also be private, gated, or not exist)"
    )]
    Unauthorized {
        /// The repo/file or URL asked for.
        what: String,
        /// 401 or 403.
        status: u16,
        /// Whether a token was sent, phrased for the user.
        hint: &'static str,
    },
    /// The server answered 404.
    #[error("{what}: not found (HTTP 404); check the repo, revision and file names")]
    NotFound {
        /// The repo/file or URL asked for.
        what: String,
    },
    /// Any other HTTP status.
    #[error("{what}: HTTP {status}")]
    Status {
        /// The repo/file or URL asked for.
        what: String,
        /// The status code.
        status: u16,
    },
    /// The server could not be reached or the transfer broke off.
    #[error("{what}: download failed: {message}")]
    Network {
        /// The repo/file or URL asked for.
        what: String,
        /// The underlying error, flattened.
        message: String,
    },
    /// A file system operation failed (disk full, permissions, ...).
    #[error("{path}: {source}")]
    Io {
        /// The path being read or written.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A downloaded file had unexpected contents.
    #[error("{path}: {reason}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

/// Whether a request carried a Hugging Face token (for 401/403 hints).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Token {
    /// An `hf://` request with `HF_TOKEN` set.
    Sent,
    /// An `hf://` request without a token.
    NotSent,
    /// A plain URL: tokens are never sent there.
    Never,
}

impl Error {
    /// An `Io` error for `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// Maps a non-success HTTP status for `what` onto an error.
    pub(crate) fn from_status(what: &str, status: u16, token: Token) -> Self {
        let what = what.to_string();
        match status {
            401 | 403 => Error::Unauthorized {
                what,
                status,
                hint: match token {
                    Token::Sent => "the HF_TOKEN given is wrong or lacks access",
                    Token::NotSent => "no token was given: set HF_TOKEN",
                    Token::Never => "plain URLs are fetched without credentials; use a public URL",
                },
            },
            404 => Error::NotFound { what },
            _ => Error::Status { what, status },
        }
    }

    /// Maps a reqwest error for `what` onto an error (status if it has one).
    pub(crate) fn from_reqwest(what: &str, err: &reqwest::Error, token: Token) -> Self {
        match err.status() {
            Some(status) => Self::from_status(what, status.as_u16(), token),
            None => Error::Network {
                what: what.to_string(),
                message: chain(err),
            },
        }
    }
}

/// The error and its sources, joined with ": ".
pub(crate) fn chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut next = err.source();
    while let Some(e) = next {
        out.push_str(": ");
        out.push_str(&e.to_string());
        next = e.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_clear_errors() {
        let e = Error::from_status("hf://a/b config.json", 401, Token::NotSent);
        assert!(e.to_string().contains("set HF_TOKEN"), "{e}");
        let e = Error::from_status("hf://a/b config.json", 403, Token::Sent);
        assert!(e.to_string().contains("HF_TOKEN given is wrong"), "{e}");
        let e = Error::from_status("https://h/m.gguf", 401, Token::Never);
        assert!(e.to_string().contains("without credentials"), "{e}");
        let e = Error::from_status("hf://a/b config.json", 404, Token::NotSent);
        assert!(
            e.to_string().contains("hf://a/b config.json: not found"),
            "{e}"
        );
        let e = Error::from_status("x", 500, Token::NotSent);
        assert!(matches!(e, Error::Status { status: 500, .. }));
    }
}
