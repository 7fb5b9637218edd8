//! `--speculative-config`: vLLM's JSON, read by one function and refused
//! with the reason where this server cannot honour it. Two proposers are
//! served: the draftless n-gram method (prompt lookup), and a draft model
//! (read by [`SpeculativeFlag`], in `speculative/flag.rs`).
//!
//! ```text
//! {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
//! {"model": "/models/draft.gguf", "num_speculative_tokens": 4}
//! ```
//!
//! As vLLM reads it: with neither lookup bound given both are 5; with one
//! given the other is the same.

use serde_json::{Map, Value};

use crate::PlanError;

mod flag;

pub use flag::SpeculativeFlag;

/// The most draft tokens a row may verify in one step: each is one more
/// query position and one more vocabulary-wide logit row in the step.
pub const MAX_SPECULATIVE_TOKENS: u32 = 16;
/// The longest n-gram the prompt lookup matches.
pub const MAX_PROMPT_LOOKUP: u32 = 64;
/// vLLM's lookup bound when the config gives neither.
const DEFAULT_PROMPT_LOOKUP: u32 = 5;

/// The keys this server reads; any other is refused, naming it.
const KEYS: [&str; 4] = [
    "method",
    "num_speculative_tokens",
    "prompt_lookup_min",
    "prompt_lookup_max",
];

/// Speculative decoding by n-gram prompt lookup: up to
/// `num_speculative_tokens` draft tokens a step, copied from where the
/// sequence's last `prompt_lookup_min..=prompt_lookup_max` tokens occurred
/// before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpeculativeConfig {
    /// Draft tokens a row verifies at most in one step.
    pub num_speculative_tokens: u32,
    /// Shortest suffix that counts as a match.
    pub prompt_lookup_min: u32,
    /// Longest suffix matched.
    pub prompt_lookup_max: u32,
}

pub(crate) fn invalid(why: impl Into<String>) -> PlanError {
    PlanError::SpeculativeConfig(why.into())
}

/// A key's value as a whole number, or why not.
pub(crate) fn count(map: &Map<String, Value>, key: &str) -> Result<Option<u64>, PlanError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| invalid(format!("{key} must be a whole number, not {v}"))),
    }
}

impl SpeculativeConfig {
    /// Reads the flag's JSON as an n-gram config, refusing what this
    /// server does not serve (another method, an unknown key), counts out
    /// of range, and a draft model's config (see [`SpeculativeFlag`]).
    pub fn parse(text: &str) -> Result<Self, PlanError> {
        let flag = SpeculativeFlag::parse(text)?;
        match flag.draft_model {
            None => Ok(flag.config),
            Some(_) => Err(invalid("a draft model's config is not an n-gram config")),
        }
    }

    /// The n-gram config of the flag's JSON object `map` (no `model` key).
    pub(crate) fn from_map(map: &Map<String, Value>) -> Result<Self, PlanError> {
        if let Some(key) = map.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(invalid(format!(
                "unknown key `{key}` (this server reads {})",
                KEYS.join(", ")
            )));
        }
        match map.get("method").and_then(Value::as_str) {
            Some("ngram" | "[ngram]") => {}
            Some(other) => {
                return Err(invalid(format!(
                    "method `{other}` is not served (only `ngram`, or a draft `model`)"
                )));
            }
            None => {
                return Err(invalid("method is required (`ngram`), or a draft `model`"));
            }
        }
        let k = count(map, "num_speculative_tokens")?
            .ok_or_else(|| invalid("num_speculative_tokens is required"))?;
        Self::ngram(
            k,
            count(map, "prompt_lookup_min")?,
            count(map, "prompt_lookup_max")?,
        )
    }

    /// The n-gram config of `k` drafts and the lookup bounds given, read as
    /// vLLM reads them (neither: both 5; one: the other the same), if each
    /// is in range.
    pub fn ngram(k: u64, min: Option<u64>, max: Option<u64>) -> Result<Self, PlanError> {
        let (min, max) = match (min, max) {
            (None, None) => (DEFAULT_PROMPT_LOOKUP.into(), DEFAULT_PROMPT_LOOKUP.into()),
            (Some(min), None) => (min, min),
            (None, Some(max)) => (max, max),
            (Some(min), Some(max)) => (min, max),
        };
        Self::checked(k, min, max)
    }

    /// Checks the ranges; the message names the key.
    pub fn validate(&self) -> Result<(), PlanError> {
        let (k, min, max) = (
            self.num_speculative_tokens,
            self.prompt_lookup_min,
            self.prompt_lookup_max,
        );
        Self::checked(k.into(), min.into(), max.into()).map(|_| ())
    }

    /// The config of a draft model proposing `k` drafts, if `k` is in
    /// range (the lookup bounds, unused, are vLLM's defaults).
    pub fn drafting(k: u64) -> Result<Self, PlanError> {
        let lookup = u64::from(DEFAULT_PROMPT_LOOKUP);
        Self::checked(k, lookup, lookup)
    }

    /// The config of these counts, if each is in range.
    fn checked(k: u64, min: u64, max: u64) -> Result<Self, PlanError> {
        if !(1..=u64::from(MAX_SPECULATIVE_TOKENS)).contains(&k) {
            return Err(invalid(format!(
                "num_speculative_tokens must be 1 to {MAX_SPECULATIVE_TOKENS}, not {k}"
            )));
        }
        if min == 0 || max > u64::from(MAX_PROMPT_LOOKUP) || min > max {
            return Err(invalid(format!(
                "prompt_lookup_min ({min}) and prompt_lookup_max ({max}) must satisfy \
                 1 <= min <= max <= {MAX_PROMPT_LOOKUP}"
            )));
        }
        // In range, so each fits.
        let narrow = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
        Ok(SpeculativeConfig {
            num_speculative_tokens: narrow(k),
            prompt_lookup_min: narrow(min),
            prompt_lookup_max: narrow(max),
        })
    }

    /// The flag's value, as [`SpeculativeConfig::parse`] reads it back.
    pub fn to_arg(&self) -> String {
        format!(
            "{{\"method\": \"ngram\", \"num_speculative_tokens\": {}, \"prompt_lookup_max\": {}, \
             \"prompt_lookup_min\": {}}}",
            self.num_speculative_tokens, self.prompt_lookup_max, self.prompt_lookup_min
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ngram(k: u32, min: u32, max: u32) -> SpeculativeConfig {
        SpeculativeConfig {
            num_speculative_tokens: k,
            prompt_lookup_min: min,
            prompt_lookup_max: max,
        }
    }

    #[test]
    fn vllm_s_json_reads_with_its_defaults() {
        let cases = [
            (
                r#"{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}"#,
                ngram(5, 2, 4),
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 3}"#,
                ngram(3, 5, 5),
            ),
            (
                r#"{"method": "[ngram]", "num_speculative_tokens": 1, "prompt_lookup_max": 3}"#,
                ngram(1, 3, 3),
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 16, "prompt_lookup_min": 2, "prompt_lookup_max": null}"#,
                ngram(16, 2, 2),
            ),
        ];
        for (text, want) in cases {
            let got = SpeculativeConfig::parse(text).unwrap();
            assert_eq!(got, want, "{text}");
            assert_eq!(SpeculativeConfig::parse(&got.to_arg()).unwrap(), got);
        }
    }

    #[test]
    fn what_cannot_be_served_is_refused_with_the_reason() {
        let cases = [
            (
                r#"{"method": "ngram", "num_speculative_tokens": 0}"#,
                "num_speculative_tokens must be 1 to 16, not 0",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 17}"#,
                "num_speculative_tokens must be 1 to 16, not 17",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": -1}"#,
                "num_speculative_tokens must be a whole number, not -1",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 99999999999}"#,
                "num_speculative_tokens must be 1 to 16, not 99999999999",
            ),
            (
                r#"{"method": "ngram"}"#,
                "num_speculative_tokens is required",
            ),
            (r#"{"num_speculative_tokens": 2}"#, "method is required"),
            (
                r#"{"method": "eagle", "num_speculative_tokens": 2}"#,
                "method `eagle` is not served",
            ),
            (
                r#"{"model": "/m/draft.gguf", "num_speculative_tokens": 2}"#,
                "a draft model's config is not an n-gram config",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2}"#,
                "1 <= min <= max <= 64",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0}"#,
                "prompt_lookup_min (0)",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 65}"#,
                "prompt_lookup_max (65)",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 1}"#,
                "unknown key `draft_tensor_parallel_size`",
            ),
            ("[5]", "must be a JSON object"),
            ("ngram", "not JSON"),
        ];
        for (text, want) in cases {
            let err = SpeculativeConfig::parse(text).unwrap_err().to_string();
            assert!(err.contains(want), "{text}: {err}");
            assert!(err.starts_with("invalid --speculative-config: "), "{err}");
        }
    }
}
