//! What a deployment's model serves: text generation, embeddings, or
//! scores (a reranker). The server's `--task`, the operator's `spec.task`
//! and `/v1/models` spell it alike.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What a model serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Task {
    /// Completions and chat: a decoder sampled token by token.
    #[default]
    Generate,
    /// Embeddings: one forward a text, pooled into a vector.
    Embed,
    /// Scores of text pairs (a cross-encoder reranker).
    Score,
}

impl Task {
    /// Every task's name.
    pub const NAMES: [&str; 3] = ["generate", "embed", "score"];

    /// Whether the model is pooled, one forward a request, no KV kept.
    pub fn is_pooling(self) -> bool {
        !matches!(self, Task::Generate)
    }

    /// The name, as flags and the API spell it.
    pub fn name(self) -> &'static str {
        match self {
            Task::Generate => "generate",
            Task::Embed => "embed",
            Task::Score => "score",
        }
    }
}

impl fmt::Display for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Task {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "generate" => Ok(Task::Generate),
            "embed" => Ok(Task::Embed),
            "score" => Ok(Task::Score),
            _ => Err(format!("`{s}` is not a task ({})", Self::NAMES.join(", "))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_spell_alike_in_flags_and_json() {
        for name in Task::NAMES {
            let t: Task = name.parse().unwrap();
            assert_eq!(t.to_string(), name);
            assert_eq!(serde_json::to_string(&t).unwrap(), format!("\"{name}\""));
        }
        assert!(
            "rank"
                .parse::<Task>()
                .unwrap_err()
                .contains("generate, embed, score")
        );
        assert!(Task::Embed.is_pooling() && !Task::Generate.is_pooling());
    }
}
