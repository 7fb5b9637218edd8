//! The HTTP side: the OpenAI routes, each request checked (key, size),
//! held while its model has no ready endpoint, routed by the table and
//! forwarded; the answer streams back as it comes, and dropping it (the
//! client hung up) drops the upstream request, which the server cancels.

use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use ferrox_plan::contract::router;
use ferrox_router::{RequestView, Retries, RouteSettings, RouterError, SendFailure, Target};
use futures::StreamExt;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde_json::json;
use tokio::sync::oneshot;

use crate::shared::Shared;

/// Request headers passed upstream as they came.
const FORWARDED: [header::HeaderName; 3] =
    [header::CONTENT_TYPE, header::AUTHORIZATION, header::ACCEPT];
/// The request id header (vLLM's), passed both ways.
const REQUEST_ID: &str = "x-request-id";

/// Every route.
pub fn app(s: Shared) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/rerank", post(rerank_v1))
        .route("/rerank", post(rerank))
        .route("/score", post(score))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { "ok" }))
        .route("/ready", get(|| async { "ready" }))
        .route("/metrics", get(metrics))
        .route(router::PENDING_PATH, get(pending_report))
        .fallback(|| async {
            error(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "no such route",
                None,
                None,
            )
        })
        .with_state(s)
}

/// `GET /pending?since=V&wait_ms=MS`: the waiting line's report, held
/// until it differs from version `since` or `wait_ms` passes.
async fn pending_report(
    State(s): State<Shared>,
    query: Result<Query<PendingPoll>, QueryRejection>,
) -> Response {
    let Ok(Query(poll)) = query else {
        let message = "query: `since` and `wait_ms` are unsigned integers";
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            message,
            None,
            None,
        );
    };
    let mut rx = s.pending_report();
    let current = rx.borrow_and_update().version;
    if poll.since == Some(current) {
        let wait = Duration::from_millis(poll.wait_ms.unwrap_or(0).min(router::MAX_WAIT_MS));
        // Timing out answers with the same version: the poller asks again.
        let _ = tokio::time::timeout(wait, rx.changed()).await;
    }
    let report = rx.borrow().clone();
    axum::Json(report).into_response()
}

/// The query of `GET /pending`.
#[derive(Debug, serde::Deserialize)]
struct PendingPoll {
    since: Option<u64>,
    wait_ms: Option<u64>,
}

/// An error in OpenAI's shape.
fn error(
    status: StatusCode,
    kind: &str,
    message: &str,
    param: Option<&str>,
    code: Option<&str>,
) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "param": param, "code": code}});
    (status, axum::Json(body)).into_response()
}

/// A 503 the client may retry after `secs`.
fn unavailable(message: &str, secs: u64) -> Response {
    let mut r = error(
        StatusCode::SERVICE_UNAVAILABLE,
        "service_unavailable",
        message,
        None,
        None,
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    r
}

/// A refusal in OpenAI's shape.
fn refusal(e: &RouterError) -> Response {
    let msg = e.to_string();
    match e {
        RouterError::QueueFull { .. } => unavailable(&msg, 1),
        RouterError::Timeout { .. } => unavailable(&msg, 5),
        RouterError::UnknownModel(_) => error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            &msg,
            Some("model"),
            Some("model_not_found"),
        ),
        RouterError::BadRequest(_) | RouterError::BadEndpoint(_) => error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            &msg,
            None,
            None,
        ),
    }
}

async fn chat(State(s): State<Shared>, h: HeaderMap, body: Body) -> Response {
    proxy(s, "/v1/chat/completions", true, h, body).await
}

async fn completions(State(s): State<Shared>, h: HeaderMap, body: Body) -> Response {
    proxy(s, "/v1/completions", true, h, body).await
}

/// An embedding model's requests: no prompt to place by its cached
/// prefix (nothing is kept), so to the least-loaded ready replica, held
/// while the model has none.
async fn embeddings(State(s): State<Shared>, h: HeaderMap, body: Body) -> Response {
    proxy(s, "/v1/embeddings", false, h, body).await
}

/// A cross-encoder's requests, routed as embeddings are.
async fn rerank_v1(State(s): State<Shared>, h: HeaderMap, body: Body) -> Response {
    proxy(s, "/v1/rerank", false, h, body).await
}

async fn rerank(State(s): State<Shared>, h: HeaderMap, body: Body) -> Response {
    proxy(s, "/rerank", false, h, body).await
}

async fn score(State(s): State<Shared>, h: HeaderMap, body: Body) -> Response {
    proxy(s, "/score", false, h, body).await
}

async fn tokenize(State(s): State<Shared>, h: HeaderMap, body: Body) -> Response {
    proxy(s, "/tokenize", false, h, body).await
}

async fn detokenize(State(s): State<Shared>, h: HeaderMap, body: Body) -> Response {
    proxy(s, "/detokenize", false, h, body).await
}

fn unauthorized() -> Response {
    error(
        StatusCode::UNAUTHORIZED,
        "invalid_request_error",
        "a valid API key is required: send it as `Authorization: Bearer <key>`",
        None,
        Some("invalid_api_key"),
    )
}

fn allowed(s: &Shared, h: &HeaderMap) -> bool {
    s.keys()
        .allows(h.get(header::AUTHORIZATION).map(HeaderValue::as_bytes))
}

/// `GET /v1/models`: every model the router knows, ready or at zero, then
/// every LoRA adapter with its model as `parent` (vLLM's shape).
async fn models(State(s): State<Shared>, h: HeaderMap) -> Response {
    if !allowed(&s, &h) {
        return unauthorized();
    }
    let table = s.table();
    let card = |id: &str, parent: Option<&str>| json!({"id": id, "object": "model", "created": 0, "owned_by": "ferrox", "parent": parent});
    let mut data: Vec<_> = table.models().map(|m| card(m, None)).collect();
    let adapters = table.adapters();
    data.extend(adapters.iter().map(|(a, m)| card(a, Some(m))));
    drop(table);
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

async fn metrics(State(s): State<Shared>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics().render(),
    )
        .into_response()
}

/// Reads the body up to the limit: 413 past it, 400 when it breaks off.
async fn read_body(body: Body, limit: usize) -> Result<Bytes, Response> {
    match Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            &format!("the request body is larger than {limit} bytes"),
            None,
            Some("body_too_large"),
        )),
        Err(e) => Err(error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            &format!("the request body could not be read: {e}"),
            None,
            None,
        )),
    }
}

/// What a request is for: the model or LoRA adapter it names, or the only
/// model known.
fn target_of(s: &Shared, view: Option<&RequestView>) -> Result<Target, RouterError> {
    let table = s.table();
    let model = match view.and_then(|v| v.model.clone()) {
        Some(m) => m,
        None => {
            let models: Vec<&str> = table.models().collect();
            match models.as_slice() {
                [only] => only.to_string(),
                _ => {
                    return Err(RouterError::BadRequest(
                        "`model` is required: this router serves several models".into(),
                    ));
                }
            }
        }
    };
    table
        .resolve(&model)
        .ok_or(RouterError::UnknownModel(model))
}

/// A place in the waiting line; leaving it (served, timed out, or the
/// client gone) takes it out.
struct Waiting<'a> {
    s: &'a Shared,
    model: &'a str,
    id: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.s.pending().remove(self.model, self.id);
        self.s.publish_pending(self.model);
    }
}

/// Waits until `model` has a ready endpoint, within the wait timeout.
async fn wait_ready(s: &Shared, model: &str) -> Result<(), RouterError> {
    let timeout = s.settings().wait_timeout;
    let deadline = Instant::now() + timeout;
    let (tx, rx) = oneshot::channel();
    let pushed = s.pending().push(model, tx, deadline);
    let id = pushed.inspect_err(|_| s.metrics().refused(model, "queue-full"))?;
    let _place = Waiting { s, model, id };
    s.publish_pending(model);
    // It may have become ready between the caller's look and the push.
    s.wake(model);
    match tokio::time::timeout_at(deadline.into(), rx).await {
        Ok(Ok(())) => Ok(()),
        _ => {
            s.metrics().refused(model, "timeout");
            Err(RouterError::Timeout {
                model: model.to_string(),
                secs: timeout.as_secs(),
            })
        }
    }
}

/// Counts a request in flight at an endpoint until dropped (with the
/// answer's body, so a stream counts until it ends or the client leaves).
struct InFlight {
    s: Shared,
    model: String,
    url: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let n = self.s.table().finish(&self.model, &self.url);
        self.s.metrics().set_in_flight(&self.model, &self.url, n);
    }
}

async fn proxy(
    s: Shared,
    path: &'static str,
    generates: bool,
    h: HeaderMap,
    body: Body,
) -> Response {
    if !allowed(&s, &h) {
        return unauthorized();
    }
    let bytes = match read_body(body, s.settings().max_body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let view = RequestView::parse(&bytes);
    let target = match target_of(&s, view.as_ref()) {
        Ok(t) => t,
        Err(e) => return refusal(&e),
    };
    // An adapter's requests wait for, and count under, its model.
    let model = target.model.clone();
    let ready = s.table().has_ready(&model);
    if !ready && let Err(e) = wait_ready(&s, &model).await {
        return refusal(&e);
    }
    let prompter = s.table().prompter(&model);
    // An adapter's chains are salted by its key; not loaded anywhere yet,
    // it has none to match, and the prompt's text places it.
    let key = match &target.adapter {
        Some(a) => s.table().adapter_key(&model, a).map(Some),
        None => Some(None),
    };
    let text = view.as_ref().map(RequestView::text_key).unwrap_or_default();
    let chain = match (generates, view, prompter, key) {
        // Tokenizing takes a while for long prompts: off the async threads.
        (true, Some(v), Some(p), Some(key)) => {
            tokio::task::spawn_blocking(move || v.chain(&p, key.as_deref()))
                .await
                .ok()
                .flatten()
        }
        _ => None,
    };
    let now = Instant::now();
    let settings = RouteSettings {
        bounds: s.settings().bounds,
        load_factor: s.settings().load_factor,
        expect_until: now + s.settings().expect_ttl,
    };
    // A replica that refused the connection, or dropped it before its
    // answer began, gave the client nothing: the request goes to the next
    // choice (`Retries` bounds how often).
    let mut retries = Retries::default();
    let (upstream, url, decision, guard) = loop {
        let routed = s
            .table()
            .route(&target, chain.as_deref(), &text, now, &settings);
        let Some((url, decision)) = routed else {
            return unavailable(&format!("no replica of model `{model}` is ready"), 1);
        };
        let guard = InFlight {
            s: s.clone(),
            model: model.clone(),
            url: url.clone(),
        };
        s.metrics().decided(
            &model,
            decision.reason.as_str(),
            decision.predicted_hit_blocks,
        );
        s.metrics().tier_blocks(&model, decision.predicted_by_tier);
        let n = s.table().in_flight(&model, &url);
        s.metrics().set_in_flight(&model, &url, n);
        let mut req = s.client().post(format!("{url}{path}")).body(bytes.clone());
        for name in FORWARDED
            .iter()
            .map(header::HeaderName::as_str)
            .chain([REQUEST_ID])
        {
            if let Some(v) = h.get(name) {
                req = req.header(name, v.as_bytes());
            }
        }
        let e = match req.send().await {
            Ok(r) => break (r, url, decision, guard),
            Err(e) => e,
        };
        let failure = send_failure(&e);
        if retries.allow(failure) {
            tracing::warn!(%url, error = %e, ?failure, "replica gave no answer; trying another");
            // Not ready until its poller reaches it again.
            s.table().mark_unreachable(&model, &url);
            continue;
        }
        tracing::warn!(%url, error = %e, "upstream request failed");
        return error(
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            &format!("the replica at {url} did not answer: {e}"),
            None,
            None,
        );
    };
    let status = upstream.status();
    let mut headers = HeaderMap::new();
    for name in [
        header::CONTENT_TYPE.as_str(),
        header::RETRY_AFTER.as_str(),
        REQUEST_ID,
    ] {
        if let Some(v) = upstream.headers().get(name) {
            headers.insert(name, v.clone());
        }
    }
    if let Ok(v) = HeaderValue::from_str(&url) {
        headers.insert("x-ferrox-endpoint", v);
    }
    headers.insert(
        "x-ferrox-route",
        HeaderValue::from_static(decision.reason.as_str()),
    );
    headers.insert(
        "x-ferrox-predicted-hit-blocks",
        HeaderValue::from(decision.predicted_hit_blocks),
    );
    // The guard rides in the stream: dropped with the body, whether it
    // ended or the client hung up.
    let stream = upstream.bytes_stream().map(move |chunk| {
        let _held = &guard;
        chunk
    });
    let mut response = Response::new(Body::from_stream(stream));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

/// What kind of failure `e` is, for [`Retries`].
fn send_failure(e: &reqwest::Error) -> SendFailure {
    if e.is_connect() {
        SendFailure::Refused
    } else if e.is_request() && !e.is_timeout() {
        // The connection closed or was reset before the answer's head.
        SendFailure::Dropped
    } else {
        SendFailure::Other
    }
}
