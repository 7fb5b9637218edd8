//! Property tests over the whole request path: arbitrary JSON and arbitrary
//! numbers through parsing, preparation, submission, the worker and the
//! answer never panic, never give a 5xx, and leave no KV block leased.

use axum::body::Body;
use axum::http::Request;
use proptest::prelude::*;
use serde_json::{Map, Value, json};
use tower::ServiceExt;

use crate::fixtures::{engine_config, loaded_state};
use crate::load::config::HttpConfig;
use crate::openai::fields::{CHAT_FIELDS, COMPLETION_FIELDS};
use crate::serve::state::AppState;

/// Numbers at and past every boundary a field could wrap or truncate at.
fn wild_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
            .prop_map(Value::from),
        prop::sample::select(vec![
            json!(0),
            json!(1),
            json!(-1),
            json!(u64::MAX),
            json!(i64::MIN),
            json!(u32::MAX),
            json!(u64::from(u32::MAX) + 1),
            json!(usize::MAX / 2),
            json!(1e308),
            json!(-1e308),
            json!(1e-320),
            json!(-0.0),
            json!(2.0),
            json!(0.5),
        ]),
        (0u64..200).prop_map(Value::from),
    ]
}

/// Any JSON value, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        wild_number(),
        ".{0,12}".prop_map(Value::from),
        prop::sample::select(vec![
            "text",
            "user",
            "assistant",
            "system",
            "",
            "\u{0}",
            "日本"
        ])
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            prop::collection::btree_map("[a-z_]{0,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// An unsigned count: mostly small, sometimes anything a u64 holds.
fn count() -> BoxedStrategy<Value> {
    prop_oneof![
        3 => (0u64..40).prop_map(Value::from),
        1 => any::<u64>().prop_map(Value::from),
        1 => prop::sample::select(vec![u64::MAX, u64::from(u32::MAX) + 1, 1 << 53, 1 << 63])
            .prop_map(Value::from),
    ]
    .boxed()
}

/// A float knob: mostly in a plausible range, sometimes any finite number.
fn knob() -> BoxedStrategy<Value> {
    prop_oneof![
        3 => (-0.5f64..2.5).prop_map(Value::from),
        1 => any::<f64>()
            .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
            .prop_map(Value::from),
        1 => prop::sample::select(vec![0.0, 1.0, 2.0, 1e-45, 3.5e38, 1e39, -1e308])
            .prop_map(Value::from),
    ]
    .boxed()
}

/// Values of each field's own type (with numbers anywhere in its range),
/// now and then any JSON at all.
fn field_value(field: &'static str) -> BoxedStrategy<Value> {
    let token_ids = prop::collection::vec(
        prop_oneof![8 => 0u64..70, 1 => any::<u32>().prop_map(u64::from)],
        0..30,
    )
    .prop_map(|v| json!(v))
    .boxed();
    let typed: BoxedStrategy<Value> = match field {
        "prompt" => prop_oneof![
            3 => "[a-zA-Z ]{0,40}".prop_map(Value::from),
            3 => token_ids.clone(),
            1 => prop::collection::vec("[a-z]{0,8}", 0..3).prop_map(|v| json!(v)),
            1 => prop::collection::vec(token_ids.clone(), 0..3).prop_map(|v| json!(v)),
        ]
        .boxed(),
        "messages" => prop::collection::vec(
            (
                prop::sample::select(vec!["user", "system", "assistant", "tool"]),
                prop_oneof![
                    4 => ".{0,30}".prop_map(Value::from),
                    1 => Just(Value::Null),
                    1 => ".{0,10}".prop_map(|t| json!([{"type": "text", "text": t}])),
                    1 => Just(json!([{"type": "image_url"}])),
                ],
            )
                .prop_map(|(role, content)| json!({"role": role, "content": content})),
            0..4,
        )
        .prop_map(Value::from)
        .boxed(),
        "stop" => prop_oneof![
            ".{0,6}".prop_map(Value::from),
            prop::collection::vec(".{0,4}", 0..20).prop_map(|v| json!(v)),
            "x{250,260}".prop_map(|s| json!([s])),
        ]
        .boxed(),
        "stop_token_ids" => prop::collection::vec(any::<u32>(), 0..70)
            .prop_map(|v| json!(v))
            .boxed(),
        "stream" | "ignore_eos" | "echo" | "skip_special_tokens" => {
            any::<bool>().prop_map(Value::from).boxed()
        }
        "n" | "best_of" => prop_oneof![3 => Just(json!(1)), 1 => count()].boxed(),
        "logprobs" => prop_oneof![any::<bool>().prop_map(Value::from), count()].boxed(),
        "max_tokens" | "max_completion_tokens" | "top_logprobs" => count(),
        "seed" | "top_k" => prop_oneof![
            (-3i64..50).prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
        ]
        .boxed(),
        "model" => prop::sample::select(vec!["fake", "fake", "other"])
            .prop_map(Value::from)
            .boxed(),
        "user" | "suffix" => prop_oneof![Just(json!("")), ".{0,8}".prop_map(Value::from)].boxed(),
        "logit_bias" => prop_oneof![3 => Just(json!({})), 1 => Just(json!({"5": 1}))].boxed(),
        "response_format" => prop_oneof![Just(json!({"type": "text"})), any_json()].boxed(),
        "stream_options" => any::<bool>()
            .prop_map(|b| json!({"include_usage": b}))
            .boxed(),
        _ => knob(),
    };
    prop_oneof![12 => typed, 1 => any_json()].boxed()
}

/// A body for `fields`: an object of some of them (`required` more often
/// than not, now and then an unknown one), arbitrary JSON, or arbitrary bytes.
fn body(fields: Vec<&'static str>, required: &'static str) -> impl Strategy<Value = Vec<u8>> {
    let members: Vec<BoxedStrategy<Option<(String, Value)>>> = fields
        .into_iter()
        .map(|f| {
            let p = if f == required { 0.95 } else { 0.2 };
            prop::option::weighted(p, field_value(f).prop_map(move |v| (f.to_string(), v))).boxed()
        })
        .collect();
    let object =
        (members, prop::option::weighted(0.03, "[a-z]{1,8}")).prop_map(|(members, unknown)| {
            let mut m: Map<String, Value> = members.into_iter().flatten().collect();
            if let Some(k) = unknown {
                m.insert(k, Value::Null);
            }
            serde_json::to_vec(&Value::Object(m)).unwrap_or_default()
        });
    // Mostly valid but for the numbers: these reach the engine and the worker.
    let numeric = [
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "min_p",
        "repetition_penalty",
        "frequency_penalty",
        "presence_penalty",
    ];
    let numbers: Vec<BoxedStrategy<Option<(String, Value)>>> = numeric
        .into_iter()
        .map(|f| {
            prop::option::weighted(0.3, field_value(f).prop_map(move |v| (f.to_string(), v)))
                .boxed()
        })
        .collect();
    let valid = prop_oneof![
        (0u32..60).prop_map(|t| json!({"prompt": [t, t + 1]})),
        "[a-z ]{1,30}".prop_map(|t| json!({"prompt": t})),
        ".{0,30}".prop_map(|t| json!({"messages": [{"role": "user", "content": t}]})),
    ];
    let near_valid = (valid, numbers, any::<bool>()).prop_map(move |(base, numbers, stream)| {
        let mut m = base.as_object().cloned().unwrap_or_default();
        m.extend(numbers.into_iter().flatten());
        m.insert("stream".into(), Value::from(stream));
        // A chat body on the completion route and the reverse are refused,
        // as they should be; keep the body on its own route.
        if (required == "prompt") != m.contains_key("prompt") {
            m.remove("prompt");
            m.remove("messages");
            m.insert(
                required.into(),
                if required == "prompt" {
                    json!([1])
                } else {
                    json!([{"role": "user", "content": "x"}])
                },
            );
        }
        serde_json::to_vec(&Value::Object(m)).unwrap_or_default()
    });
    prop_oneof![
        16 => near_valid,
        16 => object,
        1 => any_json().prop_map(|v| serde_json::to_vec(&v).unwrap_or_default()),
        1 => prop::collection::vec(any::<u8>(), 0..64),
    ]
}

fn fields(extra: &[&'static str]) -> Vec<&'static str> {
    crate::openai::fields::COMMON_FIELDS
        .iter()
        .chain(extra)
        .copied()
        .collect()
}

/// Sends one request through the router; returns the status and the body.
async fn call(state: &AppState, path: &str, body: Vec<u8>) -> (u16, String) {
    let req = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap_or_default();
    let response = crate::serve::app::router(state.clone())
        .oneshot(req)
        .await
        .unwrap_or_else(|e| match e {});
    let status = response.status().as_u16();
    let read = axum::body::to_bytes(response.into_body(), 1 << 24);
    let bytes = tokio::time::timeout(std::time::Duration::from_secs(20), read)
        .await
        .expect("an answer that never ends")
        .expect("a readable body");
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

fn check(state: &AppState, rt: &tokio::runtime::Runtime, path: &str, body: Vec<u8>) {
    let shown = String::from_utf8_lossy(&body).into_owned();
    let (status, text) = rt.block_on(call(state, path, body));
    assert!(
        status == 200 || (400..500).contains(&status),
        "{path} {shown}: {status} {text}"
    );
    // A stream's status is sent before the worker runs: its errors are events.
    assert!(!text.contains("server_error"), "{path} {shown}: {text}");
    let engine = &state.loaded().expect("loaded").engine;
    for _ in 0..200 {
        if engine.in_flight() == 0 && engine.metrics().kv_used() == 0 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    panic!("{path} {shown}: a request or its blocks outlived the answer");
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime")
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 300,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn any_completion_body_is_answered_or_refused_with_a_4xx(
        body in body(fields(&COMPLETION_FIELDS), "prompt")
    ) {
        thread_local! {
            static RIG: (AppState, tokio::runtime::Runtime) =
                (loaded_state(engine_config(), 0, &HttpConfig::default()), runtime());
        }
        RIG.with(|(state, rt)| check(state, rt, "/v1/completions", body));
    }

    #[test]
    fn any_chat_body_is_answered_or_refused_with_a_4xx(
        body in body(fields(&CHAT_FIELDS), "messages")
    ) {
        thread_local! {
            static RIG: (AppState, tokio::runtime::Runtime) =
                (loaded_state(engine_config(), 0, &HttpConfig::default()), runtime());
        }
        RIG.with(|(state, rt)| check(state, rt, "/v1/chat/completions", body));
    }
}
