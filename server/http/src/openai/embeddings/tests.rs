//! The request's checks (a table of bad inputs, each a 400 naming its
//! field) and the route over a fake pooling engine: shapes, batching,
//! base64, dimensions, and a task mismatch either way.

use serde_json::{Value, json};

use super::*;
use crate::fixtures::{FakeFrontend, engine_config, pooling_state, request, serve, serve_state};

fn model(matryoshka: Option<Vec<usize>>) -> EmbeddingModel {
    EmbeddingModel {
        name: "fake".into(),
        vocab: 64,
        max_model_len: 8,
        dim: 4,
        normalize: true,
        matryoshka,
        prompts: Prompts::default(),
    }
}

fn prepared(body: Value, m: &EmbeddingModel) -> Result<PreparedEmbedding, ApiError> {
    prepare(serde_json::from_value(body).unwrap(), &FakeFrontend, m)
}

#[test]
fn bad_inputs_are_refused_with_their_reason() {
    let cases: Vec<(Value, &str, &str)> = vec![
        (json!({}), "input", "input is required"),
        (json!({"input": []}), "input", "the input is empty"),
        (json!({"input": ""}), "input", "input 0 is an empty string"),
        (
            json!({"input": ["a", ""]}),
            "input",
            "input 1 is an empty string",
        ),
        (
            json!({"input": [[1], []]}),
            "input",
            "input 1 has no tokens",
        ),
        (
            json!({"input": "abcdefghi"}),
            "input",
            "9 tokens, more than the model's 8",
        ),
        (
            json!({"input": [1, 64]}),
            "input",
            "token id 64 is outside the model's vocabulary of 64",
        ),
        (
            json!({"input": "a", "dimensions": 2}),
            "dimensions",
            "not trained for Matryoshka",
        ),
        (
            json!({"input": "a", "encoding_format": "int8"}),
            "encoding_format",
            "float or base64",
        ),
        (
            json!({"input": "a", "truncate_prompt_tokens": 0}),
            "truncate_prompt_tokens",
            "-1 or at least 1",
        ),
        (
            json!({"input": "a", "model": "other"}),
            "",
            "does not exist",
        ),
    ];
    for (body, param, want) in cases {
        let e = prepared(body.clone(), &model(None)).unwrap_err();
        assert!(e.to_string().contains(want), "{body}: {e}");
        if let ApiError::Invalid { param: p, .. } = &e {
            assert_eq!(p.as_deref(), Some(param), "{body}");
        }
    }
}

#[test]
fn inputs_in_every_form_become_token_lists() {
    let m = model(Some(vec![2]));
    let cases: Vec<(Value, Vec<Vec<u32>>)> = vec![
        (json!({"input": "AB"}), vec![vec![1, 2]]),
        (json!({"input": ["AB", "C"]}), vec![vec![1, 2], vec![3]]),
        (json!({"input": [5, 6]}), vec![vec![5, 6]]),
        (json!({"input": [[5], [6, 7]]}), vec![vec![5], vec![6, 7]]),
        // Truncated: text keeps its start, ids their end.
        (
            json!({"input": "ABCDEFGHIJ", "truncate_prompt_tokens": 3}),
            vec![vec![1, 2, 3]],
        ),
        (
            json!({"input": [1, 2, 3, 4], "truncate_prompt_tokens": 2}),
            vec![vec![3, 4]],
        ),
        (
            json!({"input": "ABCDEFGHIJ", "truncate_prompt_tokens": -1}),
            vec![(1..=8).collect()],
        ),
    ];
    for (body, want) in cases {
        assert_eq!(prepared(body.clone(), &m).unwrap().inputs, want, "{body}");
    }
    let p = prepared(
        json!({"input": "A", "dimensions": 2, "normalize": false}),
        &m,
    )
    .unwrap();
    assert_eq!(p.finish.dimensions, Some(2));
    assert!(!p.finish.normalize);
    assert!(prepared(json!({"input": "A", "dimensions": 3}), &m).is_err());
    assert!(prepared(json!({"input": "A", "dimensions": 5}), &model(Some(vec![]))).is_err());
}

#[test]
fn a_prompt_goes_before_each_text_and_an_unknown_one_is_named_with_the_known() {
    let mut m = model(None);
    let st = r#"{"prompts": {"query": "C", "doc": "D"}, "default_prompt_name": "doc"}"#;
    m.prompts = Prompts::parse(st, true).unwrap();
    // "A" is 1, "B" 2, "C" 3, "D" 4; the prompt is tokenized with the text
    // and cut with it.
    let cases: Vec<(Value, Vec<Vec<u32>>)> = vec![
        (
            json!({"input": ["AB", "A"], "prompt_name": "query"}),
            vec![vec![3, 1, 2], vec![3, 1]],
        ),
        (json!({"input": "A"}), vec![vec![4, 1]]),
        (
            json!({"input": "AB", "prompt_name": "query", "truncate_prompt_tokens": 2}),
            vec![vec![3, 1]],
        ),
        // Token ids are as given: no default prompt.
        (json!({"input": [1, 2]}), vec![vec![1, 2]]),
    ];
    for (body, want) in cases {
        assert_eq!(prepared(body.clone(), &m).unwrap().inputs, want, "{body}");
    }
    let refused = [
        (
            json!({"input": "A", "prompt_name": "passage"}),
            &m,
            "(doc, query)",
        ),
        (
            json!({"input": [1], "prompt_name": "query"}),
            &m,
            "not token ids",
        ),
        (
            json!({"input": "A", "prompt_name": "query"}),
            &model(None),
            "names no prompts",
        ),
    ];
    for (body, m, want) in refused {
        let e = prepared(body.clone(), m).unwrap_err();
        assert!(e.to_string().contains(want), "{body}: {e}");
        let ApiError::Invalid { param, .. } = &e else {
            panic!("{e:?}")
        };
        assert_eq!(param.as_deref(), Some("prompt_name"));
    }
}

fn json_of(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[tokio::test]
async fn the_route_answers_in_openai_shape_batched_as_alone() {
    let addr = serve_state(pooling_state(16, Some(vec![2])), &Default::default()).await;
    // "AB" is [1, 2]: the fake vector [2, 3, 1, 1].
    let body = json!({"input": ["AB", "C", "ABCDEFGH"], "normalize": false}).to_string();
    let (status, body) = request(addr, "POST", "/v1/embeddings", &body).await;
    assert_eq!(status, 200, "{body}");
    let v = json_of(&body);
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], "fake");
    assert_eq!(v["usage"]["prompt_tokens"], 11);
    assert_eq!(v["usage"]["total_tokens"], 11);
    let want = [
        [2.0, 3.0, 1.0, 1.0],
        [1.0, 3.0, 1.0, 1.0],
        [8.0, 36.0, 1.0, 1.0],
    ];
    for (i, w) in want.iter().enumerate() {
        assert_eq!(v["data"][i]["object"], "embedding");
        assert_eq!(v["data"][i]["index"], i);
        assert_eq!(v["data"][i]["embedding"], json!(w), "{i}");
    }
    // Normalized by default, cut to 2 and renormalized, base64.
    let body = json!({"input": "AB", "dimensions": 2, "encoding_format": "base64"}).to_string();
    let (status, body) = request(addr, "POST", "/v1/embeddings", &body).await;
    assert_eq!(status, 200, "{body}");
    let (a, b) = (2.0f32 / 13f32.sqrt(), 3.0f32 / 13f32.sqrt());
    let bytes: Vec<u8> = [a, b].iter().flat_map(|x| x.to_le_bytes()).collect();
    let want = crate::openai::embedding_response::base64(&bytes);
    assert_eq!(json_of(&body)["data"][0]["embedding"], want);
    // More inputs than one batch holds (16 tokens): answered over several.
    let many: Vec<&str> = vec!["ABCDEFGH"; 5];
    let (status, body) = request(
        addr,
        "POST",
        "/v1/embeddings",
        &json!({"input": many}).to_string(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(json_of(&body)["data"].as_array().unwrap().len(), 5);
}

#[tokio::test]
async fn a_bad_request_is_a_400_and_the_server_goes_on() {
    let addr = serve_state(pooling_state(16, None), &Default::default()).await;
    for body in [
        json!({"input": ""}),
        json!({"input": [1, 99]}),
        json!({"input": "ABCDEFGHIJKLMNOPQ"}),
        json!({"input": "AB", "dimensions": 2}),
        json!({"input": "AB", "bogus": 1}),
    ] {
        let (status, out) = request(addr, "POST", "/v1/embeddings", &body.to_string()).await;
        assert_eq!(status, 400, "{body}: {out}");
        assert_eq!(
            json_of(&out)["error"]["type"],
            "invalid_request_error",
            "{out}"
        );
    }
    let (status, body) = request(addr, "POST", "/v1/embeddings", r#"{"input": "AB"}"#).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn each_model_refuses_the_other_task_naming_its_own() {
    let addr = serve_state(pooling_state(16, None), &Default::default()).await;
    let (status, body) = request(addr, "POST", "/v1/completions", r#"{"prompt": "AB"}"#).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("task embed") && body.contains("/v1/embeddings"),
        "{body}"
    );
    let (status, body) = request(addr, "GET", "/v1/models", "").await;
    assert_eq!(status, 200);
    assert_eq!(json_of(&body)["data"][0]["task"], "embed");
    let (generating, _s) = serve(engine_config(), 0).await;
    let (status, body) = request(generating, "POST", "/v1/embeddings", r#"{"input": "AB"}"#).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("task generate") && body.contains("/v1/completions"),
        "{body}"
    );
    let (_, body) = request(generating, "GET", "/v1/models", "").await;
    assert_eq!(json_of(&body)["data"][0]["task"], "generate");
}
