//! The HTTP routes: OpenAI endpoints, tokenizer, health, readiness,
//! models, metrics and the API description, all in one table.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::handler::Handler;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use ferrox_engine::Event;

use crate::openai::chat_request::ChatRequest;
use crate::openai::error::{ApiError, ErrorBody};
use crate::openai::fields::{
    CHAT_FIELDS, COMPLETION_FIELDS, DETOKENIZE_FIELDS, RESPONSES_FIELDS, TOKENIZE_FIELDS, parse,
    parse_fields,
};
use crate::openai::prepare::{self, ChoiceMeta, PrepareConfig, Prepared, Shape};
use crate::openai::request::{CompletionRequest, check_request_id};

/// The header a client names its request with (vLLM's, and proxies').
const REQUEST_ID_HEADER: &str = "x-request-id";
use crate::openai::response::{Choice, Envelope, Kind, Logprobs};
use crate::openai::response_schema::{
    ChatCompletionResponse, CompletionResponse, DetokenizeResponse, TokenizeResponse,
};
use crate::openai::responses::body::{Meta, ResponseObject, Settings};
use crate::openai::responses::request::ResponsesRequest;
use crate::openai::stream;
use crate::openai::tokenize::{DetokenizeRequest, TokenizeRequest};
use crate::reasoning::answer::AnswerCollector;
use crate::serve::frontend::Frontend;
use crate::serve::state::{AppState, Loaded};
use crate::tools::parser::finish_reason;

pub(crate) mod embeddings;
pub(crate) mod info;
pub(crate) mod lora;
pub(crate) mod prefix;
pub(crate) mod rerank;

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone: probes, scraping, the API description.
    Public,
    /// Only with a configured API key, when the server has any.
    Keyed,
}

/// A route's HTTP method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// GET.
    Get,
    /// POST.
    Post,
}

/// One entry of [`table`].
pub struct Route {
    /// The method.
    pub verb: Verb,
    /// The path.
    pub path: &'static str,
    /// Who may call it.
    pub access: Access,
    /// What answers it.
    pub handler: MethodRouter<AppState>,
}

fn route<H, T>(verb: Verb, path: &'static str, access: Access, handler: H) -> Route
where
    H: Handler<T, AppState>,
    T: 'static,
{
    let handler = match verb {
        Verb::Get => get(handler),
        Verb::Post => post(handler),
    };
    Route {
        verb,
        path,
        access,
        handler,
    }
}

/// The one list of routes: the router ([`crate::serve::app::router`]) is
/// built from it, and the OpenAPI document's test walks it.
pub fn table() -> Vec<Route> {
    use Access::{Keyed, Public};
    use Verb::{Get, Post};
    vec![
        route(Post, "/v1/completions", Keyed, completions),
        route(Post, "/v1/chat/completions", Keyed, chat_completions),
        route(Post, "/v1/responses", Keyed, responses),
        route(Post, "/v1/embeddings", Keyed, embeddings::embeddings),
        route(Post, "/v1/rerank", Keyed, rerank::rerank_v1),
        route(Post, "/rerank", Keyed, rerank::rerank),
        route(Post, "/score", Keyed, rerank::score),
        route(Get, "/v1/models", Keyed, info::models),
        route(
            Post,
            "/v1/load_lora_adapter",
            Keyed,
            lora::load_lora_adapter,
        ),
        route(
            Post,
            "/v1/unload_lora_adapter",
            Keyed,
            lora::unload_lora_adapter,
        ),
        route(Post, "/tokenize", Keyed, tokenize),
        route(Post, "/detokenize", Keyed, detokenize),
        route(Get, "/tokenizer_info", Keyed, info::tokenizer_info),
        route(Get, "/prefix_spec", Keyed, prefix::prefix_spec),
        route(Get, "/kv_events", Keyed, prefix::kv_events),
        route(Get, "/health", Public, info::health),
        route(Get, "/ready", Public, info::ready),
        route(Get, "/metrics", Public, info::metrics),
        route(Get, "/openapi.json", Public, info::openapi_json),
    ]
}

/// `POST /v1/completions`.
#[utoipa::path(post, path = "/v1/completions", tag = "openai",
    request_body = CompletionRequest,
    responses(
        (status = 200, description = "The completion; with `stream: true`, server-sent events whose data are `CompletionChunk`s, then `[DONE]`",
            content((CompletionResponse = "application/json"), (String = "text/event-stream"))),
        (status = "4XX", description = "Refused: 400 bad field or value, 401 no key, 404 unknown model, 408 body too slow, 413 body too large, 429 queue full (with Retry-After)", body = ErrorBody),
        (status = "5XX", description = "503 loading or draining, 504 request timeout, 500 a bug", body = ErrorBody),
    ))]
async fn completions(State(s): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    if let Err(e) = embeddings::generating(&s, "/v1/completions") {
        return e.into_response();
    }
    let prepared = prepare_body(&s, body, |bytes, frontend, config| {
        let r: CompletionRequest = parse(bytes, &COMPLETION_FIELDS)?;
        prepare::completion(r, frontend, config)
    });
    match prepared.await {
        Ok(p) => answer(&s, p, &headers, Reply::OpenAi).await,
        Err(e) => e.into_response(),
    }
}

/// `POST /v1/chat/completions`.
#[utoipa::path(post, path = "/v1/chat/completions", tag = "openai",
    request_body = ChatRequest,
    responses(
        (status = 200, description = "The reply; with `stream: true`, server-sent events whose data are `ChatCompletionChunk`s, then `[DONE]`",
            content((ChatCompletionResponse = "application/json"), (String = "text/event-stream"))),
        (status = "4XX", description = "Refused: 400 bad field or value, 401 no key, 404 unknown model, 408 body too slow, 413 body too large, 429 queue full (with Retry-After)", body = ErrorBody),
        (status = "5XX", description = "503 loading or draining, 504 request timeout, 500 a bug", body = ErrorBody),
    ))]
async fn chat_completions(State(s): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    if let Err(e) = embeddings::generating(&s, "/v1/chat/completions") {
        return e.into_response();
    }
    let prepared = prepare_body(&s, body, |bytes, frontend, config| {
        let r: ChatRequest = parse(bytes, &CHAT_FIELDS)?;
        prepare::chat(r, frontend, config)
    });
    match prepared.await {
        Ok(p) => answer(&s, p, &headers, Reply::OpenAi).await,
        Err(e) => e.into_response(),
    }
}

/// `POST /v1/responses` (OpenAI's Responses API, no response store).
#[utoipa::path(post, path = "/v1/responses", tag = "openai",
    request_body = ResponsesRequest,
    responses(
        (status = 200, description = "The response; with `stream: true`, server-sent events of the Responses API (`response.created` ... `response.completed`, each with `type` and `sequence_number`)",
            content((ResponseObject = "application/json"), (String = "text/event-stream"))),
        (status = "4XX", description = "Refused: 400 bad field or value (`store: true` and `previous_response_id` too: no response store), 401 no key, 404 unknown model, 408 body too slow, 413 body too large, 429 queue full (with Retry-After)", body = ErrorBody),
        (status = "5XX", description = "503 loading or draining, 504 request timeout, 500 a bug", body = ErrorBody),
    ))]
async fn responses(State(s): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    if let Err(e) = embeddings::generating(&s, "/v1/responses") {
        return e.into_response();
    }
    let prepared = prepare_body(&s, body, |bytes, frontend, config| {
        let r: ResponsesRequest = parse_fields(bytes, &[&RESPONSES_FIELDS])?;
        let p = prepare::chat(r.to_chat()?, frontend, config)?;
        Ok((p, Settings::from(&r)))
    });
    match prepared.await {
        Ok((p, settings)) => answer(&s, p, &headers, Reply::Responses(Box::new(settings))).await,
        Err(e) => e.into_response(),
    }
}

/// `POST /tokenize` (vLLM's).
#[utoipa::path(post, path = "/tokenize", tag = "tokenizer",
    request_body = TokenizeRequest,
    responses(
        (status = 200, description = "The token ids", body = TokenizeResponse),
        (status = "4XX", description = "Refused: 400 bad field or value, 401 no key, 404 unknown model, 408 body too slow, 413 body too large, 429 queue full (with Retry-After)", body = ErrorBody),
        (status = "5XX", description = "503 loading or draining, 504 request timeout, 500 a bug", body = ErrorBody),
    ))]
async fn tokenize(State(s): State<AppState>, body: Body) -> Response {
    let answer = prepare_body(&s, body, |bytes, frontend, config| {
        let r = parse_fields(bytes, &[&TOKENIZE_FIELDS])?;
        crate::openai::tokenize::tokenize(r, frontend, config)
    });
    match answer.await {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `POST /detokenize` (vLLM's).
#[utoipa::path(post, path = "/detokenize", tag = "tokenizer",
    request_body = DetokenizeRequest,
    responses(
        (status = 200, description = "The text", body = DetokenizeResponse),
        (status = "4XX", description = "Refused: 400 bad field or value, 401 no key, 404 unknown model, 408 body too slow, 413 body too large, 429 queue full (with Retry-After)", body = ErrorBody),
        (status = "5XX", description = "503 loading or draining, 504 request timeout, 500 a bug", body = ErrorBody),
    ))]
async fn detokenize(State(s): State<AppState>, body: Body) -> Response {
    let answer = prepare_body(&s, body, |bytes, frontend, config| {
        let r = parse_fields(bytes, &[&DETOKENIZE_FIELDS])?;
        crate::openai::tokenize::detokenize(r, frontend, config)
    });
    match answer.await {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// Reads a request's body and runs `work` on it (parsing, templating,
/// tokenizing) off the async threads, with the model's frontend and the
/// prepare settings: one path for every route that takes a model request.
async fn prepare_body<F, T>(s: &AppState, body: Body, work: F) -> Result<T, ApiError>
where
    F: FnOnce(&[u8], &dyn Frontend, &PrepareConfig) -> Result<T, ApiError> + Send + 'static,
    T: Send + 'static,
{
    let (loaded, bytes) = read_body(s, body).await?;
    let frontend = Arc::clone(&loaded.frontend);
    let config = prepare_config(s, loaded);
    off_thread(s, move || work(&bytes, frontend.as_ref(), &config)).await
}

/// Runs CPU-bound request work (parsing, templating, tokenizing) on the
/// blocking pool, so that the async threads keep answering `/health` and
/// every stream; at most one such job per core at a time, so that a flood of
/// long prompts queues here instead of crowding the cores.
fn off_thread<F, T>(
    s: &AppState,
    work: F,
) -> impl std::future::Future<Output = Result<T, ApiError>> + use<F, T>
where
    F: FnOnce() -> Result<T, ApiError> + Send + 'static,
    T: Send + 'static,
{
    let slots = s.prepare_slots();
    async move {
        let _slot = slots
            .acquire_owned()
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        tokio::task::spawn_blocking(work)
            .await
            .unwrap_or_else(|e| Err(ApiError::Internal(format!("preparing the request: {e}"))))
    }
}

/// The body, once the model is loaded, within the size limit and the read
/// timeout.
async fn read_body(s: &AppState, body: Body) -> Result<(&Loaded, Bytes), ApiError> {
    let loaded = s
        .loaded()
        .ok_or_else(|| ApiError::Unavailable("the model is still loading".into()))?;
    if loaded.engine.is_draining() {
        return Err(ferrox_engine::EngineError::Draining.into());
    }
    let limit = s.max_body();
    let read = tokio::time::timeout(s.read_timeout(), axum::body::to_bytes(body, limit));
    let bytes = read
        .await
        .map_err(|_| ApiError::BodyTimeout(s.read_timeout()))?
        .map_err(|e| {
            if std::error::Error::source(&e)
                .is_some_and(|inner| inner.is::<http_body_util::LengthLimitError>())
            {
                ApiError::TooLarge { limit }
            } else {
                ApiError::BadJson(e.to_string())
            }
        })?;
    Ok((loaded, bytes))
}

fn prepare_config(s: &AppState, loaded: &Loaded) -> PrepareConfig {
    PrepareConfig {
        model_name: s.model_name().to_string(),
        max_model_len: loaded.engine.config().max_model_len,
        default_max_tokens: s.default_max_tokens(),
        max_queue: loaded.engine.config().max_queue,
        tools: loaded.tools,
        reasoning: loaded.reasoning,
        adapters: loaded.adapters.clone(),
    }
}

/// Whose shape an answer takes.
enum Reply {
    /// Completions' or chat's (the prepared request's kind).
    OpenAi,
    /// The Responses API's, echoing these settings.
    Responses(Box<Settings>),
}

async fn answer(s: &AppState, p: Prepared, headers: &HeaderMap, reply: Reply) -> Response {
    let Some(loaded) = s.loaded() else {
        return ApiError::Unavailable("the model is still loading".into()).into_response();
    };
    // vLLM's order: the `X-Request-Id` header, else the body's `request_id`.
    let header_id = match header_request_id(headers) {
        Ok(id) => id,
        Err(e) => return e.into_response(),
    };
    loaded.stall.on_request(header_id);
    let (choices, shape) = p.requests();
    let (requests, metas): (Vec<_>, Vec<_>) = choices.into_iter().unzip();
    // The answer names what was asked for: the adapter, else the model.
    let adapter = requests.first().and_then(|r| r.adapter.as_ref());
    let model = adapter.map_or_else(|| s.model_name().to_string(), |a| a.name().to_string());
    let env = envelope(&model, &shape, header_id);
    tracing::debug!(id = %env.id, choices = requests.len(), "request submitted");
    let requests = requests.into_iter().map(|mut r| {
        r.request_id = Some(env.id.clone());
        r
    });
    // All or none: a refusal drops (cancels) the ones already submitted.
    let subs: Result<Vec<_>, _> = requests
        .into_iter()
        .map(|r| loaded.engine.submit(r, Instant::now()))
        .collect();
    let mut subs = match subs {
        Ok(subs) => subs,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let responses = match reply {
        Reply::OpenAi => None,
        Reply::Responses(settings) => Some(Meta::new(&env, *settings)),
    };
    if shape.stream {
        return match (responses, subs.pop()) {
            // The Responses API has one choice (no `n`).
            (Some(meta), Some(sub)) => crate::openai::responses::stream::respond(sub, meta, &shape),
            (None, last) => {
                subs.extend(last);
                let frontend = loaded.frontend.clone();
                stream::respond(subs, metas, env, frontend, shape)
            }
            (Some(_), None) => ApiError::Internal("no choice to answer".into()).into_response(),
        };
    }
    let timeout = s.request_timeout();
    // On timeout the submissions are dropped with the future, which cancels
    // them; the first choice to fail drops (cancels) the others.
    let choices = subs
        .into_iter()
        .zip(&metas)
        .map(|(sub, meta)| collect(sub, meta, &env, loaded.frontend.as_ref(), &shape));
    let all = futures::future::try_join_all(choices);
    let done = match tokio::time::timeout(timeout, all).await {
        Err(_) => return ApiError::RequestTimeout(timeout).into_response(),
        Ok(Err(e)) => return e.into_response(),
        Ok(Ok(done)) => done,
    };
    let mut usage = ferrox_engine::Usage::default();
    for ((_, u), meta) in done.iter().zip(&metas) {
        meta.add_usage(&mut usage, u);
    }
    let mut choices: Vec<Choice> = done.into_iter().map(|(c, _)| c).collect();
    match (responses, choices.pop()) {
        (Some(meta), Some(choice)) => {
            axum::Json(crate::openai::responses::body::whole(&meta, choice, usage)).into_response()
        }
        (_, last) => {
            choices.extend(last);
            axum::Json(env.full(choices, usage)).into_response()
        }
    }
}

/// Waits for one choice's whole answer. Dropping this future (the client
/// went away) drops the submission, which cancels the request.
async fn collect(
    mut sub: ferrox_engine::Submission,
    meta: &ChoiceMeta,
    env: &Envelope,
    frontend: &dyn crate::serve::frontend::Frontend,
    shape: &Shape,
) -> Result<(Choice, ferrox_engine::Usage), ApiError> {
    let echo = meta.echo.as_ref().map_or("", |e| e.text.as_str());
    let mut answer = AnswerCollector::new(shape.reasoning, shape.tools, echo);
    // Where each token's text starts, for logprobs.
    let mut offset = echo.len();
    let mut lp = Logprobs::default();
    let mut prompt_logprobs = None;
    while let Some(event) = sub.next().await {
        match event {
            Event::PromptLogprobs(entries) => {
                if shape.prompt_logprobs {
                    prompt_logprobs = Some(env.prompt_logprobs(&entries, frontend));
                }
                if let Some(echo) = meta.echo.as_ref().filter(|_| shape.logprobs) {
                    lp.prompt = Logprobs::echoed(&echo.ids, entries, frontend).prompt;
                }
            }
            Event::Token {
                text: t, logprob, ..
            } => {
                if let (true, Some(l)) = (shape.logprobs, logprob) {
                    lp.tokens.push((l, offset));
                }
                offset += t.len();
                answer.push(&t, 1);
            }
            Event::Done {
                reason,
                text: tail,
                usage,
            } => {
                answer.push(&tail, 0);
                let logprobs = shape.logprobs.then(|| env.logprobs(&lp, frontend));
                let whole = answer.finish();
                let choice = Choice {
                    text: whole.content,
                    finish: finish_reason(reason.as_str(), whole.calls.len()),
                    logprobs,
                    tool_calls: whole.calls,
                    reasoning: whole.reasoning,
                    reasoning_tokens: shape.reasoning.map(|_| whole.reasoning_tokens),
                    prompt_logprobs,
                };
                return Ok((choice, usage));
            }
            Event::Error(e) => return Err(e.into()),
            Event::Vectors { .. } => return Err(stream::vectors_to_a_generation()),
        }
    }
    Err(ferrox_engine::EngineError::WorkerGone.into())
}

/// The `X-Request-Id` header, checked as the body's `request_id` is.
fn header_request_id(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    let Some(value) = headers.get(REQUEST_ID_HEADER) else {
        return Ok(None);
    };
    let id = value.to_str().map_err(|_| "not visible ASCII".to_string());
    id.and_then(|id| check_request_id(id).map(|()| id))
        .map(Some)
        .map_err(|why| ApiError::invalid("X-Request-Id", why))
}

/// The envelope of one answer: its id is `<prefix>-<request id>` when the
/// client named the request (the header first, then the body), else
/// `<prefix>-<a clock-derived hex>`.
fn envelope(model: &str, shape: &Shape, header_id: Option<&str>) -> Envelope {
    let kind = shape.kind;
    let request_id = header_id.or(shape.request_id.as_deref());
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let prefix = match kind {
        Kind::Completion => "cmpl",
        Kind::Chat => "chatcmpl",
    };
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    Envelope {
        kind,
        id: request_id.map_or_else(
            || format!("{prefix}-{nanos:x}"),
            |id| format!("{prefix}-{id}"),
        ),
        created,
        model: model.to_string(),
        token_ids: shape.token_ids,
    }
}

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;
