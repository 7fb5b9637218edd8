//! Turns a parsed OpenAI request into the engine's `GenerationRequest`:
//! tokenize or template the prompt, settle max_tokens, map the knobs.

use ferrox_core::RenderOptions;
use ferrox_engine::GenerationRequest;

use crate::chat_request::ChatRequest;
use crate::error::ApiError;
use crate::frontend::Frontend;
use crate::request::{CompletionRequest, Knobs, Prompt};
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

/// What preparing a request needs to know about the server.
#[derive(Debug, Clone)]
pub struct PrepareConfig {
    /// The served model's name; a request naming another is refused.
    pub model_name: String,
    /// The engine's longest sequence.
    pub max_model_len: usize,
    /// `max_tokens` of a chat request that sets none, before the cap.
    pub default_max_tokens: usize,
}

impl PrepareConfig {
    fn check_model(&self, asked: Option<&str>) -> Result<(), ApiError> {
        match asked {
            Some(m) if m != self.model_name => Err(ApiError::UnknownModel(m.to_string())),
            _ => Ok(()),
        }
    }
}

/// Prepares a `/v1/completions` request.
pub fn completion(
    r: CompletionRequest,
    f: &dyn Frontend,
    c: &PrepareConfig,
) -> Result<Prepared, ApiError> {
    c.check_model(r.knobs.model.as_deref())?;
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
pub fn chat(r: ChatRequest, f: &dyn Frontend, c: &PrepareConfig) -> Result<Prepared, ApiError> {
    c.check_model(r.knobs.model.as_deref())?;
    r.check_supported()?;
    let options = RenderOptions {
        add_generation_prompt: true,
        tools: r.template_tools(),
    };
    let prompt = chat_prompt(&r.messages, &options, f)?;
    // Not vLLM's rest of the context: admission reserves prompt + max_tokens
    // for the request's whole life, so that default would let a couple of
    // requests fill the pool.
    let left = c.max_model_len.saturating_sub(prompt.len()).max(1);
    let max_tokens = r
        .max_tokens()
        .map_or(c.default_max_tokens.clamp(1, left), clamp);
    let logprobs = (r.logprobs == Some(true)).then(|| r.top_logprobs.unwrap_or(0) as usize);
    Ok(build(prompt, max_tokens, logprobs, &r.knobs, f, Kind::Chat))
}

/// The conversation rendered with the chat template and tokenized (the
/// template writes its own special tokens).
pub fn chat_prompt(
    messages: &[crate::chat_request::Message],
    options: &RenderOptions<'_>,
    f: &dyn Frontend,
) -> Result<Vec<u32>, ApiError> {
    let messages = messages
        .iter()
        .enumerate()
        .map(|(i, m)| m.for_template(i))
        .collect::<Result<Vec<_>, ApiError>>()?;
    let text = f
        .render_chat(&messages, options)
        .map_err(ApiError::Prompt)?;
    f.encode(&text, false).map_err(ApiError::Prompt)
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

#[cfg(test)]
mod tests;
