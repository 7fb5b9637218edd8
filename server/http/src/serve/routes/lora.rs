//! vLLM's run-time LoRA routes: `POST /v1/load_lora_adapter` and
//! `/v1/unload_lora_adapter`, allowed only on a server started with
//! `--allow-runtime-lora-updating` (or `VLLM_ALLOW_RUNTIME_LORA_UPDATING`),
//! else refused with a 403 that says so.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::load::adapters::AdapterStore;
use crate::openai::error::{ApiError, ErrorBody};
use crate::serve::state::AppState;

/// `POST /v1/load_lora_adapter`'s body (vLLM's).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LoadLoraAdapterRequest {
    /// The name requests will give as `model`.
    pub lora_name: String,
    /// The adapter: a PEFT directory or a GGUF LoRA file, as a path,
    /// `file://`, `hf://` or `https://`.
    pub lora_path: String,
    /// Replace an adapter of that name already loaded.
    #[serde(default)]
    pub load_inplace: bool,
}

/// `POST /v1/unload_lora_adapter`'s body (vLLM's).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UnloadLoraAdapterRequest {
    /// The adapter's name.
    pub lora_name: String,
    /// vLLM's numeric id; accepted and not used (names identify adapters).
    #[serde(default)]
    pub lora_int_id: Option<i64>,
}

/// The store, if this server may change its adapters at run time.
fn runtime_store(s: &AppState) -> Result<Arc<AdapterStore>, ApiError> {
    let loaded = s
        .loaded()
        .ok_or_else(|| ApiError::Unavailable("the model is still loading".into()))?;
    let store = loaded.adapters.clone().ok_or_else(|| {
        ApiError::invalid(
            "lora_name",
            "this server serves no LoRA adapters: start it with --enable-lora \
             --allow-runtime-lora-updating",
        )
    })?;
    if !store.config().allow_runtime_updates {
        return Err(ApiError::Forbidden(
            "loading and unloading LoRA adapters at run time is off: start the server with \
             --allow-runtime-lora-updating (or VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)"
                .into(),
        ));
    }
    Ok(store)
}

async fn body_of<T: serde::de::DeserializeOwned>(s: &AppState, body: Body) -> Result<T, ApiError> {
    let (_, bytes) = super::read_body(s, body).await?;
    serde_json::from_slice(&bytes).map_err(|e| ApiError::BadJson(e.to_string()))
}

/// `POST /v1/load_lora_adapter` (vLLM's): loads and checks an adapter.
#[utoipa::path(post, path = "/v1/load_lora_adapter", tag = "lora",
    request_body = LoadLoraAdapterRequest,
    responses(
        (status = 200, description = "Loaded", body = String,
            example = "Success: LoRA adapter 'sql' added successfully."),
        (status = 400, description = "Refused with the reason: the name is taken or invalid, the source unreachable, the rank above --max-lora-rank, a shape not the base's, a truncated file; or the server serves no adapters", body = ErrorBody),
        (status = 401, description = "No valid key (when the server has keys)", body = ErrorBody),
        (status = 403, description = "The server was not started with --allow-runtime-lora-updating", body = ErrorBody),
        (status = 503, description = "Loading, or every adapter kept in memory is in use", body = ErrorBody),
    ))]
pub(crate) async fn load_lora_adapter(State(s): State<AppState>, body: Body) -> Response {
    let run = async {
        let store = runtime_store(&s)?;
        let r: LoadLoraAdapterRequest = body_of(&s, body).await?;
        let name = r.lora_name.clone();
        let added = tokio::task::spawn_blocking(move || {
            if r.load_inplace && store.contains(&r.lora_name) {
                store.replace(&r.lora_name, &r.lora_path)
            } else {
                store.add(&r.lora_name, &r.lora_path)
            }
        });
        added
            .await
            .map_err(|e| ApiError::Internal(format!("loading the adapter: {e}")))??;
        Ok::<_, ApiError>(format!(
            "Success: LoRA adapter '{name}' added successfully."
        ))
    };
    match run.await {
        Ok(text) => text.into_response(),
        Err(e) => e.into_response(),
    }
}

/// `POST /v1/unload_lora_adapter` (vLLM's): forgets an adapter; requests
/// already running with it finish with it.
#[utoipa::path(post, path = "/v1/unload_lora_adapter", tag = "lora",
    request_body = UnloadLoraAdapterRequest,
    responses(
        (status = 200, description = "Unloaded", body = String,
            example = "Success: LoRA adapter 'sql' removed successfully."),
        (status = 400, description = "Bad body, or the server serves no adapters", body = ErrorBody),
        (status = 401, description = "No valid key (when the server has keys)", body = ErrorBody),
        (status = 403, description = "The server was not started with --allow-runtime-lora-updating", body = ErrorBody),
        (status = 404, description = "No adapter of that name", body = ErrorBody),
    ))]
pub(crate) async fn unload_lora_adapter(State(s): State<AppState>, body: Body) -> Response {
    let run = async {
        let store = runtime_store(&s)?;
        let r: UnloadLoraAdapterRequest = body_of(&s, body).await?;
        store.remove(&r.lora_name)?;
        tracing::info!(adapter = %r.lora_name, lora_int_id = ?r.lora_int_id, "LoRA adapter unloaded");
        Ok::<_, ApiError>(format!(
            "Success: LoRA adapter '{}' removed successfully.",
            r.lora_name
        ))
    };
    match run.await {
        Ok(text) => text.into_response(),
        Err(e) => e.into_response(),
    }
}
