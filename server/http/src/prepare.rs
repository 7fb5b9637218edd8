//! Turns a parsed OpenAI request into the engine's `GenerationRequest`:
//! tokenize or template the prompt, settle max_tokens, map the knobs.

use ferrox_engine::GenerationRequest;

use crate::error::ApiError;
use crate::frontend::Frontend;
use crate::request::{ChatRequest, CompletionRequest, Knobs, Prompt};
use crate::response::Kind;

/// OpenAI's default `max_tokens` for `/v1/completions`.
const COMPLETION_DEFAULT_MAX_TOKENS: usize = 16;

/// A request ready to submit, and how to answer it.
pub struct Prepared {
    /// For the engine.
    pub req: GenerationRequest,
    /// Which endpoint.
    pub kind: Kind,
    /// Answer as server-sent events.
    pub stream: bool,
    /// End the stream with a usage chunk.
    pub include_usage: bool,
    /// Return logprobs.
    pub logprobs: bool,
}

/// Prepares a `/v1/completions` request.
pub fn completion(r: CompletionRequest, f: &dyn Frontend) -> Result<Prepared, ApiError> {
    r.check_supported()?;
    let prompt = match r.prompt {
        Prompt::Text(t) => f.encode(&t, true).map_err(ApiError::Prompt)?,
        Prompt::Tokens(t) => t,
        Prompt::Texts(mut v) if v.len() == 1 => {
            f.encode(&v.remove(0), true).map_err(ApiError::Prompt)?
        }
        Prompt::TokenBatches(mut v) if v.len() == 1 => v.remove(0),
        Prompt::Texts(_) | Prompt::TokenBatches(_) => {
            return Err(ApiError::invalid(
                "prompt",
                "exactly one prompt per request is supported",
            ));
        }
    };
    let max_tokens = r
        .knobs
        .max_tokens
        .map_or(COMPLETION_DEFAULT_MAX_TOKENS, clamp);
    let logprobs = r.logprobs.map(|k| k as usize);
    Ok(build(
        prompt,
        max_tokens,
        logprobs,
        &r.knobs,
        f,
        Kind::Completion,
    ))
}

/// Prepares a `/v1/chat/completions` request; one without `max_tokens`
/// gets `default_max_tokens`, capped by what `max_model_len` leaves.
pub fn chat(
    r: ChatRequest,
    f: &dyn Frontend,
    max_model_len: usize,
    default_max_tokens: usize,
) -> Result<Prepared, ApiError> {
    r.check_supported()?;
    let messages = r
        .messages
        .iter()
        .map(|m| Ok((m.role.clone(), m.text()?)))
        .collect::<Result<Vec<_>, ApiError>>()?;
    let text = f.render_chat(&messages).map_err(ApiError::Prompt)?;
    let prompt = f.encode(&text, false).map_err(ApiError::Prompt)?;
    // Not vLLM's rest of the context: admission reserves prompt + max_tokens
    // for the request's whole life, so that default would let a couple of
    // requests fill the pool.
    let left = max_model_len.saturating_sub(prompt.len()).max(1);
    let max_tokens = r
        .max_tokens()
        .map_or(default_max_tokens.clamp(1, left), clamp);
    let logprobs = (r.logprobs == Some(true)).then(|| r.top_logprobs.unwrap_or(0) as usize);
    Ok(build(prompt, max_tokens, logprobs, &r.knobs, f, Kind::Chat))
}

fn clamp(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX / 2)
}

fn build(
    prompt: Vec<u32>,
    max_tokens: usize,
    logprobs: Option<usize>,
    knobs: &Knobs,
    f: &dyn Frontend,
    kind: Kind,
) -> Prepared {
    Prepared {
        req: GenerationRequest {
            prompt,
            max_tokens,
            sampling: knobs.sampling(logprobs),
            stop: knobs.stops(),
            stop_token_ids: knobs.stop_token_ids.clone().unwrap_or_default(),
            eos_token_ids: f.eos_ids(),
            ignore_eos: knobs.ignore_eos == Some(true),
            text: f.detokenizer(),
        },
        kind,
        stream: knobs.streaming(),
        include_usage: knobs.include_usage(),
        logprobs: logprobs.is_some(),
    }
}
