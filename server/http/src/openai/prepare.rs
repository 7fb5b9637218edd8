//! Turns a parsed OpenAI request into the engine's `GenerationRequest`:
//! tokenize or template the prompt, settle max_tokens, map the knobs.

use std::sync::Arc;

use ferrox_core::{AdapterRef, ChatMessage, RenderOptions};
use ferrox_engine::GenerationRequest;

use crate::load::adapters::AdapterStore;
use crate::openai::chat_request::ChatRequest;
use crate::openai::error::ApiError;
use crate::openai::request::{CompletionRequest, Knobs, Prompt};
use crate::openai::response::Kind;
use crate::reasoning::choice::{ReasoningFamily, ReasoningShape};
use crate::serve::frontend::Frontend;
use crate::tools::choice::ToolRequest;
use crate::tools::grammar::tool_grammar;
use crate::tools::parser::{ToolFamily, ToolSetup};

/// OpenAI's default `max_tokens` for `/v1/completions`.
const COMPLETION_DEFAULT_MAX_TOKENS: usize = 16;

/// A request ready to submit, and how to answer it.
pub struct Prepared {
    /// For the engine: one job per prompt (completions take a batch).
    pub jobs: Vec<Job>,
    /// Choices per prompt; each after a prompt's first is the same request
    /// seeded `seed + i`.
    pub n: usize,
    /// How to answer.
    pub shape: Shape,
}

/// One prompt's first choice, and what its choices echo.
pub struct Job {
    /// The engine's request.
    pub req: GenerationRequest,
    /// What `echo` puts before each of its choices (completions).
    pub echo: Option<Echo>,
}

/// What answering one choice needs besides its events.
#[derive(Debug, Clone, Default)]
pub struct ChoiceMeta {
    /// The echoed prompt, if any.
    pub echo: Option<Echo>,
    /// Its usage counts the prompt's tokens (a prompt's first choice: the
    /// others share that prompt).
    pub counts_prompt: bool,
    /// Its prompt's length in tokens, for the usage so far.
    pub prompt_tokens: usize,
}

/// How a request is answered.
#[derive(Debug, Clone)]
pub struct Shape {
    /// Which endpoint.
    pub kind: Kind,
    /// Answer as server-sent events.
    pub stream: bool,
    /// End the stream with a usage chunk.
    pub include_usage: bool,
    /// Every chunk carries the usage so far.
    pub continuous_usage: bool,
    /// The client's id for the request (`request_id`), if it gave one.
    pub request_id: Option<String>,
    /// Logprobs name tokens `token_id:N`.
    pub token_ids: bool,
    /// The answer carries the prompt's logprobs (`prompt_logprobs`).
    pub prompt_logprobs: bool,
    /// Return logprobs.
    pub logprobs: bool,
    /// Tool calls are read out of the answer (chat).
    pub tools: Option<ToolShape>,
    /// Reasoning is read out of the answer (chat).
    pub reasoning: Option<ReasoningShape>,
}

/// How tool calls are read out of an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolShape {
    /// The markup.
    pub family: ToolFamily,
    /// More than one call.
    pub parallel: bool,
}

/// The prompt, echoed.
#[derive(Debug, Clone, PartialEq)]
pub struct Echo {
    /// Its text.
    pub text: String,
    /// Its tokens, for their logprobs.
    pub ids: Vec<u32>,
}

impl ChoiceMeta {
    /// Adds this choice's usage to the request's: every choice's generated
    /// tokens, each prompt's tokens once.
    pub fn add_usage(&self, total: &mut ferrox_engine::Usage, u: &ferrox_engine::Usage) {
        if self.counts_prompt {
            total.prompt_tokens += u.prompt_tokens;
            total.cached_tokens += u.cached_tokens;
        }
        total.completion_tokens += u.completion_tokens;
    }
}

impl Prepared {
    /// The requests to submit, prompt by prompt and `n` to a prompt (choice
    /// `p * n + i`), each with its own detokenizer and seed, and how to
    /// answer them.
    pub fn requests(self) -> (Vec<(GenerationRequest, ChoiceMeta)>, Shape) {
        let mut out = Vec::with_capacity(self.jobs.len() * self.n);
        for Job { req: first, echo } in self.jobs {
            let prompt_tokens = first.prompt.len();
            let meta = |i: usize| ChoiceMeta {
                echo: echo.clone(),
                counts_prompt: i == 0,
                prompt_tokens,
            };
            let others: Vec<_> = (1..self.n)
                .map(|i| (first.fork(i as u64), meta(i)))
                .collect();
            out.push((first, meta(0)));
            out.extend(others);
        }
        (out, self.shape)
    }
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
    /// The engine's waiting line: n choices wait as n requests.
    pub max_queue: usize,
    /// How the model calls tools.
    pub tools: ToolSetup,
    /// How the model's reasoning is read; `None`: it is not.
    pub reasoning: Option<ReasoningFamily>,
    /// The LoRA adapters a request's `model` may name; `None`: none.
    pub adapters: Option<Arc<AdapterStore>>,
}

impl PrepareConfig {
    /// Refuses more choices (`n` for each of `prompts`) than the waiting
    /// line could ever hold at once, which a retry would never cure.
    fn check_choices(&self, knobs: &Knobs, prompts: usize) -> Result<(), ApiError> {
        let n = knobs.choices();
        if n.saturating_mul(prompts) > self.max_queue {
            let (field, what) = if prompts == 1 {
                ("n", format!("n = {n}"))
            } else {
                ("prompt", format!("{prompts} prompts x n = {n} choices"))
            };
            return Err(ApiError::invalid(
                field,
                format!(
                    "{what} is more than this server's waiting line holds ({})",
                    self.max_queue
                ),
            ));
        }
        Ok(())
    }

    /// How calls are read for `request`, refused when this server reads
    /// none.
    fn tool_shape(&self, request: &ToolRequest) -> Result<ToolShape, ApiError> {
        let Some(family) = self.tools.family else {
            return Err(ApiError::invalid(
                "tool_choice",
                "tool calling is off on this server (--tool-call-parser none); send \
                 tool_choice \"none\" to have the tools only rendered into the prompt",
            ));
        };
        Ok(ToolShape {
            family,
            parallel: request.parallel,
        })
    }

    /// Refuses a request that names neither the served model nor one of
    /// its LoRA adapters.
    pub fn check_model(&self, asked: Option<&str>) -> Result<(), ApiError> {
        match asked {
            Some(m)
                if m != self.model_name
                    && !self.adapters.as_ref().is_some_and(|a| a.contains(m)) =>
            {
                Err(ApiError::UnknownModel(m.to_string()))
            }
            _ => Ok(()),
        }
    }

    /// The LoRA adapter a request's `model` names (read into memory if it
    /// was unloaded); `None` for the served model itself.
    pub fn adapter(&self, asked: Option<&str>) -> Result<Option<AdapterRef>, ApiError> {
        let Some(m) = asked.filter(|m| *m != self.model_name) else {
            return Ok(None);
        };
        match self.adapters.as_ref().and_then(|a| a.get(m)) {
            Some(found) => found.map(Some),
            None => Err(ApiError::UnknownModel(m.to_string())),
        }
    }
}

/// Prepares a `/v1/completions` request: one job per prompt of a batch.
pub fn completion(
    mut r: CompletionRequest,
    f: &dyn Frontend,
    c: &PrepareConfig,
) -> Result<Prepared, ApiError> {
    let adapter = c.adapter(r.knobs.model.as_deref())?;
    r.check_supported()?;
    let prompts: Vec<(Option<String>, Option<Vec<u32>>)> = match std::mem::take(&mut r.prompt) {
        Prompt::Text(t) => vec![(Some(t), None)],
        Prompt::Tokens(t) => vec![(None, Some(t))],
        Prompt::Texts(v) => v.into_iter().map(|t| (Some(t), None)).collect(),
        Prompt::TokenBatches(v) => v.into_iter().map(|t| (None, Some(t))).collect(),
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt list is empty"));
    }
    c.check_choices(&r.knobs, prompts.len())?;
    let mut jobs = prompts
        .into_iter()
        .map(|(text, ids)| completion_job(&r, text, ids, f, c))
        .collect::<Result<Vec<_>, _>>()?;
    for job in &mut jobs {
        job.req.adapter = adapter.clone();
    }
    Ok(Prepared {
        jobs,
        n: r.knobs.choices(),
        shape: shape(&r.knobs, r.logprobs.is_some(), Kind::Completion),
    })
}

/// One prompt of a completions request.
fn completion_job(
    r: &CompletionRequest,
    text: Option<String>,
    ids: Option<Vec<u32>>,
    f: &dyn Frontend,
    c: &PrepareConfig,
) -> Result<Job, ApiError> {
    let prompt = match (ids, &text) {
        (Some(ids), _) => ids,
        (None, t) => f
            .encode(t.as_deref().unwrap_or_default(), true)
            .map_err(ApiError::Prompt)?,
    };
    let full = prompt.len();
    let prompt = truncated(prompt, r.knobs.truncate_prompt_tokens, c.max_model_len);
    // An echo of a cut prompt is of what the model saw.
    let text = text.filter(|_| prompt.len() == full);
    let max_tokens = r
        .knobs
        .max_tokens
        .map_or(COMPLETION_DEFAULT_MAX_TOKENS, clamp);
    let logprobs = r.logprobs.map(|k| k as usize);
    let echo = match (r.echo == Some(true), text) {
        (false, _) => None,
        (true, Some(text)) => Some(Echo {
            text,
            ids: prompt.clone(),
        }),
        (true, None) => {
            let vocab = f.vocab_size();
            if let Some(bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
                return Err(ApiError::invalid(
                    "prompt",
                    format!("token id {bad} is outside the vocabulary (size {vocab})"),
                ));
            }
            Some(Echo {
                text: f.decode(&prompt).map_err(ApiError::Prompt)?,
                ids: prompt.clone(),
            })
        }
    };
    // Echoed with logprobs: the prompt's own logprobs come first, as
    // evaluation harnesses read them.
    let prompt_logprobs = logprobs
        .filter(|_| echo.is_some())
        .max(r.knobs.prompt_logprobs_k());
    let req = request(prompt, max_tokens, (logprobs, prompt_logprobs), &r.knobs, f)?;
    Ok(Job { req, echo })
}

/// Prepares a `/v1/chat/completions` request; one without `max_tokens`
/// gets `default_max_tokens`, capped by what `max_model_len` leaves.
pub fn chat(r: ChatRequest, f: &dyn Frontend, c: &PrepareConfig) -> Result<Prepared, ApiError> {
    let adapter = c.adapter(r.knobs.model.as_deref())?;
    r.check_supported()?;
    c.check_choices(&r.knobs, 1)?;
    let tools = r.tool_request()?;
    let tool_shape = tools.as_ref().map(|t| c.tool_shape(t)).transpose()?;
    let (add_generation_prompt, continue_final_message) = r.template.turn()?;
    let kwargs = r.template_kwargs();
    let options = RenderOptions {
        add_generation_prompt,
        continue_final_message,
        tools: r.template_tools(),
        kwargs: kwargs.as_ref(),
    };
    let prompt = chat_prompt(&r.messages, &options, tool_shape.is_some(), c, f)?;
    let prompt = truncated(prompt, r.knobs.truncate_prompt_tokens, c.max_model_len);
    // Not vLLM's rest of the context: admission reserves prompt + max_tokens
    // for the request's whole life, so that default would let a couple of
    // requests fill the pool.
    let left = c.max_model_len.saturating_sub(prompt.len()).max(1);
    let max_tokens = r
        .max_tokens()
        .map_or(c.default_max_tokens.clamp(1, left), clamp);
    let logprobs = (r.logprobs == Some(true)).then(|| r.top_logprobs.unwrap_or(0) as usize);
    let prompt_logprobs = r.knobs.prompt_logprobs_k();
    let mut req = request(prompt, max_tokens, (logprobs, prompt_logprobs), &r.knobs, f)?;
    req.adapter = adapter;
    if let (Some(t), Some(shape)) = (&tools, tool_shape)
        && t.forced()
    {
        req.constraint = Some(forced_call(t, shape.family, req.constraint.take(), f)?);
    }
    let include = r.include_reasoning != Some(false);
    let reasoning =
        (c.reasoning).map(|family| ReasoningShape::new(family, &req.prompt, include, f));
    if reasoning.is_some_and(|r| r.family.special()) {
        // Harmony's channels, Gemma 4's and Mistral's tags are special
        // tokens: the reader needs them.
        req.text = f.detokenizer(false);
    }
    Ok(Prepared {
        jobs: vec![Job {
            req,
            echo: chat_echo(&r, add_generation_prompt)?,
        }],
        n: r.knobs.choices(),
        shape: Shape {
            tools: tool_shape,
            reasoning,
            ..shape(&r.knobs, logprobs.is_some(), Kind::Chat)
        },
    })
}

/// Chat's `echo` (vLLM's): the last message's content opens the answer when
/// that message is in the answer's role (the assistant's, or with no
/// generation prompt the last message's own), as a continued message reads
/// whole. No logprobs of its own (`ids` empty).
fn chat_echo(r: &ChatRequest, add_generation_prompt: bool) -> Result<Option<Echo>, ApiError> {
    let Some(last) = r.messages.last().filter(|_| r.echo == Some(true)) else {
        return Ok(None);
    };
    if add_generation_prompt && last.role != "assistant" {
        return Ok(None);
    }
    let text = last.text(r.messages.len() - 1)?;
    Ok(Some(Echo {
        text,
        ids: Vec::new(),
    }))
}

/// A forced `tool_choice` ("required" or named) holds the answer to one
/// call of a callable tool, arguments matching its schema; it cannot share
/// the answer with a `response_format`.
fn forced_call(
    t: &ToolRequest,
    family: ToolFamily,
    asked: Option<Box<dyn ferrox_engine::TokenConstraint>>,
    f: &dyn Frontend,
) -> Result<Box<dyn ferrox_engine::TokenConstraint>, ApiError> {
    if asked.is_some() {
        return Err(ApiError::invalid(
            "tool_choice",
            "tool_choice \"required\" or a named function cannot be combined with \
             response_format or a guided grammar",
        ));
    }
    let grammar = tool_grammar(t, family).ok_or_else(|| {
        ApiError::invalid(
            "tool_choice",
            "tool_choice \"required\" or a named function is not supported for harmony \
             (gpt-oss) models; send \"auto\"",
        )
    })?;
    f.constraint(&grammar)
        .map_err(|e| ApiError::invalid("tool_choice", format!("tool_choice: {e}")))
}

/// The conversation rendered with the chat template and tokenized, by
/// the path the router shares (`ferrox_prompt::chat_prompt`): chat and
/// `/tokenize` both come here, so a count is what chat submits.
pub fn chat_prompt(
    messages: &[crate::openai::chat_request::Message],
    options: &RenderOptions<'_>,
    reads_calls: bool,
    c: &PrepareConfig,
    f: &dyn Frontend,
) -> Result<Vec<u32>, ApiError> {
    Ok(ferrox_prompt::chat_prompt(
        messages,
        options,
        reads_calls,
        c.tools.describe,
        &AsTextSide(f),
    )?)
}

/// The frontend as the shared prompt path sees it.
struct AsTextSide<'a>(&'a dyn Frontend);

impl ferrox_prompt::TextSide for AsTextSide<'_> {
    fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, String> {
        self.0.encode(text, add_special)
    }

    fn render_chat(
        &self,
        messages: &[ChatMessage],
        options: &RenderOptions<'_>,
    ) -> Result<String, String> {
        self.0.render_chat(messages, options)
    }
}

/// `bad_words` as token sequences, as vLLM makes them: each word as
/// written and with a leading space (how it appears mid-sentence).
fn bad_words(words: &[String], f: &dyn Frontend) -> Result<Vec<Vec<u32>>, ApiError> {
    let mut out: Vec<Vec<u32>> = Vec::with_capacity(words.len() * 2);
    for word in words {
        let spaced = format!(" {}", word.trim_start());
        for form in [word.as_str(), spaced.as_str()] {
            let ids = f.encode(form, false).map_err(ApiError::Prompt)?;
            if !ids.is_empty() && !out.contains(&ids) {
                out.push(ids);
            }
        }
    }
    Ok(out)
}

use ferrox_prompt::truncated;

fn clamp(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX / 2)
}

/// The compiled grammar a request asks for; a schema or grammar that does
/// not compile is a 400 naming the field it came in.
fn constraint(
    knobs: &Knobs,
    f: &dyn Frontend,
) -> Result<Option<Box<dyn ferrox_engine::TokenConstraint>>, ApiError> {
    let Some(asked) = knobs.grammar()? else {
        return Ok(None);
    };
    f.constraint(&asked.spec)
        .map(Some)
        .map_err(|e| ApiError::invalid(asked.field, format!("{}: {e}", asked.field)))
}

/// The engine's request for one prompt; `logprobs`: alternatives for each
/// generated token and for each prompt token, where asked.
fn request(
    prompt: Vec<u32>,
    max_tokens: usize,
    (logprobs, prompt_logprobs): (Option<usize>, Option<usize>),
    knobs: &Knobs,
    f: &dyn Frontend,
) -> Result<GenerationRequest, ApiError> {
    let mut sampling = knobs.sampling(logprobs, prompt_logprobs)?;
    sampling.bad_words = bad_words(knobs.bad_words.as_deref().unwrap_or_default(), f)?;
    Ok(GenerationRequest {
        prompt,
        max_tokens,
        sampling,
        stop: knobs.stops(),
        include_stop_str: knobs.include_stop_str_in_output == Some(true),
        min_tokens: knobs
            .min_tokens
            .map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX)),
        cache_salt: knobs.cache_salt.clone(),
        // Set to the answer's id when it is submitted.
        request_id: None,
        stop_token_ids: knobs.stop_token_ids.clone().unwrap_or_default(),
        eos_token_ids: f.eos_ids(),
        ignore_eos: knobs.ignore_eos == Some(true),
        text: f.detokenizer(knobs.skip_special_tokens != Some(false)),
        constraint: constraint(knobs, f)?,
        // Set from the request's `model` by the endpoint.
        adapter: None,
    })
}

/// How a request's choices are answered (tools set by the chat endpoint).
fn shape(knobs: &Knobs, logprobs: bool, kind: Kind) -> Shape {
    Shape {
        kind,
        stream: knobs.streaming(),
        include_usage: knobs.include_usage(),
        continuous_usage: knobs.continuous_usage(),
        request_id: knobs.request_id.clone(),
        token_ids: knobs.return_tokens_as_token_ids == Some(true),
        prompt_logprobs: knobs.prompt_logprobs.is_some(),
        logprobs,
        tools: None,
        reasoning: None,
    }
}

#[cfg(test)]
mod tests;
