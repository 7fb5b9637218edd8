use std::collections::BTreeSet;

use serde::Serialize;

use super::*;
use crate::openai::chat_request::{ChatRequest, Message};
use crate::openai::request::CompletionRequest;
use crate::openai::tokenize::{DetokenizeRequest, TokenizeRequest};

/// The keys a type parses: every field of its default, serialized.
fn parsed<T: Serialize + Default>() -> BTreeSet<String> {
    let v = serde_json::to_value(T::default()).unwrap();
    v.as_object().unwrap().keys().cloned().collect()
}

fn listed(lists: &[&[&str]]) -> BTreeSet<String> {
    lists
        .iter()
        .flat_map(|l| l.iter().map(|s| s.to_string()))
        .collect()
}

#[test]
fn the_lists_are_exactly_what_the_types_parse() {
    assert_eq!(
        parsed::<CompletionRequest>(),
        listed(&[&COMMON_FIELDS, &COMPLETION_FIELDS])
    );
    assert_eq!(
        parsed::<ChatRequest>(),
        listed(&[&COMMON_FIELDS, &CHAT_FIELDS])
    );
    assert_eq!(parsed::<Message>(), listed(&[&MESSAGE_FIELDS]));
    assert_eq!(parsed::<TokenizeRequest>(), listed(&[&TOKENIZE_FIELDS]));
    assert_eq!(parsed::<DetokenizeRequest>(), listed(&[&DETOKENIZE_FIELDS]));
    assert_eq!(
        parsed::<crate::openai::embeddings::EmbeddingRequest>(),
        listed(&[&EMBEDDING_FIELDS])
    );
    assert_eq!(
        parsed::<crate::openai::rerank::RerankRequest>(),
        listed(&[&RERANK_FIELDS])
    );
    assert_eq!(
        parsed::<crate::openai::rerank::ScoreRequest>(),
        listed(&[&SCORE_FIELDS])
    );
    assert_eq!(
        parsed::<crate::openai::responses::request::ResponsesRequest>(),
        listed(&[&RESPONSES_FIELDS])
    );
    let all = listed(&[&COMMON_FIELDS, &COMPLETION_FIELDS, &CHAT_FIELDS]);
    let ignored = listed(&[&IGNORED_FIELDS]);
    assert!(
        all.is_disjoint(&ignored),
        "{:?}",
        all.intersection(&ignored)
    );
    let message_ignored = listed(&[&IGNORED_MESSAGE_FIELDS]);
    assert!(listed(&[&MESSAGE_FIELDS]).is_disjoint(&message_ignored));
}

#[test]
fn ignored_and_null_fields_are_dropped_others_refused() {
    // (body, Ok(fields left) or Err(fragment of the error))
    let cases: [(&str, Result<&[&str], &str>); 6] = [
        (
            r#"{"prompt": "a", "user": "u", "store": false, "metadata": {"k": "v"},
                "service_tier": "auto"}"#,
            Ok(&["prompt"]),
        ),
        (
            r#"{"prompt": "a", "guided_json": null, "n": null}"#,
            Ok(&["prompt"]),
        ),
        (r#"{"prompt": "a", "frobnicate": 1}"#, Err("`frobnicate`")),
        (r#"{"prompt": "a", "messages": []}"#, Err("`messages`")),
        (
            r#"{"messages": [{"role": "assistant", "content": "x", "refusal": null,
                "annotations": [], "audio": {"id": "a"}}]}"#,
            Ok(&["messages"]),
        ),
        (
            r#"{"messages": [{"role": "user", "content": "x", "weight": 1}]}"#,
            Err("`messages[0].weight`"),
        ),
    ];
    for (body, want) in cases {
        let extra: &[&str] = if body.contains("\"messages\": [{") {
            &CHAT_FIELDS
        } else {
            &COMPLETION_FIELDS
        };
        let got = parse::<Value>(body.as_bytes(), extra);
        match (got, want) {
            (Ok(v), Ok(keys)) => {
                let got: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
                assert_eq!(got, keys, "{body}");
                if let Some(m) = v["messages"].get(0) {
                    assert_eq!(m.as_object().unwrap().len(), 2, "{m}");
                }
            }
            (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{body}: {e}"),
            (g, w) => panic!("{body}: {g:?} vs {w:?}"),
        }
    }
}
