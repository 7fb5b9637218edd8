//! The response bodies, one definition each: the handlers build these types
//! and serialize them (response.rs, tokenize.rs, serve/routes/info.rs),
//! `/openapi.json` describes them, and the tests read every real body back
//! through them (unknown fields refused), so the two cannot drift apart.
//!
//! Logprobs are f64 in the types and f32 in the schema: the engine's f32,
//! widened, which is how these bodies have always printed them (an f32
//! serialized as itself prints shorter).

use std::collections::BTreeMap;

use ferrox_engine::Usage;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /v1/completions`, not streamed.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompletionResponse {
    /// `cmpl-...`.
    pub id: String,
    /// `text_completion`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// One per `n`.
    pub choices: Vec<CompletionChoice>,
    /// Tokens: the prompt once, every choice's output.
    pub usage: UsageBody,
}

/// One streamed `/v1/completions` event; the last one (with
/// `stream_options.include_usage`) has no choices and the usage.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompletionChunk {
    /// `cmpl-...`, the same in every chunk.
    pub id: String,
    /// `text_completion`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// The choice this chunk continues.
    pub choices: Vec<CompletionChoice>,
    /// Only in the last chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageBody>,
}

/// A completion choice, whole or one chunk of it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompletionChoice {
    /// Which of the `n`.
    pub index: usize,
    /// The text (after the echoed prompt with `echo`).
    pub text: String,
    /// With `logprobs`.
    pub logprobs: Option<CompletionLogprobs>,
    /// `stop` or `length`; null until the choice ends.
    pub finish_reason: Option<String>,
    /// With `prompt_logprobs` (whole answers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<PromptLogprobsSchema>)]
    pub prompt_logprobs: Option<PromptLogprobs>,
}

/// vLLM's prompt logprobs: null for the first prompt token, then per token
/// its id (as a string) and its top alternatives' ids to their entries.
pub type PromptLogprobs = Vec<Option<Ranked<PromptLogprob>>>;

/// [`PromptLogprobs`] as the schema describes it: the map it is written as.
type PromptLogprobsSchema = Vec<Option<BTreeMap<String, PromptLogprob>>>;

/// One entry of [`PromptLogprobs`].
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptLogprob {
    /// The token's log-probability at that position.
    #[schema(value_type = f32)]
    pub logprob: f64,
    /// Its rank in the vocabulary (1: the most likely).
    pub rank: usize,
    /// Its text.
    pub decoded_token: String,
}

/// Completion logprobs, the prompt's first with `echo`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompletionLogprobs {
    /// Each token's text.
    pub tokens: Vec<String>,
    /// Each token's logprob; null for the echoed prompt's first.
    #[schema(value_type = Vec<Option<f32>>)]
    pub token_logprobs: Vec<Option<f64>>,
    /// Each token's alternatives; null for the echoed prompt's first.
    #[schema(value_type = Vec<Option<BTreeMap<String, f32>>>)]
    pub top_logprobs: Vec<Option<Ranked<f64>>>,
    /// Where each token's text starts.
    pub text_offset: Vec<usize>,
}

/// `POST /v1/chat/completions`, not streamed.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatCompletionResponse {
    /// `chatcmpl-...`.
    pub id: String,
    /// `chat.completion`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// One per `n`.
    pub choices: Vec<ChatChoice>,
    /// Tokens: the prompt once, every choice's output.
    pub usage: UsageBody,
    /// With `prompt_logprobs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<PromptLogprobsSchema>)]
    pub prompt_logprobs: Option<PromptLogprobs>,
}

/// A whole chat choice.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatChoice {
    /// Which of the `n`.
    pub index: usize,
    /// The assistant's turn.
    pub message: AssistantMessage,
    /// With `logprobs: true`.
    pub logprobs: Option<ChatLogprobs>,
    /// `stop`, `length` or `tool_calls`.
    pub finish_reason: String,
}

/// The assistant's reply.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AssistantMessage {
    /// `assistant`.
    pub role: String,
    /// The text (null when the reply is only tool calls).
    pub content: Option<String>,
    /// The reasoning read out of the reply (vLLM's field), with a
    /// reasoning parser.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The tool calls read out of the reply, when tools were offered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallBody>>,
}

/// One tool call of a whole reply.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolCallBody {
    /// `call_...`, the same as the streamed call's.
    pub id: String,
    /// `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function called.
    pub function: FunctionCallBody,
}

/// A called function: its name and its arguments as a JSON string.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FunctionCallBody {
    /// The tool's name (absent in a streamed call's later chunks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The arguments, a JSON object as text (streamed: the next fragment).
    pub arguments: String,
}

/// One streamed piece of a tool call: its start (index, id, type, name and
/// empty arguments), then fragments of its arguments.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolCallDelta {
    /// Which call of the reply.
    pub index: usize,
    /// `call_...`, in the call's first chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function`, in the call's first chunk.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The name (first chunk) or more arguments.
    pub function: FunctionCallBody,
}

/// One streamed `/v1/chat/completions` event; the last one (with
/// `stream_options.include_usage`) has no choices and the usage.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatCompletionChunk {
    /// `chatcmpl-...`, the same in every chunk.
    pub id: String,
    /// `chat.completion.chunk`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// The choice this chunk continues.
    pub choices: Vec<ChatChunkChoice>,
    /// Only in the last chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageBody>,
}

/// One chunk of a chat choice.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatChunkChoice {
    /// Which of the `n`.
    pub index: usize,
    /// What this chunk adds.
    pub delta: ChatDelta,
    /// With `logprobs: true`.
    pub logprobs: Option<ChatLogprobs>,
    /// Null until the choice ends.
    pub finish_reason: Option<String>,
}

/// What one chat chunk adds: the role in the first, then text.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatDelta {
    /// `assistant`, in a choice's first chunk only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// More text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// More reasoning (vLLM's field), with a reasoning parser.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// More of the tool calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// Chat logprobs.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatLogprobs {
    /// One per generated token.
    pub content: Vec<ChatTokenLogprob>,
}

/// One generated token's logprob and alternatives.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatTokenLogprob {
    /// Its text.
    pub token: String,
    /// Its logprob.
    #[schema(value_type = f32)]
    pub logprob: f64,
    /// Its text's UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// The `top_logprobs` most likely tokens at this step.
    pub top_logprobs: Vec<ChatTopLogprob>,
}

/// An alternative token.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatTopLogprob {
    /// Its text.
    pub token: String,
    /// Its logprob.
    #[schema(value_type = f32)]
    pub logprob: f64,
    /// Its text's UTF-8 bytes.
    pub bytes: Vec<u8>,
}

/// `GET /v1/models`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelList {
    /// `list`.
    pub object: String,
    /// The served model.
    pub data: Vec<ModelCard>,
}

/// The served model.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelCard {
    /// The served name (`--served-model-name`).
    pub id: String,
    /// `model`.
    pub object: String,
    /// Always 0.
    pub created: u64,
    /// `ferrox`.
    pub owned_by: String,
    /// The context the server runs with; null while loading.
    pub max_model_len: Option<usize>,
    /// Where it was loaded from: a LoRA adapter's source (vLLM's `root`);
    /// null for the served model.
    pub root: Option<String>,
    /// A LoRA adapter's base: the served model's name (vLLM's `parent`);
    /// null for the served model.
    pub parent: Option<String>,
    /// A LoRA adapter's prefix-cache key (its name and the digest of its
    /// weights), which a router hashes prompts with; absent for the
    /// served model and for an adapter not in memory now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_key: Option<String>,
    /// What it serves: `generate`, `embed` or `score`; null while
    /// loading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub task: Option<ferrox_plan::Task>,
}

/// `POST /tokenize`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenizeResponse {
    /// How many tokens.
    pub count: usize,
    /// The context the server runs with.
    pub max_model_len: usize,
    /// The token ids.
    pub tokens: Vec<u32>,
    /// With `return_token_strs`: each token's string in the vocabulary.
    pub token_strs: Option<Vec<Option<String>>>,
}

/// `POST /detokenize`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeResponse {
    /// The text.
    pub prompt: String,
}

/// `GET /tokenizer_info`: vLLM's, what lm-eval's remote tokenizer reads.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenizerInfo {
    /// `ferrox`: the server's own tokenizer (from `tokenizer.json` or GGUF).
    pub tokenizer_class: String,
    /// The BOS token's string, if the tokenizer has one.
    pub bos_token: Option<String>,
    /// The EOS token's string, if the tokenizer has one.
    pub eos_token: Option<String>,
    /// Always null: no padding.
    pub pad_token: Option<String>,
    /// The context the server runs with.
    pub model_max_length: usize,
}

/// OpenAI's usage object.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
pub struct UsageBody {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Both.
    pub total_tokens: usize,
    /// Where the prompt tokens came from.
    pub prompt_tokens_details: PromptTokensDetails,
    /// What the generated tokens were, with a reasoning parser.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionTokensDetails>,
}

/// OpenAI's `usage.completion_tokens_details`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
pub struct CompletionTokensDetails {
    /// Generated tokens that were reasoning (with its markup).
    pub reasoning_tokens: usize,
}

impl UsageBody {
    /// With the count of reasoning tokens, where reasoning was read.
    pub fn with_reasoning(mut self, reasoning_tokens: Option<usize>) -> Self {
        self.completion_tokens_details =
            reasoning_tokens.map(|reasoning_tokens| CompletionTokensDetails { reasoning_tokens });
        self
    }
}

/// OpenAI's `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
pub struct PromptTokensDetails {
    /// Prompt tokens read from the prefix cache instead of computed.
    pub cached_tokens: usize,
}

impl From<Usage> for UsageBody {
    fn from(u: Usage) -> Self {
        UsageBody {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens + u.completion_tokens,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: u.cached_tokens,
            },
            completion_tokens_details: None,
        }
    }
}

/// A JSON object whose keys keep the order they were added in (logprobs:
/// most likely first), where a map type would sort them. A key added again
/// keeps its place and takes the new value, as in a JSON object.
#[derive(Debug, Clone)]
pub struct Ranked<V>(Vec<(String, V)>);

impl<V> Ranked<V> {
    /// Sets `key` to `value`.
    pub fn insert(&mut self, key: String, value: V) {
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => *v = value,
            None => self.0.push((key, value)),
        }
    }

    /// Adds `key` with `value` unless `key` is there already.
    pub fn insert_new(&mut self, key: String, value: V) {
        if !self.0.iter().any(|(k, _)| *k == key) {
            self.0.push((key, value));
        }
    }
}

impl<V> FromIterator<(String, V)> for Ranked<V> {
    fn from_iter<I: IntoIterator<Item = (String, V)>>(items: I) -> Self {
        let mut map = Ranked(Vec::new());
        for (k, v) in items {
            map.insert(k, v);
        }
        map
    }
}

impl<V: Serialize> Serialize for Ranked<V> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

// Read back (only the tests do) through a map: order is a property of what
// the server writes, not something a reader checks.
impl<'de, V: Deserialize<'de>> Deserialize<'de> for Ranked<V> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        BTreeMap::<String, V>::deserialize(d).map(|m| m.into_iter().collect())
    }
}

#[cfg(test)]
mod tests;
