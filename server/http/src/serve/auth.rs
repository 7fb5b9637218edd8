//! API keys on the OpenAI routes (`ferrox_core::ApiKeys`: bearer tokens,
//! compared in constant time).

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::openai::error::ApiError;
use crate::serve::state::AppState;

/// Middleware: a 401 in OpenAI's shape unless the request carries a key.
pub async fn require_key(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let value = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    if s.api_keys().allows(value) {
        next.run(req).await
    } else {
        ApiError::Unauthorized.into_response()
    }
}
