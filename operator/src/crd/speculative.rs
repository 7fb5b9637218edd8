//! Speculative decoding on a `ModelDeployment`: rendered into the pods'
//! `--speculative-config` (vLLM's JSON), read by ferrox-plan's one reader.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::GeometrySpec;

/// The CEL message for a draft model source the grammar refuses.
pub const DRAFT_SOURCE_MESSAGE: &str = "speculative.model must be hf://org/name[@rev][/file], pvc://claim/path, file:///path or https://host/file";

/// How the servers propose the draft tokens they verify.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum SpeculativeMethod {
    /// Prompt lookup: the tokens that followed the sequence's last few
    /// tokens where they occurred before, in its prompt or output.
    #[serde(rename = "ngram")]
    Ngram,
    /// A smaller model with the target's tokenizer (`model`) drafts greedily.
    #[serde(rename = "draft_model")]
    DraftModel,
}

/// Speculative decoding: each decoding sequence verifies up to
/// `numSpeculativeTokens` draft tokens in a step, where that pays (a busy
/// server runs as if it were off). Greedy and seeded output is unchanged.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "self.method == 'draft_model' ? has(self.model) : !has(self.model) && !has(self.draftGeometry)"
).message("speculative.model (the draft model) is required with method draft_model and only with it"))]
#[x_kube(validation = Rule::new(
    "self.method == 'ngram' || (!has(self.promptLookupMin) && !has(self.promptLookupMax))"
).message("speculative.promptLookupMin/Max are the ngram method's"))]
pub struct SpeculativeSpec {
    /// The proposer: `ngram`, or `draft_model` with `model`.
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
    /// The draft model (method `draft_model`): a smaller model with the
    /// target's tokenizer, from the sources a model comes from
    /// (`hf://org/name[@rev][/file.gguf]`, `pvc://claim/path`,
    /// `file:///path`, `https://...`). Its weights and KV are planned
    /// beside the model's; inspected with the model unless `draftGeometry`
    /// is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(ferrox_source::cel_rule()).message(DRAFT_SOURCE_MESSAGE))]
    #[schemars(length(min = 1, max = 2048))]
    pub model: Option<String>,
    /// The draft model's geometry (its `ferrox-server inspect --json`), to
    /// plan without inspecting it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_geometry: Option<GeometrySpec>,
}

impl SpeculativeSpec {
    /// The server's config of this spec, or why it cannot be served.
    pub fn config(&self) -> Result<ferrox_plan::SpeculativeConfig, ferrox_plan::PlanError> {
        let k = self.num_speculative_tokens.into();
        match self.method {
            SpeculativeMethod::Ngram => ferrox_plan::SpeculativeConfig::ngram(
                k,
                self.prompt_lookup_min.map(u64::from),
                self.prompt_lookup_max.map(u64::from),
            ),
            SpeculativeMethod::DraftModel => ferrox_plan::SpeculativeConfig::drafting(k),
        }
    }

    /// The draft model's source, with method `draft_model`.
    pub fn draft_source(&self) -> Option<&str> {
        match self.method {
            SpeculativeMethod::DraftModel => self.model.as_deref(),
            SpeculativeMethod::Ngram => None,
        }
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
            model: None,
            draft_geometry: None,
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

    #[test]
    fn a_draft_model_is_the_draft_count_and_a_source() {
        let yaml = "method: draft_model\nnumSpeculativeTokens: 4\nmodel: pvc://models/draft.gguf\n";
        let read: SpeculativeSpec = serde_yaml::from_str(yaml).unwrap();
        assert_eq!(read.draft_source(), Some("pvc://models/draft.gguf"));
        let c = read.config().unwrap();
        assert_eq!(c.num_speculative_tokens, 4);
        // An n-gram spec names no draft, whatever else it carries.
        let ngram = SpeculativeSpec {
            method: SpeculativeMethod::Ngram,
            ..read.clone()
        };
        assert_eq!(ngram.draft_source(), None);
        let too_many = SpeculativeSpec {
            num_speculative_tokens: 17,
            ..read
        };
        assert!(too_many.config().is_err());
    }
}
