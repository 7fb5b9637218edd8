//! `POST /v1/embeddings`: the request checked and tokenized off the async
//! threads, submitted to the pooling worker, its vectors finished as the
//! request asked. A generating model answers it with a 400 naming what it
//! serves, as an embedding model answers completions.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use ferrox_engine::{Event, PoolingRequest, Submission};
use ferrox_plan::Task;

use super::{off_thread, read_body};
use crate::openai::embedding_response::{EmbeddingData, EmbeddingResponse, EmbeddingUsage, finish};
use crate::openai::embeddings::{EmbeddingRequest, Finish, prepare};
use crate::openai::error::{ApiError, ErrorBody};
use crate::openai::fields::{EMBEDDING_FIELDS, parse_fields};
use crate::serve::state::{AppState, Loaded};

/// `POST /v1/embeddings`.
#[utoipa::path(post, path = "/v1/embeddings", tag = "openai",
    request_body = EmbeddingRequest,
    responses(
        (status = 200, description = "One vector per input, in input order", body = EmbeddingResponse),
        (status = "4XX", description = "Refused: 400 bad field or value (an empty input or string, a text over the model's length without truncate_prompt_tokens, a token id outside the vocabulary, dimensions on a model without Matryoshka sizes or not one of them, an unknown prompt_name, a model that generates text), 401 no key, 404 unknown model, 408 body too slow, 413 body too large, 429 queue full (with Retry-After)", body = ErrorBody),
        (status = "5XX", description = "503 loading or draining, 504 request timeout, 500 a bug", body = ErrorBody),
    ))]
pub(crate) async fn embeddings(State(s): State<AppState>, body: Body) -> Response {
    answer(embed(&s, body).await)
}

/// A pooling route's answer: its body as JSON, or its error.
pub(super) fn answer<T: serde::Serialize>(r: Result<T, ApiError>) -> Response {
    match r {
        Ok(r) => axum::Json(r).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn embed(s: &AppState, body: Body) -> Result<EmbeddingResponse, ApiError> {
    let (loaded, bytes) = read_body(s, body).await?;
    let model = (loaded.embedding.clone())
        .filter(|_| loaded.task == Task::Embed)
        .ok_or_else(|| serves(s, loaded, "/v1/embeddings"))?;
    let frontend = Arc::clone(&loaded.frontend);
    let p = off_thread(s, move || {
        let r: EmbeddingRequest = parse_fields(&bytes, &[&EMBEDDING_FIELDS])?;
        prepare(r, frontend.as_ref(), &model)
    })
    .await?;
    let req = PoolingRequest {
        inputs: p.inputs,
        token_types: Vec::new(),
        request_id: None,
    };
    let sub = loaded.engine.submit_pooling(req, Instant::now())?;
    let timeout = s.request_timeout();
    // On timeout the submission is dropped with the future: a cancel.
    let (data, usage) = tokio::time::timeout(timeout, vectors(sub))
        .await
        .map_err(|_| ApiError::RequestTimeout(timeout))??;
    Ok(response(s.model_name(), data, usage, &p.finish))
}

/// The request's vectors and usage, once the worker sends them.
pub(crate) async fn vectors(
    mut sub: Submission,
) -> Result<(Vec<Vec<f32>>, ferrox_engine::Usage), ApiError> {
    match sub.next().await {
        Some(Event::Vectors { data, usage }) => Ok((data, usage)),
        Some(Event::Error(e)) => Err(e.into()),
        Some(other) => Err(ApiError::Internal(format!(
            "the pooling worker answered {other:?}"
        ))),
        None => Err(ferrox_engine::EngineError::WorkerGone.into()),
    }
}

fn response(
    model: &str,
    data: Vec<Vec<f32>>,
    usage: ferrox_engine::Usage,
    f: &Finish,
) -> EmbeddingResponse {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    EmbeddingResponse {
        id: format!("embd-{:x}", now.as_nanos()),
        object: "list",
        created: now.as_secs(),
        model: model.to_string(),
        data: data
            .into_iter()
            .enumerate()
            .map(|(index, v)| EmbeddingData {
                object: "embedding",
                index,
                embedding: finish(v, f),
            })
            .collect(),
        usage: EmbeddingUsage {
            prompt_tokens: usage.prompt_tokens,
            total_tokens: usage.prompt_tokens,
        },
    }
}

/// The 400 for a route the model does not serve (`route`), naming what
/// it does.
pub(crate) fn serves(s: &AppState, loaded: &Loaded, route: &str) -> ApiError {
    let what = match loaded.task {
        Task::Generate => {
            "generates text: it serves /v1/completions, /v1/chat/completions and /v1/responses"
        }
        Task::Embed => "embeds text: it serves /v1/embeddings",
        Task::Score => "scores text pairs: it serves /v1/rerank, /rerank and /score",
    };
    ApiError::invalid(
        "model",
        format!(
            "model {} (task {}) {what}, not {route}",
            s.model_name(),
            loaded.task
        ),
    )
}

/// Refuses a generation route on a model that does not generate.
pub(crate) fn generating(s: &AppState, route: &str) -> Result<(), ApiError> {
    match s.loaded() {
        Some(l) if l.task != Task::Generate => Err(serves(s, l, route)),
        _ => Ok(()),
    }
}
