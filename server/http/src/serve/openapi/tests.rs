use std::collections::BTreeSet;

use serde_json::Value;

use super::*;
use crate::fixtures::{engine_config, request_with, serve_with};
use crate::load::config::HttpConfig;

/// (method, path) of every operation in `doc`; a method this server never
/// routes is reported as itself, so that it shows up in the comparison.
fn operations(doc: &utoipa::openapi::OpenApi) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (path, item) in &doc.paths.paths {
        let methods = [
            ("GET", item.get.is_some()),
            ("POST", item.post.is_some()),
            ("PUT", item.put.is_some()),
            ("DELETE", item.delete.is_some()),
            ("PATCH", item.patch.is_some()),
            ("HEAD", item.head.is_some()),
            ("OPTIONS", item.options.is_some()),
        ];
        for (m, present) in methods {
            if present {
                out.insert((m.to_string(), path.clone()));
            }
        }
    }
    out
}

fn verb_name(v: Verb) -> &'static str {
    match v {
        Verb::Get => "GET",
        Verb::Post => "POST",
    }
}

#[test]
fn the_document_has_every_route_of_the_table_and_no_other() {
    let routed: BTreeSet<(String, String)> = routes::table()
        .iter()
        .map(|r| (verb_name(r.verb).to_string(), r.path.to_string()))
        .collect();
    let documented = operations(&document(false));
    let missing: Vec<_> = routed.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&routed).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "routed but not documented: {missing:?}; documented but not routed: {extra:?}"
    );
}

#[test]
fn every_operation_has_its_body_and_answers() {
    let doc = serde_json::to_value(document(false)).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    for r in routes::table() {
        let op = &doc["paths"][r.path][verb_name(r.verb).to_lowercase()];
        let ok = &op["responses"]["200"]["content"];
        assert!(
            ok.as_object().is_some_and(|c| !c.is_empty()),
            "{}: no 200 content",
            r.path
        );
        let body = &op["requestBody"]["content"]["application/json"]["schema"]["$ref"];
        assert_eq!(body.is_string(), r.verb == Verb::Post, "{}: {op}", r.path);
        if r.access == Access::Keyed {
            let errors = op["responses"]
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(code, _)| code.starts_with('4') || code.starts_with('5'));
            for (code, e) in errors {
                let schema = &e["content"]["application/json"]["schema"]["$ref"];
                assert_eq!(
                    schema, "#/components/schemas/ErrorBody",
                    "{} {code}",
                    r.path
                );
            }
        }
    }
    let schemas = &doc["components"]["schemas"];
    for chunk in ["CompletionChunk", "ChatCompletionChunk"] {
        assert!(schemas[chunk].is_object(), "{chunk} missing");
    }
}

#[test]
fn the_bearer_scheme_is_in_the_document_exactly_when_keys_are() {
    for keyed in [false, true] {
        let doc: Value = serde_json::from_str(&json(keyed)).unwrap();
        let scheme = &doc["components"]["securitySchemes"][BEARER];
        assert_eq!(scheme.is_object(), keyed, "{scheme}");
        if keyed {
            assert_eq!(
                (scheme["type"].as_str(), scheme["scheme"].as_str()),
                (Some("http"), Some("bearer"))
            );
        }
        for r in routes::table() {
            let op = &doc["paths"][r.path][verb_name(r.verb).to_lowercase()];
            let wants_key = keyed && r.access == Access::Keyed;
            let want = if wants_key {
                serde_json::json!([{ BEARER: [] }])
            } else {
                Value::Null
            };
            assert_eq!(op["security"], want, "{} keyed={keyed}", r.path);
        }
    }
}

/// The document's security is what the router enforces: with keys, every
/// route the document marks needs one and every other answers without.
#[tokio::test]
async fn the_document_is_public_and_its_security_matches_the_router() {
    let http = HttpConfig {
        api_keys: vec!["sk-a".into()],
        ..HttpConfig::default()
    };
    let (addr, _s) = serve_with(engine_config(), 0, &http).await;
    let (status, head, text) = request_with(addr, "GET", "/openapi.json", &[], "").await;
    assert_eq!(status, 200, "{text}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{head}"
    );
    let doc: Value = serde_json::from_str(&text).unwrap();
    for r in routes::table() {
        let method = verb_name(r.verb);
        let secured = doc["paths"][r.path][method.to_lowercase()]["security"].is_array();
        let sent = if r.verb == Verb::Post { "{}" } else { "" };
        let (status, _, text) = request_with(addr, method, r.path, &[], sent).await;
        assert_eq!(
            status == 401,
            secured,
            "{method} {}: {status} {text}",
            r.path
        );
    }
}
