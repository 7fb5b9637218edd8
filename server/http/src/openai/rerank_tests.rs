use super::*;

use crate::fixtures::FakeFrontend;

fn model() -> EmbeddingModel {
    EmbeddingModel {
        name: "rr".into(),
        vocab: 100,
        max_model_len: 10,
        dim: 1,
        normalize: false,
        matryoshka: None,
        prompts: Default::default(),
    }
}

fn rerank(body: serde_json::Value) -> Result<(PreparedPairs, RerankOptions), ApiError> {
    prepare_rerank(
        serde_json::from_value(body).unwrap(),
        &FakeFrontend,
        &model(),
    )
}

#[test]
fn rerank_pairs_the_query_with_each_document_in_either_shape() {
    let (p, o) =
        rerank(serde_json::json!({"query": "ab", "documents": ["c", {"text": "de"}]})).unwrap();
    let lens: Vec<usize> = p.inputs.iter().map(Vec::len).collect();
    assert_eq!(lens, vec![3, 4]);
    assert_eq!(p.token_types, vec![vec![0, 0, 1], vec![0, 0, 1, 1]]);
    assert_eq!(o.documents, Some(vec!["c".to_string(), "de".to_string()]));
    assert_eq!(o.top_n, None);
}

#[test]
fn bad_rerank_requests_are_400s_naming_the_field() {
    let cases = [
        (
            serde_json::json!({"query": "a", "documents": []}),
            "documents",
            "empty",
        ),
        (serde_json::json!({"query": "a"}), "documents", "required"),
        (serde_json::json!({"documents": ["a"]}), "query", "required"),
        (
            serde_json::json!({"query": "a", "documents": ["b"], "top_n": -1}),
            "top_n",
            "-1",
        ),
        (
            serde_json::json!({"query": "a", "documents": ["", "b"]}),
            "documents",
            "pair 0",
        ),
        (
            serde_json::json!({"query": "abcdef", "documents": ["b", "ghijk"]}),
            "documents",
            "pair 1 has 11 tokens",
        ),
    ];
    for (body, field, says) in cases {
        let e = rerank(body.clone()).err().unwrap();
        let shown = format!("{e:?}");
        assert!(
            shown.contains(field) && shown.contains(says),
            "{body}: {shown}"
        );
    }
    let other = rerank(serde_json::json!({"model": "x", "query": "a", "documents": ["b"]}));
    assert!(matches!(other, Err(ApiError::UnknownModel(m)) if m == "x"));
}

#[test]
fn results_are_best_first_cut_to_top_n_with_their_documents() {
    let docs = vec!["a".to_string(), "b".into(), "c".into()];
    let o = RerankOptions {
        top_n: Some(2),
        documents: Some(docs),
    };
    let got = rank(&[0.1, 0.9, 0.5], &o);
    let seen: Vec<(usize, f32, Option<&str>)> = (got.iter())
        .map(|r| {
            (
                r.index,
                r.relevance_score,
                r.document.as_ref().map(|d| d.text.as_str()),
            )
        })
        .collect();
    assert_eq!(seen, vec![(1, 0.9, Some("b")), (2, 0.5, Some("c"))]);
    let all = rank(
        &[0.3, 0.3],
        &RerankOptions {
            top_n: Some(5),
            documents: None,
        },
    );
    assert_eq!((all[0].index, all[1].index), (0, 1));
    assert!(all.iter().all(|r| r.document.is_none()));
}

#[test]
fn score_pairs_one_text_with_many_or_many_with_as_many() {
    let score = |body: serde_json::Value| {
        prepare_score(
            serde_json::from_value(body).unwrap(),
            &FakeFrontend,
            &model(),
        )
    };
    let p = score(serde_json::json!({"text_1": "a", "text_2": ["bb", "c"]})).unwrap();
    let lens: Vec<usize> = p.inputs.iter().map(Vec::len).collect();
    assert_eq!(lens, vec![3, 2]);
    let p = score(serde_json::json!({"text_1": ["a", "bb"], "text_2": ["c", "d"]})).unwrap();
    assert_eq!(p.token_types, vec![vec![0, 1], vec![0, 0, 1]]);
    let p = score(serde_json::json!({"text_1": "a", "text_2": "b"})).unwrap();
    assert_eq!(p.inputs.len(), 1);
    for (body, says) in [
        (
            serde_json::json!({"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}),
            "text_1 has 2 texts and text_2 3",
        ),
        (
            serde_json::json!({"text_1": "a", "text_2": []}),
            "text_2 is empty",
        ),
        (serde_json::json!({"text_2": "a"}), "text_1 is required"),
    ] {
        let e = score(body.clone()).err().unwrap();
        assert!(format!("{e:?}").contains(says), "{body}: {e:?}");
    }
}
