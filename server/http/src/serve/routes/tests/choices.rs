//! n choices, echo and prompt logprobs over the fake model (token i reads
//! as the character '0' + i; "AB" is tokens 1, 2 and the model counts on).

use serde_json::Value;

use super::json_of;
use crate::fixtures::{engine_config, request, request_with, serve};

/// The `data:` payloads of an SSE body, less `[DONE]` (checked last).
fn chunks(body: &str) -> Vec<Value> {
    let events: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{body}");
    events[..events.len() - 1]
        .iter()
        .map(|e| json_of(e))
        .collect()
}

#[tokio::test]
async fn n_choices_are_indexed_counted_and_streamed_apart() {
    let (addr, _s) = serve(engine_config(), 0).await;
    let body = r#"{"prompt": [1], "max_tokens": 3, "n": 2, "seed": 5}"#;
    let (status, body) = request(addr, "POST", "/v1/completions", body).await;
    assert_eq!(status, 200, "{body}");
    let v = json_of(&body);
    let texts: Vec<(u64, &str)> = v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["index"].as_u64().unwrap(), c["text"].as_str().unwrap()))
        .collect();
    assert_eq!(texts, vec![(0, "234"), (1, "234")]);
    assert_eq!(v["usage"]["prompt_tokens"], 1);
    assert_eq!(v["usage"]["completion_tokens"], 6);
    let body = r#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "n": 2,
        "stream": true, "stream_options": {"include_usage": true}}"#;
    let (status, body) = request(addr, "POST", "/v1/chat/completions", body).await;
    assert_eq!(status, 200, "{body}");
    let chunks = chunks(&body);
    let mut text = [String::new(), String::new()];
    let mut finished = [0, 0];
    let mut roles = [0, 0];
    for c in &chunks[..chunks.len() - 1] {
        let choice = &c["choices"][0];
        let i = choice["index"].as_u64().unwrap() as usize;
        text[i].push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        finished[i] += usize::from(!choice["finish_reason"].is_null());
        roles[i] += usize::from(choice["delta"]["role"] == "assistant");
    }
    assert_eq!((finished, roles), ([1, 1], [1, 1]));
    assert_eq!(text[0].chars().count(), 2);
    assert_eq!(text[0], text[1]);
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 4);
}

#[tokio::test]
async fn echo_puts_the_prompt_first_with_its_logprobs_when_asked() {
    let (addr, _s) = serve(engine_config(), 0).await;
    // (body, whole text)
    let cases = [
        (r#"{"prompt": "AB", "max_tokens": 2, "echo": true}"#, "AB34"),
        (
            r#"{"prompt": [1, 2], "max_tokens": 2, "echo": true}"#,
            "1234",
        ),
    ];
    for (body, want) in cases {
        let (status, body) = request(addr, "POST", "/v1/completions", body).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(json_of(&body)["choices"][0]["text"], want);
    }
    let body = r#"{"prompt": [1, 2, 9], "max_tokens": 1, "echo": true, "logprobs": 1}"#;
    let (status, body) = request(addr, "POST", "/v1/completions", body).await;
    assert_eq!(status, 200, "{body}");
    let v = json_of(&body);
    let choice = &v["choices"][0];
    assert_eq!(choice["text"], "129:");
    let lp = &choice["logprobs"];
    assert_eq!(lp["tokens"], serde_json::json!(["1", "2", "9", ":"]));
    assert_eq!(lp["text_offset"], serde_json::json!([0, 1, 2, 3]));
    let logprobs = lp["token_logprobs"].as_array().unwrap();
    assert!(logprobs[0].is_null() && lp["top_logprobs"][0].is_null());
    // 2 follows 1 as the model predicts; 9 after 2 is a surprise.
    assert!(logprobs[1].as_f64().unwrap() > -1e-3, "{lp}");
    assert!(logprobs[2].as_f64().unwrap() < -10.0, "{lp}");
    // The surprise's alternatives name what the model expected, and it.
    let top = lp["top_logprobs"][2].as_object().unwrap();
    assert!(top.contains_key("3") && top.contains_key("9"), "{top:?}");
    // Streamed: the echo (and its logprobs) first, then the tokens.
    let body =
        r#"{"prompt": [1, 2], "max_tokens": 2, "echo": true, "logprobs": 0, "stream": true}"#;
    let (status, body) = request(addr, "POST", "/v1/completions", body).await;
    assert_eq!(status, 200, "{body}");
    let chunks = chunks(&body);
    let first = &chunks[0]["choices"][0];
    assert_eq!(first["text"], "12");
    assert_eq!(first["logprobs"]["tokens"], serde_json::json!(["1", "2"]));
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, "1234");
}

#[tokio::test]
async fn logit_bias_steers_the_fake_model_and_bad_biases_are_400s() {
    let (addr, _s) = serve(engine_config(), 0).await;
    // The model's 50-logit pick loses to a token pushed up by 100.
    let body = r#"{"prompt": [1], "max_tokens": 2, "temperature": 0, "logit_bias": {"7": 100}}"#;
    let (status, body) = request(addr, "POST", "/v1/completions", body).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(json_of(&body)["choices"][0]["text"], "77");
    let cases = [
        (
            r#"{"prompt": [1], "logit_bias": {"7": 101}}"#,
            "between -100 and 100",
        ),
        (
            r#"{"prompt": [1], "logit_bias": {"99999": 1}}"#,
            "outside the vocabulary",
        ),
        (
            r#"{"prompt": [1], "logit_bias": {"a": 1}}"#,
            "not a token id",
        ),
    ];
    for (body, want) in cases {
        let (status, text) = request(addr, "POST", "/v1/completions", body).await;
        assert_eq!(status, 400, "{body}: {text}");
        let e = &json_of(&text)["error"];
        assert!(e["message"].as_str().unwrap().contains(want), "{text}");
        assert_eq!(e["param"], "logit_bias");
    }
}

#[tokio::test]
async fn continuous_usage_grows_chunk_by_chunk_to_the_final_usage() {
    let (addr, _s) = serve(engine_config(), 0).await;
    let opts = r#""stream": true, "stream_options": {"include_usage": true, "continuous_usage_stats": true}"#;
    let bodies = [
        (
            "/v1/completions",
            format!(r#"{{"prompt": [1, 2], "max_tokens": 4, "n": 2, {opts}}}"#),
        ),
        (
            "/v1/chat/completions",
            format!(
                r#"{{"messages": [{{"role": "user", "content": "x"}}], "max_tokens": 3, {opts}}}"#
            ),
        ),
    ];
    for (path, body) in bodies {
        let (status, text) = request(addr, "POST", path, &body).await;
        assert_eq!(status, 200, "{text}");
        let chunks = chunks(&text);
        let (last, choice_chunks) = chunks.split_last().unwrap();
        assert!(last["choices"].as_array().unwrap().is_empty(), "{last}");
        let final_usage = &last["usage"];
        let mut previous = 0;
        for c in choice_chunks {
            let u = &c["usage"];
            let completion = u["completion_tokens"].as_u64().unwrap();
            assert!(completion >= previous, "{path}: {text}");
            assert_eq!(u["prompt_tokens"], final_usage["prompt_tokens"], "{c}");
            assert_eq!(
                u["total_tokens"].as_u64().unwrap(),
                u["prompt_tokens"].as_u64().unwrap() + completion
            );
            previous = completion;
        }
        assert!(choice_chunks.len() > 2, "{text}");
        assert_eq!(
            &choice_chunks.last().unwrap()["usage"],
            final_usage,
            "{path}"
        );
        assert!(final_usage["completion_tokens"].as_u64().unwrap() > 1);
    }
    // Without include_usage it is off, as in vLLM.
    let body = r#"{"prompt": [1], "max_tokens": 2, "stream": true,
        "stream_options": {"continuous_usage_stats": true}}"#;
    let (status, text) = request(addr, "POST", "/v1/completions", body).await;
    assert_eq!(status, 200, "{text}");
    assert!(
        chunks(&text).iter().all(|c| c.get("usage").is_none()),
        "{text}"
    );
}

#[tokio::test]
async fn request_ids_name_the_answer_and_the_header_wins() {
    let (addr, _s) = serve(engine_config(), 0).await;
    let chat = |extra: &str| {
        format!(r#"{{"messages": [{{"role": "user", "content": "x"}}], "max_tokens": 2{extra}}}"#)
    };
    // (body, headers, expected id prefix of every chunk or the whole answer)
    type Headers<'a> = &'a [(&'a str, &'a str)];
    let cases: [(String, Headers, &str); 4] = [
        (chat(r#", "request_id": "abc-1""#), &[], "chatcmpl-abc-1"),
        (
            chat(r#", "request_id": "abc-1""#),
            &[("X-Request-Id", "hdr-2")],
            "chatcmpl-hdr-2",
        ),
        (
            chat(r#", "stream": true, "request_id": "s-3""#),
            &[],
            "chatcmpl-s-3",
        ),
        (chat(""), &[], "chatcmpl-"),
    ];
    for (body, headers, want) in cases {
        let (status, _, text) =
            request_with(addr, "POST", "/v1/chat/completions", headers, &body).await;
        assert_eq!(status, 200, "{text}");
        let ids: Vec<String> = if body.contains("stream") {
            chunks(&text)
                .iter()
                .map(|c| c["id"].as_str().unwrap().to_string())
                .collect()
        } else {
            vec![json_of(&text)["id"].as_str().unwrap().to_string()]
        };
        assert!(!ids.is_empty());
        for id in ids {
            if want == "chatcmpl-" {
                assert!(id.starts_with(want) && id.len() > want.len(), "{id}");
            } else {
                assert_eq!(id, want, "{body}");
            }
        }
    }
    let body = r#"{"prompt": [1], "max_tokens": 1, "request_id": "c-4"}"#;
    let (_, text) = request(addr, "POST", "/v1/completions", body).await;
    assert_eq!(json_of(&text)["id"], "cmpl-c-4");
    // A header that could split a log line is a 400 naming it.
    let (status, _, text) = request_with(
        addr,
        "POST",
        "/v1/completions",
        &[("X-Request-Id", "a\tb")],
        r#"{"prompt": [1], "max_tokens": 1}"#,
    )
    .await;
    assert_eq!(status, 400, "{text}");
    assert_eq!(json_of(&text)["error"]["param"], "X-Request-Id");
}
