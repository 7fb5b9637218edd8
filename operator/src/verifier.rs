//! A scripted API server for reconcile tests (the kube-rs/controller-rs
//! pattern): each expected request is checked, then answered.

use http::{Method, Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use std::time::Duration;

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// The server side of a mocked client.
pub struct ApiServerVerifier(Handle);

/// A request as the verifier saw it.
pub struct Seen {
    /// Path and query.
    pub uri: String,
    /// JSON body (Null when empty).
    pub body: Value,
}

/// A client wired to a verifier.
pub fn mock_client() -> (Client, ApiServerVerifier) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, "default"), ApiServerVerifier(handle))
}

impl ApiServerVerifier {
    /// Takes the next request, asserting its method and path prefix, and answers `reply(body)`.
    pub async fn expect(
        &mut self,
        method: Method,
        path: &str,
        reply: impl FnOnce(&Value) -> (StatusCode, Value),
    ) -> Seen {
        let (request, send) = self.0.next_request().await.expect("a request");
        let uri = request.uri().to_string();
        assert_eq!(request.method(), method, "{uri}");
        assert!(uri.starts_with(path), "expected {method} {path}, got {uri}");
        let bytes = request.into_body().collect_bytes().await.unwrap();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        let (status, answer) = reply(&body);
        let response = Response::builder()
            .status(status)
            .body(Body::from(serde_json::to_vec(&answer).unwrap()))
            .unwrap();
        send.send_response(response);
        Seen { uri, body }
    }

    /// Asserts that no further request arrives.
    pub async fn expect_silence(&mut self) {
        let next = tokio::time::timeout(Duration::from_millis(200), self.0.next_request()).await;
        if let Ok(Some((request, _))) = next {
            panic!("unexpected request {} {}", request.method(), request.uri());
        }
    }
}

/// Echo the applied object back (what an apply of a new object returns).
pub fn echo(body: &Value) -> (StatusCode, Value) {
    (StatusCode::OK, body.clone())
}

/// A 404 Status.
pub fn not_found(_: &Value) -> (StatusCode, Value) {
    (
        StatusCode::NOT_FOUND,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
    )
}
