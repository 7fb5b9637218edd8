//! The library's one error type.

/// Everything the operator's library can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The spec cannot be acted on.
    #[error("invalid spec: {0}")]
    InvalidSpec(String),
    /// A (de)serialisation failed.
    #[error("serialisation: {0}")]
    Serde(#[from] serde_json::Error),
    /// A YAML document could not be read or written.
    #[error("yaml: {0}")]
    Yaml(#[from] serde_yaml::Error),
    /// Scraping a pod's metrics failed.
    #[error("scrape {url}: {message}")]
    Scrape {
        /// The URL scraped.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// An object lacked a field the operator needs.
    #[error("missing {0}")]
    Missing(&'static str),
}

/// Results of the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;
