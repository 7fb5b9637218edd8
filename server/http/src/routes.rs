//! The HTTP routes: OpenAI endpoints, health, readiness, models, metrics.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use ferrox_engine::Event;
use serde_json::json;

use crate::error::ApiError;
use crate::prepare::{self, Prepared};
use crate::request::{CHAT_FIELDS, COMPLETION_FIELDS, ChatRequest, CompletionRequest, parse};
use crate::response::{Envelope, Kind, Logprobs};
use crate::state::{AppState, Loaded};
use crate::stream;

/// The whole API.
pub fn router(state: AppState) -> Router {
    let limit = state.max_body();
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(axum::extract::DefaultBodyLimit::max(limit))
        .with_state(state)
}

async fn completions(State(s): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    let prepared = read_body(&s, body).and_then(|(loaded, bytes)| {
        let r: CompletionRequest = parse(&bytes, &COMPLETION_FIELDS)?;
        check_model(&s, r.knobs.model.as_deref())?;
        Ok((loaded, prepare::completion(r, loaded.frontend.as_ref())?))
    });
    match prepared {
        Ok((loaded, p)) => answer(&s, loaded, p).await,
        Err(e) => e.into_response(),
    }
}

async fn chat_completions(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let prepared = read_body(&s, body).and_then(|(loaded, bytes)| {
        let r: ChatRequest = parse(&bytes, &CHAT_FIELDS)?;
        check_model(&s, r.knobs.model.as_deref())?;
        let limit = loaded.engine.config().max_model_len;
        let default = s.default_max_tokens();
        let prepared = prepare::chat(r, loaded.frontend.as_ref(), limit, default)?;
        Ok((loaded, prepared))
    });
    match prepared {
        Ok((loaded, p)) => answer(&s, loaded, p).await,
        Err(e) => e.into_response(),
    }
}

/// The body, once the model is loaded and the body is within the limit.
fn read_body(
    s: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<(&Loaded, Bytes), ApiError> {
    let loaded = s
        .loaded()
        .ok_or_else(|| ApiError::Unavailable("the model is still loading".into()))?;
    if loaded.engine.is_draining() {
        return Err(ferrox_engine::EngineError::Draining.into());
    }
    let bytes = body.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::TooLarge {
            limit: s.max_body(),
        },
        _ => ApiError::BadJson(e.body_text()),
    })?;
    Ok((loaded, bytes))
}

fn check_model(s: &AppState, asked: Option<&str>) -> Result<(), ApiError> {
    match asked {
        Some(m) if m != s.model_name() => Err(ApiError::UnknownModel(m.to_string())),
        _ => Ok(()),
    }
}

async fn answer(s: &AppState, loaded: &Loaded, p: Prepared) -> Response {
    let env = envelope(s, p.kind);
    let sub = match loaded.engine.submit(p.req, Instant::now()) {
        Ok(sub) => sub,
        Err(e) => return ApiError::from(e).into_response(),
    };
    if p.stream {
        let frontend = loaded.frontend.clone();
        return stream::respond(sub, env, frontend, p.include_usage, p.logprobs);
    }
    collect(sub, env, loaded, p.logprobs).await
}

/// Waits for the whole answer. Dropping this future (the client went away)
/// drops the submission, which cancels the request.
async fn collect(
    mut sub: ferrox_engine::Submission,
    env: Envelope,
    loaded: &Loaded,
    want_logprobs: bool,
) -> Response {
    let mut text = String::new();
    let mut lp = Logprobs::default();
    while let Some(event) = sub.next().await {
        match event {
            Event::Token {
                text: t, logprob, ..
            } => {
                if let (true, Some(l)) = (want_logprobs, logprob) {
                    lp.tokens.push((l, text.len()));
                }
                text.push_str(&t);
            }
            Event::Done {
                reason,
                text: tail,
                usage,
            } => {
                text.push_str(&tail);
                let logprobs = want_logprobs.then(|| env.logprobs(&lp, loaded.frontend.as_ref()));
                return axum::Json(env.full(&text, reason.as_str(), logprobs, usage))
                    .into_response();
            }
            Event::Error(e) => return ApiError::from(e).into_response(),
        }
    }
    ApiError::from(ferrox_engine::EngineError::WorkerGone).into_response()
}

fn envelope(s: &AppState, kind: Kind) -> Envelope {
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
        id: format!("{prefix}-{nanos:x}"),
        created,
        model: s.model_name().to_string(),
    }
}

async fn models(State(s): State<AppState>) -> Response {
    let max_model_len = s.loaded().map(|l| l.engine.config().max_model_len);
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": s.model_name(),
            "object": "model",
            "created": 0,
            "owned_by": "ferrox",
            "max_model_len": max_model_len,
        }],
    }))
    .into_response()
}

/// Liveness: answers at once, whatever the model is doing.
async fn health() -> Response {
    (StatusCode::OK, "ok").into_response()
}

/// Readiness: model loaded, worker running, not draining.
async fn ready(State(s): State<AppState>) -> Response {
    if s.is_ready() {
        (StatusCode::OK, "ready").into_response()
    } else {
        ApiError::Unavailable("not ready".into()).into_response()
    }
}

async fn metrics(State(s): State<AppState>) -> Response {
    let text = s
        .loaded()
        .map(|l| l.engine.metrics().render(s.model_name()))
        .unwrap_or_default();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn not_found() -> Response {
    ApiError::NoRoute.into_response()
}

#[cfg(test)]
mod tests;
