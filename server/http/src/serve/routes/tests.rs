//! The HTTP surface over a fake model: shapes, statuses and streaming.

use serde_json::Value;

use crate::fixtures::{DEFAULT_MAX_TOKENS, engine_config, request, serve};

fn json_of(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[tokio::test]
async fn completion_and_chat_answer_in_openai_shape() {
    let (addr, _s) = serve(engine_config(), 0).await;
    // "AB" is tokens 1, 2; the fake model then counts 3, 4, 5.
    let (status, body) = request(
        addr,
        "POST",
        "/v1/completions",
        r#"{"model": "fake", "prompt": "AB", "max_tokens": 3, "temperature": 0}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let v = json_of(&body);
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], "345");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["prompt_tokens"], 2);
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["usage"]["total_tokens"], 5);
    let (status, body) = request(
        addr,
        "POST",
        "/v1/chat/completions",
        r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stop": ["nothing"]}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let v = json_of(&body);
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
}

#[tokio::test]
async fn a_chat_without_max_tokens_gets_the_default_capped_by_the_context() {
    let (addr, _s) = serve(engine_config(), 0).await;
    // The fake template renders "user:{content}\n": 6 tokens + the content,
    // and max_model_len is 128.
    let cases = [("hi", DEFAULT_MAX_TOKENS), (&"x".repeat(120) as &str, 2)];
    for (content, want) in cases {
        let body = format!(
            r#"{{"messages": [{{"role": "user", "content": "{content}"}}], "ignore_eos": true}}"#
        );
        let (status, body) = request(addr, "POST", "/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{body}");
        let v = json_of(&body);
        assert_eq!(v["usage"]["completion_tokens"], want, "{body}");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
    }
    // An explicit max_tokens is not capped: it is refused if it cannot fit.
    let body = r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 500}"#;
    assert_eq!(
        request(addr, "POST", "/v1/chat/completions", body).await.0,
        400
    );
}

#[tokio::test]
async fn streaming_ends_with_usage_and_done() {
    let (addr, _s) = serve(engine_config(), 0).await;
    let (status, body) = request(
        addr,
        "POST",
        "/v1/completions",
        r#"{"prompt": [1], "max_tokens": 4, "temperature": 0, "stop": "45", "stream": true,
            "stream_options": {"include_usage": true}}"#,
    )
    .await;
    assert_eq!(status, 200);
    let events: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| json_of(e))
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    // 2, 3, then "4" held back as the start of "45", then the stop matched.
    assert_eq!(text, "23");
    let finish: Vec<&Value> = chunks
        .iter()
        .map(|c| &c["choices"][0]["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish, vec!["stop"]);
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(
        (
            usage["prompt_tokens"].as_u64(),
            usage["completion_tokens"].as_u64()
        ),
        (Some(1), Some(4))
    );
}

#[tokio::test]
async fn errors_have_the_right_status_and_shape() {
    let (addr, _s) = serve(engine_config(), 0).await;
    let big = format!(r#"{{"prompt": "{}"}}"#, "x".repeat(2000));
    let cases: Vec<(&str, &str, String, u16)> = vec![
        ("POST", "/v1/completions", "{oops".into(), 400),
        (
            "POST",
            "/v1/completions",
            r#"{"prompt": "a", "n": 3}"#.into(),
            400,
        ),
        (
            "POST",
            "/v1/completions",
            r#"{"prompt": "a", "model": "other"}"#.into(),
            404,
        ),
        (
            "POST",
            "/v1/completions",
            r#"{"prompt": [1, 2], "max_tokens": 500}"#.into(),
            400,
        ),
        ("POST", "/v1/completions", r#"{"prompt": [99]}"#.into(), 400),
        ("POST", "/v1/completions", big, 413),
        ("GET", "/v1/nothing", String::new(), 404),
    ];
    for (method, path, body, want) in cases {
        let (status, text) = request(addr, method, path, &body).await;
        assert_eq!(status, want, "{path} {body:.60}: {text}");
        let e = &json_of(&text)["error"];
        assert!(e["message"].is_string() && e["type"].is_string(), "{text}");
        assert!(
            e.get("param").is_some() && e.get("code").is_some(),
            "{text}"
        );
    }
}

#[tokio::test]
async fn queue_full_is_429_and_draining_is_503() {
    // One row at a time, a line of 2, 20 ms a step: the 4th concurrent request
    // finds the line full.
    let mut config = engine_config();
    config.max_seqs = 1;
    config.max_queue = 2;
    let (addr, state) = serve(config, 20).await;
    let body = r#"{"prompt": [1], "max_tokens": 10, "ignore_eos": true}"#;
    let calls = (0..5).map(|_| request(addr, "POST", "/v1/completions", body));
    let results = futures::future::join_all(calls).await;
    let statuses: Vec<u16> = results.iter().map(|r| r.0).collect();
    assert!(
        statuses.contains(&429) && statuses.contains(&200),
        "{statuses:?}"
    );
    assert!(
        results
            .iter()
            .any(|r| r.0 == 429 && r.1.contains("queue_full"))
    );
    assert_eq!(request(addr, "GET", "/ready", "").await.0, 200);
    state.loaded().unwrap().engine.start_draining();
    assert_eq!(request(addr, "GET", "/ready", "").await.0, 503);
    assert_eq!(request(addr, "GET", "/health", "").await.0, 200);
    assert_eq!(request(addr, "POST", "/v1/completions", body).await.0, 503);
}

#[tokio::test]
async fn models_and_metrics() {
    let (addr, _s) = serve(engine_config(), 0).await;
    let (status, body) = request(addr, "GET", "/v1/models", "").await;
    assert_eq!(status, 200);
    assert_eq!(json_of(&body)["data"][0]["id"], "fake");
    request(
        addr,
        "POST",
        "/v1/completions",
        r#"{"prompt": [1], "max_tokens": 2}"#,
    )
    .await;
    let (status, text) = request(addr, "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    // Counted before the tokens were sent.
    assert!(text.contains("ferrox_generation_tokens_total 2"), "{text}");
    // The running gauge is published when the tick that sent the answer ends.
    let running = "vllm:num_requests_running{model_name=\"fake\"} 0";
    answers_with(addr, "/metrics", 200, running).await;
}

/// Sends a request and waits `after` without reading the answer; dropping the
/// returned socket hangs up.
async fn send_only(
    addr: std::net::SocketAddr,
    body: &str,
    after: std::time::Duration,
) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    tokio::time::sleep(after).await;
    s
}

#[tokio::test]
async fn a_client_that_hangs_up_frees_its_blocks() {
    // With n = 2 the hang-up cancels both choices.
    for (stream, n) in [(true, 1), (false, 1), (true, 2), (false, 2)] {
        let (addr, state) = serve(engine_config(), 10).await;
        let metrics = state.loaded().unwrap().engine.metrics().clone();
        let body = format!(
            r#"{{"prompt": [1], "max_tokens": 100, "ignore_eos": true, "stream": {stream}, "n": {n}}}"#
        );
        let socket = send_only(addr, &body, std::time::Duration::from_millis(150)).await;
        assert_eq!(metrics.running(), n, "stream={stream}: not running yet");
        assert!(metrics.kv_used() > 0);
        drop(socket);
        let mut waited = 0;
        while metrics.kv_used() > 0 || metrics.running() > 0 {
            assert!(
                waited < 100,
                "stream={stream} n={n}: blocks still leased 1 s after the hang-up"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            waited += 1;
        }
        assert!(
            metrics
                .render("fake")
                .contains(&format!("reason=\"abort\"}} {n}")),
            "stream={stream} n={n}"
        );
    }
}

#[tokio::test]
async fn api_keys_guard_the_openai_routes_and_leave_probes_open() {
    use crate::fixtures::{request_with, serve_with};
    use crate::load::config::HttpConfig;
    let http = HttpConfig {
        api_keys: vec!["sk-a".into(), "sk-b".into()],
        ..HttpConfig::default()
    };
    let (addr, _s) = serve_with(engine_config(), 0, &http).await;
    let body = r#"{"prompt": [1], "max_tokens": 2}"#;
    // (method, path, Authorization, expected status)
    let cases: [(&str, &str, Option<&str>, u16); 10] = [
        ("POST", "/v1/completions", None, 401),
        ("POST", "/v1/completions", Some("Bearer sk-c"), 401),
        ("POST", "/v1/completions", Some("Bearer sk-a"), 200),
        ("POST", "/v1/completions", Some("Bearer sk-b"), 200),
        ("POST", "/v1/chat/completions", Some("sk-a"), 401),
        ("GET", "/v1/models", None, 401),
        ("GET", "/v1/models", Some("Bearer sk-b"), 200),
        ("GET", "/health", None, 200),
        ("GET", "/ready", None, 200),
        ("GET", "/metrics", None, 200),
    ];
    for (method, path, auth, want) in cases {
        let headers: Vec<(&str, &str)> = auth.map(|a| ("authorization", a)).into_iter().collect();
        let sent = if method == "POST" { body } else { "" };
        let (status, head, text) = request_with(addr, method, path, &headers, sent).await;
        assert_eq!(status, want, "{method} {path} {auth:?}: {text}");
        if want == 401 {
            let e = &json_of(&text)["error"];
            assert_eq!(e["code"], "invalid_api_key", "{text}");
            assert_eq!(e["type"], "invalid_request_error");
            assert!(e["message"].as_str().unwrap().contains("Bearer"));
            assert!(
                head.to_ascii_lowercase()
                    .contains("www-authenticate: bearer"),
                "{head}"
            );
        }
    }
}

#[tokio::test]
async fn a_request_past_its_timeout_is_cancelled_with_a_504_and_frees_its_blocks() {
    use crate::fixtures::serve_with;
    use crate::load::config::HttpConfig;
    let http = HttpConfig {
        request_timeout: std::time::Duration::from_millis(200),
        ..HttpConfig::default()
    };
    let (addr, state) = serve_with(engine_config(), 20, &http).await;
    let (status, text) = request(
        addr,
        "POST",
        "/v1/completions",
        r#"{"prompt": [1], "max_tokens": 100, "ignore_eos": true}"#,
    )
    .await;
    assert_eq!(status, 504, "{text}");
    assert_eq!(json_of(&text)["error"]["code"], "timeout");
    let metrics = state.loaded().unwrap().engine.metrics().clone();
    for _ in 0..100 {
        if metrics.kv_used() == 0 && metrics.running() == 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("blocks still leased 1 s after the timeout");
}

/// Polls GET `path` (for up to 5 s, generous for a loaded CI machine)
/// until it answers `status` with a body containing `fragment`.
async fn answers_with(addr: std::net::SocketAddr, path: &str, status: u16, fragment: &str) {
    let mut last = (0, String::new());
    for _ in 0..500 {
        last = request(addr, "GET", path, "").await;
        if last.0 == status && last.1.contains(fragment) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("{path} answered {last:?}, not {status} {fragment:?}");
}

#[tokio::test]
async fn health_fails_on_a_stalled_tick_and_on_a_dead_worker() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use crate::fixtures::{FakeModel, loaded_with, serve_state};
    use crate::load::config::HttpConfig;
    let http = HttpConfig {
        stall_timeout: std::time::Duration::from_millis(100),
        ..HttpConfig::default()
    };
    let die = Arc::new(AtomicBool::new(false));
    let model = FakeModel {
        delay: std::time::Duration::from_millis(400),
        die: Arc::clone(&die),
    };
    let state = loaded_with(model, engine_config(), &http);
    let addr = serve_state(state.clone(), &http).await;
    assert_eq!(request(addr, "GET", "/health", "").await.0, 200);
    let slow = tokio::spawn(request(
        addr,
        "POST",
        "/v1/completions",
        r#"{"prompt": [1], "max_tokens": 1}"#,
    ));
    tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    let (status, text) = request(addr, "GET", "/health", "").await;
    assert_eq!(
        status, 503,
        "inside a 400 ms step with a 100 ms bound: {text}"
    );
    assert!(text.contains("in one step"), "{text}");
    assert_eq!(slow.await.unwrap().0, 200);
    // The answer is sent inside the tick; the stall clears when it ends.
    answers_with(addr, "/health", 200, "ok").await;
    die.store(true, Ordering::SeqCst);
    let (status, _) = request(
        addr,
        "POST",
        "/v1/completions",
        r#"{"prompt": [1], "max_tokens": 1}"#,
    )
    .await;
    assert_eq!(status, 503, "the request the worker died on is told why");
    // The request ends as the worker unwinds, a moment before the thread is
    // marked stopped; from then on /health fails and names the cause.
    answers_with(addr, "/health", 503, "stopped").await;
    for _ in 0..10 {
        assert_eq!(request(addr, "GET", "/health", "").await.0, 503);
    }
    assert_eq!(request(addr, "GET", "/ready", "").await.0, 503);
}

mod choices;

#[tokio::test]
async fn tokenizer_info_names_the_special_tokens_and_the_context() {
    let (addr, _s) = serve(engine_config(), 0).await;
    let (status, body) = request(addr, "GET", "/tokenizer_info", "").await;
    assert_eq!(status, 200, "{body}");
    // The fake tokenizer's end token 0 reads "0"; it has no BOS.
    assert_eq!(
        json_of(&body),
        serde_json::json!({"tokenizer_class": "ferrox", "bos_token": null, "eos_token": "0",
            "pad_token": null, "model_max_length": 128})
    );
}

#[tokio::test]
async fn the_stall_fault_switch_hangs_the_worker_for_its_request_id_only() {
    use crate::fixtures::{FakeModel, loaded_stalling, request_with, serve_state};
    use crate::load::config::HttpConfig;
    use crate::serve::fault::StallSwitch;
    let http = HttpConfig {
        stall_timeout: std::time::Duration::from_millis(100),
        ..HttpConfig::default()
    };
    let switch = StallSwitch::new(Some("hang-here".into()));
    let state = loaded_stalling(
        FakeModel {
            delay: std::time::Duration::ZERO,
            die: Default::default(),
        },
        engine_config(),
        &http,
        switch,
    );
    let addr = serve_state(state, &http).await;
    let body = r#"{"prompt": [1], "max_tokens": 1}"#;
    let other = [("x-request-id", "another")];
    let (status, _, _) = request_with(addr, "POST", "/v1/completions", &other, body).await;
    assert_eq!(status, 200, "another id runs as usual");
    answers_with(addr, "/health", 200, "ok").await;
    let hang = [("x-request-id", "hang-here")];
    let stalled =
        tokio::spawn(
            async move { request_with(addr, "POST", "/v1/completions", &hang, body).await },
        );
    answers_with(addr, "/health", 503, "in one step").await;
    stalled.abort();
}
