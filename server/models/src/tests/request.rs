//! An engine request for the tests that drive the scheduler: no stop
//! strings, no end-of-sequence, text that nobody reads.

use ferrox_engine::{GenerationRequest, SamplingParams, TokenText};

/// Detokenizes to nothing: these tests compare token ids.
pub struct NoText;

impl TokenText for NoText {
    fn push(&mut self, _id: u32) -> String {
        String::new()
    }

    fn fresh(&self) -> Box<dyn TokenText> {
        Box::new(NoText)
    }
}

/// `n` tokens after `prompt`, whatever the model samples, with `sampling`.
pub fn request(prompt: Vec<u32>, n: usize, sampling: SamplingParams) -> GenerationRequest {
    GenerationRequest {
        prompt,
        max_tokens: n,
        sampling,
        stop: Vec::new(),
        include_stop_str: false,
        min_tokens: 0,
        cache_salt: None,
        request_id: None,
        stop_token_ids: Vec::new(),
        eos_token_ids: Vec::new(),
        ignore_eos: true,
        text: Box::new(NoText),
        constraint: None,
        adapter: None,
    }
}

/// Greedy sampling (temperature 0).
pub fn greedy() -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    }
}
