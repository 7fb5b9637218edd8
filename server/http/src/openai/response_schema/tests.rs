use serde::de::DeserializeOwned;

use super::*;
use crate::fixtures::{engine_config, request, serve};

/// Parses `body` as `T` (unknown fields refused): the schema covers it.
fn parses<T: DeserializeOwned>(body: &str) -> Result<(), String> {
    serde_json::from_str::<T>(body)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Every `data:` event but `[DONE]` parses as `T`; there is at least one.
fn events<T: DeserializeOwned>(body: &str) -> Result<(), String> {
    let data: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .collect();
    if data.is_empty() {
        return Err(format!("no events in {body}"));
    }
    data.into_iter().try_for_each(parses::<T>)
}

type Check = fn(&str) -> Result<(), String>;

/// The real bodies of every JSON route, in every shape they take, read back
/// through the schema types.
#[tokio::test]
async fn every_real_body_is_what_the_schema_says() {
    let (addr, _s) = serve(engine_config(), 0).await;
    let chat = r#""messages": [{"role": "user", "content": "hi"}], "max_tokens": 3"#;
    let cases: Vec<(&str, &str, String, Check)> = vec![
        (
            "POST",
            "/v1/completions",
            r#"{"prompt": "AB", "max_tokens": 3, "n": 2}"#.into(),
            parses::<CompletionResponse>,
        ),
        (
            "POST",
            "/v1/completions",
            r#"{"prompt": "AB", "max_tokens": 2, "echo": true, "logprobs": 2}"#.into(),
            parses::<CompletionResponse>,
        ),
        (
            "POST",
            "/v1/completions",
            r#"{"prompt": "AB", "max_tokens": 3, "stream": true, "logprobs": 1,
                "stream_options": {"include_usage": true}}"#
                .into(),
            events::<CompletionChunk>,
        ),
        (
            "POST",
            "/v1/chat/completions",
            format!(r#"{{{chat}, "logprobs": true, "top_logprobs": 2}}"#),
            parses::<ChatCompletionResponse>,
        ),
        (
            "POST",
            "/v1/chat/completions",
            format!(
                r#"{{{chat}, "stream": true, "n": 2, "logprobs": true,
                    "stream_options": {{"include_usage": true}}}}"#
            ),
            events::<ChatCompletionChunk>,
        ),
        ("GET", "/v1/models", String::new(), parses::<ModelList>),
        (
            "GET",
            "/tokenizer_info",
            String::new(),
            parses::<TokenizerInfo>,
        ),
        (
            "POST",
            "/tokenize",
            r#"{"prompt": "AB", "return_token_strs": true}"#.into(),
            parses::<TokenizeResponse>,
        ),
        (
            "POST",
            "/tokenize",
            r#"{"messages": [{"role": "user", "content": "hi"}]}"#.into(),
            parses::<TokenizeResponse>,
        ),
        (
            "POST",
            "/detokenize",
            r#"{"tokens": [1, 2]}"#.into(),
            parses::<DetokenizeResponse>,
        ),
    ];
    for (method, path, body, check) in cases {
        let (status, text) = request(addr, method, path, &body).await;
        assert_eq!(status, 200, "{method} {path} {body}: {text}");
        if let Err(e) = check(&text) {
            panic!("{method} {path} {body}: {e}\n{text}");
        }
    }
}

/// Logprob maps keep the order they were made in (most likely first), and
/// their numbers print as the f32 widened, as the bodies always have.
#[test]
fn ranked_maps_keep_their_order_and_numbers() {
    let mut m: Ranked<f64> = [("b".to_string(), 1.0), ("a".to_string(), 2.0)]
        .into_iter()
        .collect();
    m.insert("b".into(), 3.0);
    m.insert_new("a".into(), 4.0);
    m.insert_new("c".into(), f64::from(-0.1f32));
    assert_eq!(
        serde_json::to_string(&m).unwrap(),
        r#"{"b":3.0,"a":2.0,"c":-0.10000000149011612}"#
    );
}
