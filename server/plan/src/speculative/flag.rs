//! The whole of `--speculative-config`: the n-gram config, or a draft
//! model's path with its draft count (vLLM's keys: `{"model": PATH,
//! "num_speculative_tokens": k}`, `"method": "draft_model"` optional).

use serde_json::{Map, Value};

use super::{SpeculativeConfig, count, invalid};
use crate::PlanError;

/// The keys a draft model's config may have; any other is refused, naming it.
const DRAFT_KEYS: [&str; 3] = ["model", "method", "num_speculative_tokens"];

/// What `--speculative-config` asks for: the draft count (and lookup bounds,
/// for n-gram), and the draft model that proposes, if one does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpeculativeFlag {
    /// Draft tokens a row verifies at most in one step; the lookup bounds
    /// are the n-gram proposer's (unused with a draft model).
    pub config: SpeculativeConfig,
    /// The draft model's file or directory, as given; `None`: n-gram.
    pub draft_model: Option<String>,
}

impl SpeculativeFlag {
    /// Reads the flag's JSON, refusing what this server does not serve
    /// (another method, an unknown key), counts out of range, and a draft
    /// model with no path.
    pub fn parse(text: &str) -> Result<Self, PlanError> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| invalid(format!("not JSON: {e}")))?;
        let Value::Object(map) = value else {
            return Err(invalid("must be a JSON object"));
        };
        if !map.contains_key("model") {
            if map.get("method").and_then(Value::as_str) == Some("draft_model") {
                return Err(invalid("method `draft_model` needs a `model` (its path)"));
            }
            let config = SpeculativeConfig::from_map(&map)?;
            return Ok(SpeculativeFlag {
                config,
                draft_model: None,
            });
        }
        Self::draft(&map)
    }

    /// A draft model's config, from the flag's JSON object `map`.
    fn draft(map: &Map<String, Value>) -> Result<Self, PlanError> {
        if let Some(key) = map.keys().find(|k| !DRAFT_KEYS.contains(&k.as_str())) {
            return Err(invalid(format!(
                "unknown key `{key}` with a draft model (it reads {})",
                DRAFT_KEYS.join(", ")
            )));
        }
        match map.get("method") {
            None | Some(Value::Null) => {}
            Some(Value::String(m)) if m == "draft_model" => {}
            Some(other) => {
                return Err(invalid(format!(
                    "method {other} with a draft model (it is `draft_model`, or absent)"
                )));
            }
        }
        let path = match map.get("model") {
            Some(Value::String(p)) if !p.trim().is_empty() => p.clone(),
            other => {
                let got = other.map_or_else(String::new, Value::to_string);
                return Err(invalid(format!(
                    "model must be the draft model's path, not {got}"
                )));
            }
        };
        let k = count(map, "num_speculative_tokens")?
            .ok_or_else(|| invalid("num_speculative_tokens is required"))?;
        Ok(SpeculativeFlag {
            config: SpeculativeConfig::drafting(k)?,
            draft_model: Some(path),
        })
    }

    /// The flag's value, as [`SpeculativeFlag::parse`] reads it back.
    pub fn to_arg(&self) -> String {
        match &self.draft_model {
            None => self.config.to_arg(),
            Some(path) => {
                let map = serde_json::json!({
                    "model": path,
                    "num_speculative_tokens": self.config.num_speculative_tokens,
                });
                map.to_string()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_draft_model_reads_with_vllm_s_keys_and_back() {
        let cases = [
            (
                r#"{"model": "/m/draft.gguf", "num_speculative_tokens": 4}"#,
                "/m/draft.gguf",
                4,
            ),
            (
                r#"{"method": "draft_model", "model": "/m/a \"b\"", "num_speculative_tokens": 16}"#,
                "/m/a \"b\"",
                16,
            ),
        ];
        for (text, path, k) in cases {
            let got = SpeculativeFlag::parse(text).unwrap();
            assert_eq!(got.draft_model.as_deref(), Some(path), "{text}");
            assert_eq!(got.config.num_speculative_tokens, k);
            assert_eq!(SpeculativeFlag::parse(&got.to_arg()).unwrap(), got);
        }
        // The n-gram config reads as before, with no draft.
        let ngram = r#"{"method": "ngram", "num_speculative_tokens": 3}"#;
        let got = SpeculativeFlag::parse(ngram).unwrap();
        assert_eq!(got.draft_model, None);
        assert_eq!(got.config, SpeculativeConfig::parse(ngram).unwrap());
        assert_eq!(SpeculativeFlag::parse(&got.to_arg()).unwrap(), got);
    }

    #[test]
    fn a_bad_draft_config_is_refused_with_the_reason() {
        let cases = [
            (
                r#"{"model": "d.gguf", "num_speculative_tokens": 0}"#,
                "num_speculative_tokens must be 1 to 16, not 0",
            ),
            (
                r#"{"model": "d.gguf", "num_speculative_tokens": 17}"#,
                "num_speculative_tokens must be 1 to 16, not 17",
            ),
            (
                r#"{"model": "d.gguf"}"#,
                "num_speculative_tokens is required",
            ),
            (
                r#"{"model": "", "num_speculative_tokens": 2}"#,
                "model must be the draft model's path",
            ),
            (
                r#"{"model": 5, "num_speculative_tokens": 2}"#,
                "model must be the draft model's path, not 5",
            ),
            (
                r#"{"model": "d.gguf", "method": "ngram", "num_speculative_tokens": 2}"#,
                "method \"ngram\" with a draft model",
            ),
            (
                r#"{"model": "d.gguf", "num_speculative_tokens": 2, "prompt_lookup_min": 2}"#,
                "unknown key `prompt_lookup_min` with a draft model",
            ),
            (
                r#"{"method": "draft_model", "num_speculative_tokens": 2}"#,
                "method `draft_model` needs a `model`",
            ),
        ];
        for (text, want) in cases {
            let err = SpeculativeFlag::parse(text).unwrap_err().to_string();
            assert!(err.contains(want), "{text}: {err}");
            assert!(err.starts_with("invalid --speculative-config: "), "{err}");
        }
    }
}
