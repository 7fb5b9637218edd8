//! The routes that tell rather than generate: models, liveness, readiness,
//! metrics and the API description.

use std::time::Instant;

use axum::Extension;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use ferrox_engine::Liveness;

use crate::openai::error::{ApiError, ErrorBody};
use crate::openai::response_schema::{ModelCard, ModelList, TokenizerInfo};
use crate::serve::state::AppState;

/// `GET /v1/models`: the served model, then its LoRA adapters (`parent`
/// the served model, as vLLM lists them).
#[utoipa::path(get, path = "/v1/models", tag = "openai",
    responses(
        (status = 200, description = "The served model and its LoRA adapters", body = ModelList),
        (status = 401, description = "No valid key (when the server has keys)", body = ErrorBody),
    ))]
pub(crate) async fn models(State(s): State<AppState>) -> Response {
    let max_model_len = s.loaded().map(|l| l.engine.config().max_model_len);
    let card = |id: String| ModelCard {
        id,
        object: "model".into(),
        created: 0,
        owned_by: "ferrox".into(),
        max_model_len,
        root: None,
        parent: None,
        cache_key: None,
        task: s.loaded().map(|l| l.task),
    };
    let mut data = vec![card(s.model_name().to_string())];
    let adapters = s.loaded().and_then(|l| l.adapters.as_ref());
    for a in adapters.map(|a| a.list()).unwrap_or_default() {
        data.push(ModelCard {
            root: Some(a.source),
            parent: Some(s.model_name().to_string()),
            cache_key: a.key,
            ..card(a.name)
        });
    }
    axum::Json(ModelList {
        object: "list".into(),
        data,
    })
    .into_response()
}

/// `GET /tokenizer_info` (vLLM's): the special tokens, for clients that
/// tokenize through `/tokenize` (lm-eval's `tokenizer_backend=remote`).
#[utoipa::path(get, path = "/tokenizer_info", tag = "tokenizer",
    responses(
        (status = 200, description = "The special tokens and the context length", body = TokenizerInfo),
        (status = 401, description = "No valid key (when the server has keys)", body = ErrorBody),
        (status = 503, description = "The model is still loading", body = ErrorBody),
    ))]
pub(crate) async fn tokenizer_info(State(s): State<AppState>) -> Response {
    let Some(loaded) = s.loaded() else {
        return ApiError::Unavailable("the model is still loading".into()).into_response();
    };
    let (bos_token, eos_token) = loaded.frontend.bos_eos_tokens();
    axum::Json(TokenizerInfo {
        tokenizer_class: "ferrox".into(),
        bos_token,
        eos_token,
        pad_token: None,
        model_max_length: loaded.engine.config().max_model_len,
    })
    .into_response()
}

/// Liveness: answers at once, whatever the model is doing; 503 once the
/// worker has died or one tick has run past `--stall-timeout`, so that
/// Kubernetes restarts the pod.
#[utoipa::path(get, path = "/health", tag = "probes",
    responses(
        (status = 200, description = "Alive (also while the model loads)", body = String, example = "ok"),
        (status = 503, description = "The worker has stopped or is stuck in one step", body = ErrorBody),
    ))]
pub(crate) async fn health(State(s): State<AppState>) -> Response {
    match s.liveness(Instant::now()) {
        Liveness::Live => (StatusCode::OK, "ok").into_response(),
        Liveness::Stopped => {
            ApiError::Unavailable("the batching worker has stopped".into()).into_response()
        }
        Liveness::Stalled(d) => ApiError::Unavailable(format!(
            "the batching worker has been in one step for {:.1} s",
            d.as_secs_f64()
        ))
        .into_response(),
    }
}

/// Readiness: model loaded, worker running, not draining.
#[utoipa::path(get, path = "/ready", tag = "probes",
    responses(
        (status = 200, description = "Ready to serve", body = String, example = "ready"),
        (status = 503, description = "Loading, draining or stopped", body = ErrorBody),
    ))]
pub(crate) async fn ready(State(s): State<AppState>) -> Response {
    if s.is_ready() {
        (StatusCode::OK, "ready").into_response()
    } else {
        ApiError::Unavailable("not ready".into()).into_response()
    }
}

/// Prometheus text: ferrox's own names and vLLM's.
#[utoipa::path(get, path = "/metrics", tag = "probes",
    responses(
        (status = 200, description = "Prometheus text exposition (empty while the model loads)",
            body = String, content_type = "text/plain; version=0.0.4; charset=utf-8"),
    ))]
pub(crate) async fn metrics(State(s): State<AppState>) -> Response {
    let text = s
        .loaded()
        .map(|l| {
            if let Some(store) = &l.adapters {
                let served: Vec<(String, bool)> = store
                    .list()
                    .into_iter()
                    .map(|a| (a.name, a.key.is_some()))
                    .collect();
                l.engine.metrics().set_lora_adapters(&served);
            }
            l.engine.metrics().render(s.model_name())
        })
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

/// This API as OpenAPI 3.1. Public even when the server has keys, as
/// vLLM's is (its key check covers only `/v1` paths).
#[utoipa::path(get, path = "/openapi.json", tag = "probes",
    responses(
        (status = 200, description = "The OpenAPI 3.1 document", body = Object),
    ))]
pub(crate) async fn openapi_json(Extension(doc): Extension<ApiDocument>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], doc.0).into_response()
}

/// The `/openapi.json` body, which the router hands to [`openapi_json`]: the
/// document lists that handler, so building it here would make the two files
/// import each other.
#[derive(Debug, Clone)]
pub struct ApiDocument(pub String);
