//! Which tokens' hidden states make a sequence's vector, spelt as the
//! `--pooling` flag and llama.cpp spell it.

use std::fmt;
use std::str::FromStr;

/// Which tokens' hidden states make a sequence's vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolingMethod {
    /// The first token's ([CLS]): BERT-style encoders.
    Cls,
    /// The mean over every token.
    Mean,
    /// The last token's: decoders (Qwen3-Embedding), whose last token has
    /// seen the whole text.
    Last,
}

impl PoolingMethod {
    /// Every method's name, as the flag takes them.
    pub const NAMES: [&str; 3] = ["cls", "mean", "last"];

    /// llama.cpp's `pooling_type` (1 mean, 2 cls, 3 last), if it is one
    /// of these.
    pub fn from_gguf(n: u32) -> Option<Self> {
        match n {
            1 => Some(PoolingMethod::Mean),
            2 => Some(PoolingMethod::Cls),
            3 => Some(PoolingMethod::Last),
            _ => None,
        }
    }
}

impl fmt::Display for PoolingMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PoolingMethod::Cls => "cls",
            PoolingMethod::Mean => "mean",
            PoolingMethod::Last => "last",
        })
    }
}

impl FromStr for PoolingMethod {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cls" => Ok(PoolingMethod::Cls),
            "mean" => Ok(PoolingMethod::Mean),
            "last" | "lasttoken" => Ok(PoolingMethod::Last),
            _ => Err(format!(
                "`{s}` is not a pooling method ({})",
                Self::NAMES.join(", ")
            )),
        }
    }
}
