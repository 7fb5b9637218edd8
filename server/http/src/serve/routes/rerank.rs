//! `POST /v1/rerank`, `/rerank` and `/score`: a cross-encoder's pairs,
//! checked and tokenized off the async threads, scored by the pooling
//! worker (each pair one sequence, its document's tokens type 1). A model
//! that does not score answers with a 400 naming what it serves.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use ferrox_engine::PoolingRequest;
use ferrox_plan::Task;

use super::embeddings::{answer, serves, vectors};
use super::{off_thread, read_body};
use crate::openai::embeddings::EmbeddingModel;
use crate::openai::error::{ApiError, ErrorBody};
use crate::openai::fields::{RERANK_FIELDS, SCORE_FIELDS, parse_fields};
use crate::openai::rerank::{
    PairUsage, PreparedPairs, RerankRequest, RerankResponse, ScoreData, ScoreRequest,
    ScoreResponse, prepare_rerank, prepare_score, rank,
};
use crate::serve::frontend::Frontend;
use crate::serve::state::AppState;

/// `POST /v1/rerank`.
#[utoipa::path(post, path = "/v1/rerank", tag = "openai",
    request_body = RerankRequest,
    responses(
        (status = 200, description = "The documents by relevance_score, best first", body = RerankResponse),
        (status = "4XX", description = "Refused: 400 bad field or value (no query, no or empty documents, an empty text, top_n below 0, a pair over the model's length, a model that does not score), 401 no key, 404 unknown model, 413 body too large, 429 queue full", body = ErrorBody),
        (status = "5XX", description = "503 loading or draining, 504 request timeout", body = ErrorBody),
    ))]
pub(crate) async fn rerank_v1(State(s): State<AppState>, body: Body) -> Response {
    answer(rerank_pairs(&s, body, "/v1/rerank").await)
}

/// `POST /rerank` (Jina's and Cohere's v1 path).
#[utoipa::path(post, path = "/rerank", tag = "openai",
    request_body = RerankRequest,
    responses(
        (status = 200, description = "As /v1/rerank", body = RerankResponse),
        (status = "4XX", description = "As /v1/rerank", body = ErrorBody),
        (status = "5XX", description = "As /v1/rerank", body = ErrorBody),
    ))]
pub(crate) async fn rerank(State(s): State<AppState>, body: Body) -> Response {
    answer(rerank_pairs(&s, body, "/rerank").await)
}

/// `POST /score` (vLLM's).
#[utoipa::path(post, path = "/score", tag = "openai",
    request_body = ScoreRequest,
    responses(
        (status = 200, description = "One score per pair, in request order", body = ScoreResponse),
        (status = "4XX", description = "Refused: 400 bad field or value (text_1 or text_2 missing or empty, lists of different lengths, an empty text, a pair over the model's length, a model that does not score), 401 no key, 404 unknown model, 413 body too large, 429 queue full", body = ErrorBody),
        (status = "5XX", description = "503 loading or draining, 504 request timeout", body = ErrorBody),
    ))]
pub(crate) async fn score(State(s): State<AppState>, body: Body) -> Response {
    answer(score_pairs(&s, body).await)
}

fn ids() -> (String, u64) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (format!("score-{:x}", now.as_nanos()), now.as_secs())
}

async fn rerank_pairs(s: &AppState, body: Body, route: &str) -> Result<RerankResponse, ApiError> {
    let (prepared, options) = prepare(s, body, route, |bytes, f, m| {
        let r: RerankRequest = parse_fields(bytes, &[&RERANK_FIELDS])?;
        prepare_rerank(r, f, m)
    })
    .await?;
    let (scores, usage) = run(s, prepared).await?;
    Ok(RerankResponse {
        id: ids().0,
        model: s.model_name().to_string(),
        results: rank(&scores, &options),
        usage,
    })
}

async fn score_pairs(s: &AppState, body: Body) -> Result<ScoreResponse, ApiError> {
    let prepared = prepare(s, body, "/score", |bytes, f, m| {
        let r: ScoreRequest = parse_fields(bytes, &[&SCORE_FIELDS])?;
        prepare_score(r, f, m)
    })
    .await?;
    let (scores, usage) = run(s, prepared).await?;
    let (id, created) = ids();
    let data = (scores.into_iter().enumerate())
        .map(|(index, score)| ScoreData {
            index,
            object: "score",
            score,
        })
        .collect();
    Ok(ScoreResponse {
        id,
        object: "list",
        created,
        model: s.model_name().to_string(),
        data,
        usage,
    })
}

/// The body read and prepared by `work` off the async threads, once the
/// model is known to score.
async fn prepare<T, F>(s: &AppState, body: Body, route: &str, work: F) -> Result<T, ApiError>
where
    F: FnOnce(&[u8], &dyn Frontend, &EmbeddingModel) -> Result<T, ApiError> + Send + 'static,
    T: Send + 'static,
{
    let (loaded, bytes) = read_body(s, body).await?;
    let model = (loaded.embedding.clone())
        .filter(|_| loaded.task == Task::Score)
        .ok_or_else(|| serves(s, loaded, route))?;
    let frontend = Arc::clone(&loaded.frontend);
    off_thread(s, move || work(&bytes, frontend.as_ref(), &model)).await
}

/// Each pair's score and the token counts.
async fn run(s: &AppState, p: PreparedPairs) -> Result<(Vec<f32>, PairUsage), ApiError> {
    let loaded = s
        .loaded()
        .ok_or_else(|| ApiError::Unavailable("the model is still loading".into()))?;
    let req = PoolingRequest {
        inputs: p.inputs,
        token_types: p.token_types,
        request_id: None,
    };
    let sub = loaded.engine.submit_pooling(req, Instant::now())?;
    let timeout = s.request_timeout();
    let (data, usage) = tokio::time::timeout(timeout, vectors(sub))
        .await
        .map_err(|_| ApiError::RequestTimeout(timeout))??;
    let scores = data
        .into_iter()
        .map(|v| v.first().copied().unwrap_or(f32::NAN))
        .collect();
    let usage = PairUsage {
        prompt_tokens: usage.prompt_tokens,
        total_tokens: usage.prompt_tokens,
    };
    Ok((scores, usage))
}
