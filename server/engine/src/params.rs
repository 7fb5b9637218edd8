//! What a caller asks the engine for: the prompt and how to sample it.

use ferrox_core::AdapterRef;

use crate::EngineError;
use crate::constraint::TokenConstraint;

/// Per-request sampling settings. Temperature 0 means greedy.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 is greedy.
    pub temperature: f32,
    /// Nucleus mass kept, in (0, 1].
    pub top_p: f32,
    /// Keep only the k most likely tokens; 0 disables.
    pub top_k: usize,
    /// Drop tokens below `min_p` times the top probability; 0 disables.
    pub min_p: f32,
    /// Multiplicative penalty on tokens already seen (prompt or output); 1 disables.
    pub repetition_penalty: f32,
    /// Subtracted once per occurrence in the output.
    pub frequency_penalty: f32,
    /// Subtracted once if present in the output.
    pub presence_penalty: f32,
    /// Seed of this request's own RNG.
    pub seed: u64,
    /// Return the chosen token's logprob, and this many alternatives.
    pub logprobs: Option<usize>,
    /// Return every prompt token's logprob (after the first), and this many
    /// alternatives; the prompt is then computed whole, never from the cache.
    pub prompt_logprobs: Option<usize>,
    /// Added to these tokens' logits before sampling (not to the logprobs,
    /// which are the model's).
    pub logit_bias: Vec<(u32, f32)>,
    /// Only these tokens may be sampled (vLLM's `allowed_token_ids`).
    pub allowed_token_ids: Option<Vec<u32>>,
    /// Token sequences never generated (vLLM's `bad_words`, tokenized): a
    /// sequence's last token is masked wherever the output ends with the
    /// rest of it.
    pub bad_words: Vec<Vec<u32>>,
    /// Never verify draft tokens for this request (the name of vLLM's
    /// proposed per-request switch): it decodes one token a step, as on a
    /// server without speculative decoding.
    pub disable_spec_decode: bool,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: 0,
            logprobs: None,
            prompt_logprobs: None,
            logit_bias: Vec::new(),
            allowed_token_ids: None,
            bad_words: Vec::new(),
            disable_spec_decode: false,
        }
    }
}

/// The most alternatives `logprobs` may ask for.
pub const MAX_TOP_LOGPROBS: usize = 20;
/// The largest bias `logit_bias` may add or take away, as OpenAI's.
pub const MAX_LOGIT_BIAS: f32 = 100.0;
/// The most `bad_words` token sequences (each is checked against the
/// output's tail every step).
pub const MAX_BAD_WORDS: usize = 256;
/// The most tokens of one `bad_words` sequence.
pub const MAX_BAD_WORD_TOKENS: usize = 16;

impl SamplingParams {
    /// Checks every field's range; the message names the field.
    pub fn validate(&self) -> Result<(), EngineError> {
        let bias_ok = self
            .logit_bias
            .iter()
            .all(|(_, b)| (-MAX_LOGIT_BIAS..=MAX_LOGIT_BIAS).contains(b));
        let bad_words_ok = self.bad_words.len() <= MAX_BAD_WORDS
            && (self.bad_words.iter()).all(|w| !w.is_empty() && w.len() <= MAX_BAD_WORD_TOKENS);
        let checks: [(&str, bool, &str); 11] = [
            (
                "temperature",
                self.temperature.is_finite() && (0.0..=2.0).contains(&self.temperature),
                "must be between 0 and 2",
            ),
            (
                "top_p",
                self.top_p > 0.0 && self.top_p <= 1.0,
                "must be in (0, 1]",
            ),
            (
                "min_p",
                (0.0..=1.0).contains(&self.min_p),
                "must be in [0, 1]",
            ),
            (
                "repetition_penalty",
                self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0,
                "must be greater than 0",
            ),
            (
                "frequency_penalty",
                (-2.0..=2.0).contains(&self.frequency_penalty),
                "must be between -2 and 2",
            ),
            (
                "presence_penalty",
                (-2.0..=2.0).contains(&self.presence_penalty),
                "must be between -2 and 2",
            ),
            (
                "top_logprobs",
                self.logprobs.is_none_or(|k| k <= MAX_TOP_LOGPROBS),
                "must be at most 20",
            ),
            (
                "prompt_logprobs",
                self.prompt_logprobs.is_none_or(|k| k <= MAX_TOP_LOGPROBS),
                "must be at most 20",
            ),
            ("logit_bias", bias_ok, "values must be between -100 and 100"),
            (
                "allowed_token_ids",
                self.allowed_token_ids
                    .as_ref()
                    .is_none_or(|a| !a.is_empty()),
                "must not be empty",
            ),
            (
                "bad_words",
                bad_words_ok,
                "must be at most 256 token sequences of 1 to 16 tokens each (a word is \
                 tokenized with and without a leading space)",
            ),
        ];
        for (param, ok, why) in checks {
            if !ok {
                return Err(EngineError::invalid(param, format!("{param} {why}")));
            }
        }
        Ok(())
    }
}

/// Longest `cache_salt` taken (it is hashed once per request).
pub const MAX_CACHE_SALT_BYTES: usize = 256;
/// The most stop strings one request may give.
pub const MAX_STOPS: usize = 16;
/// The longest stop string, in bytes (the matcher holds back up to this much).
pub const MAX_STOP_BYTES: usize = 256;
/// The most stop token ids one request may give.
pub const MAX_STOP_TOKEN_IDS: usize = 64;

/// Turns token ids into text incrementally, never emitting half a character.
pub trait TokenText: Send {
    /// Feeds one id; returns the text it completed (possibly empty).
    fn push(&mut self, id: u32) -> String;
    /// A detokenizer with the same settings and nothing fed yet, for another
    /// choice of the same request.
    fn fresh(&self) -> Box<dyn TokenText>;
}

/// One generation request, already tokenized.
pub struct GenerationRequest {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// How to pick each token.
    pub sampling: SamplingParams,
    /// Strings that end the output (excluded from it unless
    /// `include_stop_str`).
    pub stop: Vec<String>,
    /// Keep the matched stop string at the end of the output (vLLM's
    /// `include_stop_str_in_output`).
    pub include_stop_str: bool,
    /// Tokens generated before any end: until then the end tokens (the
    /// model's and `stop_token_ids`) are masked and stop strings do not
    /// match (vLLM's `min_tokens`).
    pub min_tokens: usize,
    /// The answer's id (`chatcmpl-...`), named in the status lines.
    pub request_id: Option<String>,
    /// Mixed into the prefix cache's chain (vLLM's `cache_salt`): only
    /// requests with the same salt share cached blocks.
    pub cache_salt: Option<String>,
    /// Token ids that end the output.
    pub stop_token_ids: Vec<u32>,
    /// The model's end-of-generation ids; ignored when `ignore_eos`.
    pub eos_token_ids: Vec<u32>,
    /// Run past the model's end-of-generation tokens.
    pub ignore_eos: bool,
    /// This request's detokenizer.
    pub text: Box<dyn TokenText>,
    /// What the output must match (structured outputs); `None` samples freely.
    pub constraint: Option<Box<dyn TokenConstraint>>,
    /// The LoRA adapter the request runs with; `None`: the base model.
    pub adapter: Option<AdapterRef>,
}

impl GenerationRequest {
    /// Checks what the caller chose: sampling ranges and the bounds on stop
    /// lists (the worker's per-token matching cost grows with them).
    pub fn validate(&self) -> Result<(), EngineError> {
        self.sampling.validate()?;
        if self.min_tokens > self.max_tokens {
            return Err(EngineError::invalid(
                "min_tokens",
                format!(
                    "min_tokens ({}) is more than max_tokens ({})",
                    self.min_tokens, self.max_tokens
                ),
            ));
        }
        if let Some(salt) = &self.cache_salt
            && (salt.is_empty() || salt.len() > MAX_CACHE_SALT_BYTES)
        {
            return Err(EngineError::invalid(
                "cache_salt",
                format!("cache_salt is 1 to {MAX_CACHE_SALT_BYTES} bytes"),
            ));
        }
        if self.stop.len() > MAX_STOPS {
            return Err(EngineError::invalid(
                "stop",
                format!("at most {MAX_STOPS} stop strings, not {}", self.stop.len()),
            ));
        }
        if let Some(long) = self.stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
            return Err(EngineError::invalid(
                "stop",
                format!(
                    "a stop string is at most {MAX_STOP_BYTES} bytes, not {}",
                    long.len()
                ),
            ));
        }
        if self.stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
            return Err(EngineError::invalid(
                "stop_token_ids",
                format!(
                    "at most {MAX_STOP_TOKEN_IDS} stop token ids, not {}",
                    self.stop_token_ids.len()
                ),
            ));
        }
        Ok(())
    }
}

impl GenerationRequest {
    /// Choice `i` of this request (`n > 1`): the same request, seeded
    /// `seed + i`, with its own detokenizer and constraint state. Choice 0
    /// samples exactly as the request alone.
    pub fn fork(&self, i: u64) -> GenerationRequest {
        // Destructured whole, so a new field cannot be left out of a fork.
        let GenerationRequest {
            prompt,
            max_tokens,
            sampling,
            stop,
            include_stop_str,
            min_tokens,
            request_id,
            cache_salt,
            stop_token_ids,
            eos_token_ids,
            ignore_eos,
            text,
            constraint,
            adapter,
        } = self;
        GenerationRequest {
            prompt: prompt.clone(),
            max_tokens: *max_tokens,
            sampling: SamplingParams {
                seed: sampling.seed.wrapping_add(i),
                ..sampling.clone()
            },
            stop: stop.clone(),
            include_stop_str: *include_stop_str,
            min_tokens: *min_tokens,
            request_id: request_id.clone(),
            cache_salt: cache_salt.clone(),
            stop_token_ids: stop_token_ids.clone(),
            eos_token_ids: eos_token_ids.clone(),
            ignore_eos: *ignore_eos,
            text: text.fresh(),
            constraint: constraint.as_ref().map(|c| c.fork()),
            adapter: adapter.clone(),
        }
    }
}

impl std::fmt::Debug for GenerationRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GenerationRequest")
            .field("prompt_len", &self.prompt.len())
            .field("max_tokens", &self.max_tokens)
            .field("sampling", &self.sampling)
            .field("stop", &self.stop)
            .field("constrained", &self.constraint.is_some())
            .field("adapter", &self.adapter.as_ref().map(AdapterRef::name))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fork_is_the_same_request_but_for_its_seed() {
        let mut first = crate::fixtures::request(&[1, 2, 3], 7);
        first.sampling.seed = u64::MAX;
        first.sampling.temperature = 0.7;
        first.sampling.bad_words = vec![vec![4, 5]];
        first.stop = vec!["x".into()];
        first.include_stop_str = true;
        first.min_tokens = 2;
        first.request_id = Some("cmpl-1".into());
        first.cache_salt = Some("salt".into());
        first.stop_token_ids = vec![9];
        first.ignore_eos = true;
        for i in [0, 1, 5] {
            let fork = first.fork(i);
            let seed = u64::MAX.wrapping_add(i);
            assert_eq!(fork.sampling.seed, seed, "choice {i}");
            assert_eq!(
                fork.sampling,
                SamplingParams {
                    seed,
                    ..first.sampling.clone()
                }
            );
            let same = |r: &GenerationRequest| {
                let shape = (
                    r.prompt.clone(),
                    r.max_tokens,
                    r.stop.clone(),
                    r.include_stop_str,
                );
                let ends = (
                    r.min_tokens,
                    r.stop_token_ids.clone(),
                    r.eos_token_ids.clone(),
                );
                let ids = (r.request_id.clone(), r.cache_salt.clone(), r.ignore_eos);
                (shape, ends, ids, r.constraint.is_some())
            };
            assert_eq!(same(&fork), same(&first), "choice {i}");
        }
    }

    #[test]
    fn each_out_of_range_field_is_named() {
        type Spoil = fn(&mut SamplingParams);
        let cases: Vec<(&str, Spoil)> = vec![
            ("temperature", |p| p.temperature = -1.0),
            ("temperature", |p| p.temperature = f32::NAN),
            ("top_p", |p| p.top_p = 0.0),
            ("min_p", |p| p.min_p = 1.5),
            ("repetition_penalty", |p| p.repetition_penalty = 0.0),
            ("frequency_penalty", |p| p.frequency_penalty = 3.0),
            ("presence_penalty", |p| p.presence_penalty = -3.0),
            ("top_logprobs", |p| p.logprobs = Some(21)),
            ("prompt_logprobs", |p| p.prompt_logprobs = Some(21)),
            ("logit_bias", |p| p.logit_bias = vec![(1, 100.5)]),
            ("logit_bias", |p| p.logit_bias = vec![(1, f32::NAN)]),
        ];
        for (field, spoil) in cases {
            let mut params = SamplingParams::default();
            assert!(params.validate().is_ok());
            spoil(&mut params);
            match params.validate() {
                Err(EngineError::Invalid { param, .. }) => {
                    assert_eq!(param.as_deref(), Some(field))
                }
                other => panic!("{field}: {other:?}"),
            }
        }
    }
}
