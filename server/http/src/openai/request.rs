//! OpenAI request bodies, parsed strictly (see [`crate::openai::fields`]): an
//! unsupported value is a 400 that names it, never silently ignored.

use std::hash::{BuildHasher, RandomState};

use ferrox_engine::SamplingParams;
use serde::{Deserialize, Serialize};

use crate::openai::error::ApiError;

/// The most choices one request may ask for (`n`).
pub const MAX_CHOICES: usize = 16;

/// `stop`: one string or several.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// Send a final chunk with usage.
    #[serde(default)]
    pub include_usage: bool,
    /// With `include_usage`, every chunk also carries the usage so far
    /// (vLLM extra).
    #[serde(default)]
    pub continuous_usage_stats: bool,
}

/// The sampling and stopping knobs both endpoints share.
#[derive(Debug, Clone, Default, Deserialize, Serialize, utoipa::ToSchema)]
pub struct Knobs {
    /// The model asked for.
    pub model: Option<String>,
    /// Most tokens to generate.
    pub max_tokens: Option<u64>,
    /// Softmax temperature.
    pub temperature: Option<f32>,
    /// Nucleus mass.
    pub top_p: Option<f32>,
    /// Choices to return, sampled independently (seed + index each).
    pub n: Option<u64>,
    /// Stream as server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Stop strings.
    pub stop: Option<Stop>,
    /// Presence penalty.
    pub presence_penalty: Option<f32>,
    /// Frequency penalty.
    pub frequency_penalty: Option<f32>,
    /// RNG seed.
    pub seed: Option<i64>,
    /// Token id (as a string) to a bias in -100..100 added to its logit.
    pub logit_bias: Option<serde_json::Map<String, serde_json::Value>>,
    /// Run past the model's end tokens (vLLM extra).
    pub ignore_eos: Option<bool>,
    /// Top-k; 0 or -1 disables (vLLM extra).
    pub top_k: Option<i64>,
    /// Min-p (vLLM extra).
    pub min_p: Option<f32>,
    /// Repetition penalty (vLLM extra).
    pub repetition_penalty: Option<f32>,
    /// Token ids that end the output (vLLM extra).
    pub stop_token_ids: Option<Vec<u32>>,
    /// Leave special tokens out of the text (default true, vLLM extra).
    pub skip_special_tokens: Option<bool>,
    /// Structured output, OpenAI's way (see [`crate::openai::structured`]).
    pub response_format: Option<serde_json::Value>,
    /// A JSON schema the output must match (vLLM extra).
    pub guided_json: Option<serde_json::Value>,
    /// A regex the whole output must match (vLLM extra).
    pub guided_regex: Option<String>,
    /// The output is exactly one of these strings (vLLM extra).
    pub guided_choice: Option<Vec<String>>,
    /// A Lark grammar the output must match (vLLM extra).
    pub guided_grammar: Option<String>,
    /// `{"json": ..}`, `{"regex": ..}`, `{"choice": [..]}`, `{"grammar": ..}`
    /// or `{"json_object": true}` (vLLM extra).
    pub structured_outputs: Option<serde_json::Value>,
    /// Scheduling priority (vLLM extra): only 0, admission is strictly FIFO.
    pub priority: Option<i64>,
    /// The request's id (vLLM extra): the response's `id` is
    /// `chatcmpl-<request_id>` (or `cmpl-`); an `X-Request-Id` header wins.
    pub request_id: Option<String>,
    /// Tokens before any end (vLLM extra): end tokens masked and stop
    /// strings not matched until then; at most `max_tokens`.
    pub min_tokens: Option<u64>,
    /// Keep the matched stop string in the output (vLLM extra).
    pub include_stop_str_in_output: Option<bool>,
    /// Only requests with the same salt share prefix-cache blocks (vLLM
    /// extra): a tenant cannot probe another's prompts through TTFT.
    pub cache_salt: Option<String>,
    /// Keep only the last N prompt tokens, -1 for `max_model_len` (vLLM
    /// extra).
    pub truncate_prompt_tokens: Option<i64>,
    /// Only these token ids may be sampled (vLLM extra).
    pub allowed_token_ids: Option<Vec<u32>>,
    /// Words never generated (vLLM extra): each with and without a leading
    /// space, tokenized; a word's last token is masked after the rest of it.
    pub bad_words: Option<Vec<String>>,
    /// Logprobs name each token `token_id:N` (vLLM extra), for tokens
    /// whose text is not valid UTF-8 on its own.
    pub return_tokens_as_token_ids: Option<bool>,
    /// Each prompt token's logprob and this many alternatives, in the whole
    /// answer (vLLM extra; at most 20).
    pub prompt_logprobs: Option<u64>,
    /// Never verify draft tokens for this request on a speculating server
    /// (the name of vLLM's proposed per-request switch).
    pub disable_spec_decode: Option<bool>,
}

impl Knobs {
    /// Refuses values this server does not implement.
    pub fn check_supported(&self) -> Result<(), ApiError> {
        if self.n.is_some_and(|n| n == 0 || n > MAX_CHOICES as u64) {
            return Err(ApiError::invalid(
                "n",
                format!("n must be between 1 and {MAX_CHOICES}"),
            ));
        }
        if self.top_k.is_some_and(|k| k < -1) {
            return Err(ApiError::invalid(
                "top_k",
                "top_k must be -1, 0 or positive",
            ));
        }
        if self.priority.is_some_and(|p| p != 0) {
            // One line, first come first served: a priority line would let
            // a stream of high-priority requests starve the rest.
            return Err(ApiError::invalid(
                "priority",
                "priority: admission is strictly first come, first served here; only 0 is accepted",
            ));
        }
        if self
            .truncate_prompt_tokens
            .is_some_and(|n| n == 0 || n < -1)
        {
            return Err(ApiError::invalid(
                "truncate_prompt_tokens",
                "truncate_prompt_tokens is -1 (the model's length) or at least 1",
            ));
        }
        if let Some(id) = &self.request_id {
            check_request_id(id).map_err(|why| ApiError::invalid("request_id", why))?;
        }
        if self.prompt_logprobs.is_some() && self.streaming() {
            return Err(ApiError::invalid(
                "prompt_logprobs",
                "prompt_logprobs come with the whole answer, not a stream",
            ));
        }
        if self.stream_options.is_some() && self.stream != Some(true) {
            return Err(ApiError::invalid(
                "stream_options",
                "stream_options needs stream: true",
            ));
        }
        Ok(())
    }

    /// `prompt_logprobs` as the engine counts it (values past 20 are
    /// refused there, naming the field).
    pub fn prompt_logprobs_k(&self) -> Option<usize> {
        self.prompt_logprobs
            .map(|k| usize::try_from(k).unwrap_or(usize::MAX))
    }

    /// Choices asked for.
    pub fn choices(&self) -> usize {
        self.n.map_or(1, |n| n as usize)
    }

    /// `logit_bias` as (token id, bias) pairs; the engine checks the ranges.
    pub fn logit_bias(&self) -> Result<Vec<(u32, f32)>, ApiError> {
        let Some(map) = &self.logit_bias else {
            return Ok(Vec::new());
        };
        map.iter()
            .map(|(k, v)| {
                let id = k.trim().parse::<u32>().map_err(|_| {
                    ApiError::invalid("logit_bias", format!("logit_bias: `{k}` is not a token id"))
                })?;
                let bias = v.as_f64().ok_or_else(|| {
                    ApiError::invalid(
                        "logit_bias",
                        format!("logit_bias: the bias of {k} is not a number"),
                    )
                })?;
                Ok((id, bias as f32))
            })
            .collect()
    }

    /// The engine's sampling settings; a missing seed gets a random one.
    pub fn sampling(
        &self,
        logprobs: Option<usize>,
        prompt_logprobs: Option<usize>,
    ) -> Result<SamplingParams, ApiError> {
        let d = SamplingParams::default();
        Ok(SamplingParams {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_p: self.top_p.unwrap_or(d.top_p),
            top_k: self.top_k.map_or(0, |k| k.max(0) as usize),
            min_p: self.min_p.unwrap_or(d.min_p),
            repetition_penalty: self.repetition_penalty.unwrap_or(d.repetition_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(d.frequency_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(d.presence_penalty),
            seed: self
                .seed
                .map_or_else(|| RandomState::new().hash_one(0u8), |s| s as u64),
            logprobs,
            prompt_logprobs,
            logit_bias: self.logit_bias()?,
            allowed_token_ids: self.allowed_token_ids.clone(),
            // Tokenized by the caller, which has the tokenizer.
            bad_words: Vec::new(),
            disable_spec_decode: self.disable_spec_decode == Some(true),
        })
    }

    /// The stop strings.
    pub fn stops(&self) -> Vec<String> {
        match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        }
    }

    /// True when streaming.
    pub fn streaming(&self) -> bool {
        self.stream == Some(true)
    }

    /// True when the stream ends with a usage chunk.
    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }

    /// True when every chunk carries the usage so far: vLLM sends it only
    /// when `include_usage` is set too.
    pub fn continuous_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage && o.continuous_usage_stats)
    }
}

/// Longest request id taken (body or `X-Request-Id`).
pub const MAX_REQUEST_ID: usize = 128;

/// A request id goes into response ids and log lines: 1 to
/// [`MAX_REQUEST_ID`] visible ASCII characters, nothing that could split
/// a log line or a header.
pub fn check_request_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_REQUEST_ID || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "a request id is 1 to {MAX_REQUEST_ID} visible ASCII characters"
        ));
    }
    Ok(())
}

/// `prompt`: text or token ids; one prompt only.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Prompt {
    /// Text.
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
    /// A batch of texts.
    Texts(Vec<String>),
    /// A batch of token lists.
    TokenBatches(Vec<Vec<u32>>),
}

impl Default for Prompt {
    fn default() -> Self {
        Prompt::Text(String::new())
    }
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, utoipa::ToSchema)]
pub struct CompletionRequest {
    /// The prompt.
    pub prompt: Prompt,
    /// Logprobs: this many alternatives per token.
    pub logprobs: Option<u64>,
    /// Return the prompt before the completion (with its logprobs when
    /// `logprobs` is set).
    pub echo: Option<bool>,
    /// Only 1.
    pub best_of: Option<u64>,
    /// Not supported.
    pub suffix: Option<String>,
    /// The shared knobs.
    #[serde(flatten)]
    pub knobs: Knobs,
}

impl CompletionRequest {
    /// Refuses values this server does not implement.
    pub fn check_supported(&self) -> Result<(), ApiError> {
        self.knobs.check_supported()?;
        if self.best_of.is_some_and(|b| b != 1) {
            return Err(ApiError::invalid(
                "best_of",
                "only best_of = 1 is supported",
            ));
        }
        if self.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::invalid("suffix", "suffix is not supported"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::fields::{COMPLETION_FIELDS, parse};

    fn completion(body: &str) -> Result<CompletionRequest, ApiError> {
        let req: CompletionRequest = parse(body.as_bytes(), &COMPLETION_FIELDS)?;
        req.check_supported()?;
        req.knobs.sampling(None, None)?;
        Ok(req)
    }

    #[test]
    fn refusals_name_the_problem() {
        // (body, expected fragment of the error)
        let cases = [
            ("{", "invalid request body"),
            ("[1]", "JSON object"),
            (r#"{"prompt": "a", "n": 0}"#, "n must be between 1 and 16"),
            (r#"{"prompt": "a", "n": 17}"#, "n must be between 1 and 16"),
            (
                r#"{"prompt": "a", "frobnicate": 1}"#,
                "unsupported field `frobnicate`",
            ),
            (r#"{"prompt": "a", "best_of": 3}"#, "best_of"),
            (
                r#"{"prompt": "a", "logit_bias": {"x": 5}}"#,
                "`x` is not a token id",
            ),
            (
                r#"{"prompt": "a", "logit_bias": {"1": "5"}}"#,
                "not a number",
            ),
            (r#"{"prompt": {"x": 1}}"#, "invalid request body"),
            (
                r#"{"prompt": "a", "max_tokens": "many"}"#,
                "invalid request body",
            ),
            (r#"{"prompt": "a", "top_k": -5}"#, "top_k"),
            (r#"{"prompt": "a", "priority": 1}"#, "only 0 is accepted"),
            (
                r#"{"prompt": "a", "truncate_prompt_tokens": 0}"#,
                "at least 1",
            ),
            (r#"{"prompt": "a", "request_id": "a b"}"#, "visible ASCII"),
            (r#"{"prompt": "a", "request_id": ""}"#, "request id"),
            (
                r#"{"prompt": "a", "stream_options": {"include_usage": true}}"#,
                "stream: true",
            ),
        ];
        for (body, want) in cases {
            let err = completion(body).unwrap_err().to_string();
            assert!(err.contains(want), "{body}: {err}");
        }
    }

    #[test]
    fn accepts_openai_and_vllm_fields() {
        let req = completion(
            r#"{"model": "m", "prompt": [1, 2], "max_tokens": 5, "temperature": 0, "stop": "x",
                "ignore_eos": true, "top_k": -1, "min_p": 0.1, "repetition_penalty": 1.1,
                "stop_token_ids": [7], "seed": 3, "stream": true,
                "stream_options": {"include_usage": true}, "logprobs": 2, "priority": 0}"#,
        )
        .unwrap();
        assert!(matches!(req.prompt, Prompt::Tokens(ref t) if t == &[1, 2]));
        let s = req.knobs.sampling(Some(2), None).unwrap();
        assert_eq!(
            (s.temperature, s.top_k, s.seed, s.logprobs),
            (0.0, 0, 3, Some(2))
        );
        assert_eq!(req.knobs.stops(), vec!["x"]);
        assert!(req.knobs.streaming() && req.knobs.include_usage());
    }
}
