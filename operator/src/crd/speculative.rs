//! Speculative decoding on a `ModelDeployment`: rendered into the pods'
//! `--speculative-config` (vLLM's JSON), read by ferrox-plan's one reader.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How the servers propose the draft tokens they verify.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SpeculativeMethod {
    /// Prompt lookup: the tokens that followed the sequence's last few
    /// tokens where they occurred before, in its prompt or output.
    Ngram,
}

/// Speculative decoding: each decoding sequence verifies up to
/// `numSpeculativeTokens` draft tokens in a step, where that pays (a busy
/// server runs as if it were off). Greedy and seeded output is unchanged.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpeculativeSpec {
    /// The proposer (`ngram` is the one served).
    pub method: SpeculativeMethod,
    /// Draft tokens a sequence verifies at most in one step.
    #[schemars(range(min = 1, max = 16))]
    pub num_speculative_tokens: u32,
    /// Shortest suffix that counts as a match (absent: `promptLookupMax`,
    /// or 5 when both are absent, as vLLM reads it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub prompt_lookup_min: Option<u32>,
    /// Longest suffix matched (absent: `promptLookupMin`, or 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub prompt_lookup_max: Option<u32>,
}

impl SpeculativeSpec {
    /// The server's config of this spec, or why it cannot be served.
    pub fn config(&self) -> Result<ferrox_plan::SpeculativeConfig, ferrox_plan::PlanError> {
        let SpeculativeMethod::Ngram = self.method;
        ferrox_plan::SpeculativeConfig::ngram(
            self.num_speculative_tokens.into(),
            self.prompt_lookup_min.map(u64::from),
            self.prompt_lookup_max.map(u64::from),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_bounds_are_the_plan_s() {
        let schema = serde_json::to_value(schemars::schema_for!(SpeculativeSpec)).unwrap();
        let props = &schema["properties"];
        let max = |key: &str| props[key]["maximum"].as_f64();
        let bound = |n: u32| Some(f64::from(n));
        assert_eq!(
            max("numSpeculativeTokens"),
            bound(ferrox_plan::MAX_SPECULATIVE_TOKENS)
        );
        for key in ["promptLookupMin", "promptLookupMax"] {
            assert_eq!(max(key), bound(ferrox_plan::MAX_PROMPT_LOOKUP), "{key}");
        }
    }

    #[test]
    fn the_spec_reads_as_vllm_s_json_does() {
        let spec = |k, min, max| SpeculativeSpec {
            method: SpeculativeMethod::Ngram,
            num_speculative_tokens: k,
            prompt_lookup_min: min,
            prompt_lookup_max: max,
        };
        let c = spec(5, Some(2), Some(4)).config().unwrap();
        assert_eq!(
            (
                c.num_speculative_tokens,
                c.prompt_lookup_min,
                c.prompt_lookup_max
            ),
            (5, 2, 4)
        );
        let c = spec(3, None, None).config().unwrap();
        assert_eq!((c.prompt_lookup_min, c.prompt_lookup_max), (5, 5));
        let err = spec(3, Some(4), Some(2)).config().unwrap_err().to_string();
        assert!(err.contains("1 <= min <= max"), "{err}");
        let yaml = "method: ngram\nnumSpeculativeTokens: 4\npromptLookupMax: 3\n";
        let read: SpeculativeSpec = serde_yaml::from_str(yaml).unwrap();
        assert_eq!(read, spec(4, None, Some(3)));
        assert!(
            serde_yaml::from_str::<SpeculativeSpec>("method: eagle\nnumSpeculativeTokens: 4\n")
                .is_err()
        );
    }
}
