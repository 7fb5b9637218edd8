//! The server's one error type, and the one place errors become HTTP statuses
//! and OpenAI-shaped bodies.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use ferrox_engine::EngineError;
use serde::Serialize;

/// Seconds a client told "queue full" should wait before retrying.
const RETRY_AFTER_SECS: &str = "1";

/// Everything a request can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body is not valid JSON or not the expected shape.
    #[error("invalid request body: {0}")]
    BadJson(String),
    /// The body is over the size limit.
    #[error("request body too large (limit {limit} bytes)")]
    TooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// A field is invalid or unsupported.
    #[error("{message}")]
    Invalid {
        /// What is wrong.
        message: String,
        /// The field, if one.
        param: Option<String>,
    },
    /// The request names a model this server does not serve.
    #[error("the model `{0}` does not exist")]
    UnknownModel(String),
    /// A LoRA adapter to unload that the server does not have.
    #[error("the LoRA adapter {0:?} cannot be found")]
    UnknownAdapter(String),
    /// The server was not started to allow this.
    #[error("{0}")]
    Forbidden(String),
    /// No such route.
    #[error("no such route")]
    NoRoute,
    /// Tokenizing or templating failed.
    #[error("could not prepare the prompt: {0}")]
    Prompt(String),
    /// The model is not loaded yet, or the server is draining.
    #[error("{0}")]
    Unavailable(String),
    /// No key, or not one of the server's.
    #[error("a valid API key is required: send it as `Authorization: Bearer <key>`")]
    Unauthorized,
    /// The body did not arrive within the read timeout.
    #[error("the request body did not arrive within {0:?}")]
    BodyTimeout(std::time::Duration),
    /// The answer was not ready within the request timeout; the request was
    /// cancelled.
    #[error("the request did not finish within {0:?} and was cancelled")]
    RequestTimeout(std::time::Duration),
    /// Every connection slot is taken.
    #[error("the server is serving its limit of {max} connections; retry later")]
    TooManyConnections {
        /// The cap.
        max: usize,
    },
    /// A bug on our side (a task that panicked).
    #[error("internal error: {0}")]
    Internal(String),
    /// The engine refused or failed the request.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl From<ferrox_prompt::PromptError> for ApiError {
    fn from(e: ferrox_prompt::PromptError) -> Self {
        match e {
            ferrox_prompt::PromptError::Invalid { param, message } => ApiError::Invalid {
                message,
                param: Some(param),
            },
            ferrox_prompt::PromptError::Prompt(m) => ApiError::Prompt(m),
        }
    }
}

impl ApiError {
    /// An invalid-field error.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        ApiError::Invalid {
            message: message.into(),
            param: Some(param.to_string()),
        }
    }

    /// Status, OpenAI error type, param and code. The only status mapping.
    fn classify(
        &self,
    ) -> (
        StatusCode,
        &'static str,
        Option<String>,
        Option<&'static str>,
    ) {
        use StatusCode as S;
        let invalid = "invalid_request_error";
        match self {
            ApiError::BadJson(_) => (S::BAD_REQUEST, invalid, None, Some("invalid_json")),
            ApiError::TooLarge { .. } => {
                (S::PAYLOAD_TOO_LARGE, invalid, None, Some("body_too_large"))
            }
            ApiError::Invalid { param, .. } => (S::BAD_REQUEST, invalid, param.clone(), None),
            ApiError::UnknownModel(_) => (
                S::NOT_FOUND,
                invalid,
                Some("model".into()),
                Some("model_not_found"),
            ),
            ApiError::UnknownAdapter(_) => (
                S::NOT_FOUND,
                invalid,
                Some("lora_name".into()),
                Some("model_not_found"),
            ),
            ApiError::Forbidden(_) => (S::FORBIDDEN, "permission_error", None, None),
            ApiError::NoRoute => (S::NOT_FOUND, invalid, None, None),
            ApiError::Prompt(_) => (S::BAD_REQUEST, invalid, Some("prompt".into()), None),
            ApiError::Unavailable(_) => (S::SERVICE_UNAVAILABLE, "service_unavailable", None, None),
            ApiError::Unauthorized => (S::UNAUTHORIZED, invalid, None, Some("invalid_api_key")),
            ApiError::BodyTimeout(_) => {
                (S::REQUEST_TIMEOUT, invalid, None, Some("request_timeout"))
            }
            ApiError::RequestTimeout(_) => {
                (S::GATEWAY_TIMEOUT, "timeout_error", None, Some("timeout"))
            }
            ApiError::TooManyConnections { .. } => (
                S::SERVICE_UNAVAILABLE,
                "service_unavailable",
                None,
                Some("too_many_connections"),
            ),
            ApiError::Internal(_) => (S::INTERNAL_SERVER_ERROR, "server_error", None, None),
            ApiError::Engine(e) => match e {
                EngineError::Invalid { param, .. } => {
                    (S::BAD_REQUEST, invalid, param.clone(), None)
                }
                EngineError::TooLong { .. } => (
                    S::BAD_REQUEST,
                    invalid,
                    Some("max_tokens".into()),
                    Some("context_length_exceeded"),
                ),
                EngineError::QueueFull { .. } => (
                    S::TOO_MANY_REQUESTS,
                    "rate_limit_error",
                    None,
                    Some("queue_full"),
                ),
                EngineError::Draining | EngineError::WorkerGone => {
                    (S::SERVICE_UNAVAILABLE, "service_unavailable", None, None)
                }
                EngineError::Model(_)
                | EngineError::PoolMismatch { .. }
                | EngineError::Config(_) => (S::INTERNAL_SERVER_ERROR, "server_error", None, None),
            },
        }
    }

    /// The OpenAI error object, also sent as an SSE event mid-stream.
    pub fn body(&self) -> ErrorBody {
        let (_, kind, param, code) = self.classify();
        ErrorBody {
            error: ErrorDetail {
                message: self.to_string(),
                kind,
                param,
                code,
            },
        }
    }
}

/// `{"error": {...}}`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// The detail.
    pub error: ErrorDetail,
}

/// OpenAI's error detail.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// Human-readable.
    pub message: String,
    /// OpenAI's error type.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The offending field.
    pub param: Option<String>,
    /// A machine-readable code.
    pub code: Option<&'static str>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, ..) = self.classify();
        let mut response = (status, axum::Json(self.body())).into_response();
        if status == StatusCode::TOO_MANY_REQUESTS {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_static(RETRY_AFTER_SECS),
            );
        }
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses() {
        let cases: Vec<(ApiError, u16)> = vec![
            (ApiError::BadJson("x".into()), 400),
            (ApiError::TooLarge { limit: 1 }, 413),
            (ApiError::invalid("n", "n must be 1"), 400),
            (ApiError::UnknownModel("m".into()), 404),
            (ApiError::UnknownAdapter("a".into()), 404),
            (ApiError::Forbidden("off".into()), 403),
            (ApiError::Unavailable("loading".into()), 503),
            (EngineError::QueueFull { max_queue: 1 }.into(), 429),
            (EngineError::Draining.into(), 503),
            (EngineError::Model("boom".into()).into(), 500),
            (ApiError::Unauthorized, 401),
            (
                ApiError::BodyTimeout(std::time::Duration::from_secs(1)),
                408,
            ),
            (
                ApiError::RequestTimeout(std::time::Duration::from_secs(1)),
                504,
            ),
            (ApiError::TooManyConnections { max: 1 }, 503),
            (ApiError::Internal("panic".into()), 500),
            (too_long(), 400),
        ];
        for (e, want) in cases {
            let r = e.into_response();
            assert_eq!(r.status().as_u16(), want);
            assert_eq!(r.headers().contains_key(header::RETRY_AFTER), want == 429);
        }
        // The 400 names the pool that cannot hold the request, with numbers.
        let body = too_long().body();
        assert_eq!(
            body.error.message,
            "this request needs 3 tokens (1 prompt + 2 max_tokens), more than the server's \
             limit of 2 tokens (the 8-token window pool's 0 blocks of 2 tokens, where a long \
             sequence reserves 5)"
        );
        assert_eq!(body.error.code, Some("context_length_exceeded"));
    }

    fn too_long() -> ApiError {
        EngineError::TooLong {
            prompt_tokens: 1,
            max_tokens: 2,
            needed_tokens: 3,
            limit_tokens: 2,
            limit: "the 8-token window pool's 0 blocks of 2 tokens, where a long sequence \
                    reserves 5"
                .into(),
        }
        .into()
    }
}
