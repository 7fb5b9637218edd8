//! The one error type of this crate.

/// Errors from loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The model's architecture is not one this crate implements.
    #[error("unsupported architecture {name:?} (supported: {supported})")]
    UnknownArchitecture {
        /// The architecture the model names.
        name: String,
        /// The names this crate serves, comma-separated.
        supported: String,
    },
    /// A tensor the architecture needs is not in the file.
    #[error("missing tensor {0:?}")]
    MissingTensor(String),
    /// A tensor has the wrong shape.
    #[error("tensor {name:?} has shape {got:?}, expected {want:?}")]
    BadShape {
        /// Tensor name.
        name: String,
        /// Shape found.
        got: Vec<usize>,
        /// Shape expected.
        want: Vec<usize>,
    },
    /// A metadata key or config field is missing or has the wrong type.
    #[error("bad model config: {0}")]
    Config(String),
    /// The path is neither a GGUF file nor a Hugging Face model directory.
    #[error("{0}: not a GGUF file or a directory with config.json and *.safetensors")]
    UnknownFormat(String),
    /// The file is not a valid GGUF or safetensors file (truncated, corrupt).
    #[error("{path}: {message}")]
    Corrupt {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// A LoRA adapter was refused: its name and why.
    #[error("LoRA adapter {name:?} refused: {reason}")]
    Adapter {
        /// The adapter's name.
        name: String,
        /// Why.
        reason: String,
    },
    /// Tokenizer, template or KV pool error from ferrox-core.
    #[error(transparent)]
    Core(#[from] ferrox_core::Error),
    /// A forward-pass input is out of range.
    #[error("invalid input: {0}")]
    Input(String),
    /// A CPU kernel refused its inputs.
    #[error("kernel: {0}")]
    Kernel(#[from] ferrox_kernels::Error),
    /// A tensor operation failed.
    #[error("tensor op: {0}")]
    Candle(#[from] candle_core::Error),
}

impl From<Error> for ferrox_core::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Core(e) => e,
            other => ferrox_core::Error::Forward(other.to_string()),
        }
    }
}

/// Result with this crate's error.
pub type Result<T> = std::result::Result<T, Error>;
