//! Every embedding fixture (tiny random models written by
//! sentence-transformers, `testdata/embeddings/`) against the vectors
//! sentence-transformers gave for the same texts: pooled as the model's own
//! files say, each text alone and all of them in one batch of mixed
//! lengths, within cosine 0.99999 and 1e-4 an element.

use std::path::PathBuf;

use candle_core::Device;
use serde::Deserialize;

use crate::pooling::{PoolingMethod, normalize};
use crate::{Embedder, Source};

/// The fixtures (a directory, or a GGUF file in one: llama.cpp's
/// converter's), the reference each is checked against, and how it pools.
const FIXTURES: [(&str, &str, PoolingMethod, bool); 12] = [
    ("bert", "bert", PoolingMethod::Cls, true),
    ("bert/model.gguf", "bert", PoolingMethod::Cls, true),
    ("bert_mean", "bert_mean", PoolingMethod::Mean, false),
    ("qwen3_embed", "qwen3_embed", PoolingMethod::Last, true),
    ("xlmr", "xlmr", PoolingMethod::Mean, true),
    ("xlmr/model.gguf", "xlmr", PoolingMethod::Mean, true),
    ("nomic", "nomic", PoolingMethod::Mean, true),
    ("nomic/model.gguf", "nomic", PoolingMethod::Mean, true),
    ("modernbert", "modernbert", PoolingMethod::Cls, true),
    (
        "modernbert/model.gguf",
        "modernbert",
        PoolingMethod::Cls,
        true,
    ),
    (
        "embeddinggemma",
        "embeddinggemma",
        PoolingMethod::Mean,
        true,
    ),
    (
        "embeddinggemma/model.gguf",
        "embeddinggemma",
        PoolingMethod::Mean,
        true,
    ),
];

#[derive(Deserialize)]
struct Reference {
    texts: Vec<String>,
    tokens: Vec<Vec<u32>>,
    embeddings: Vec<Vec<f32>>,
    raw: Vec<Vec<f32>>,
    /// Each prompt's tokens and vectors, with it before each text.
    #[serde(default)]
    prompts: std::collections::BTreeMap<String, Prompted>,
}

#[derive(Deserialize)]
struct Prompted {
    tokens: Vec<Vec<u32>>,
    embeddings: Vec<Vec<f32>>,
}

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/embeddings")
        .join(name)
}

fn reference(name: &str) -> Reference {
    let text = std::fs::read_to_string(dir(name).join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn embedder(name: &str) -> Embedder {
    let mut src = Source::open(&dir(name)).unwrap();
    let pooling = src.pooling_files().unwrap().pooling.unwrap();
    src.embedder(&Device::Cpu, pooling).unwrap()
}

/// Asserts `got` is `want` within the aims' bounds.
pub(crate) fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: width");
    let dot: f32 = got.iter().zip(want).map(|(a, b)| a * b).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    let cos = dot / (norm(got) * norm(want));
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(
        cos >= 0.99999 && worst <= 1e-4,
        "{what}: cosine {cos}, worst {worst}"
    );
}

#[test]
fn every_fixture_pools_as_its_files_say() {
    for (name, _, method, norm) in FIXTURES {
        let p = Source::open(&dir(name)).unwrap().pooling_files().unwrap();
        let p = p.pooling.unwrap();
        assert_eq!((p.method, p.normalize), (method, norm), "{name}");
    }
}

#[test]
fn every_fixture_matches_sentence_transformers_alone_and_batched() {
    for (name, refname, _, norm) in FIXTURES {
        let r = reference(refname);
        let m = embedder(name);
        assert!(m.decoder().kv_groups().is_empty(), "{name} keeps no KV");
        let text = Source::open(&dir(name)).unwrap().text().unwrap();
        let seqs: Vec<&[u32]> = r.tokens.iter().map(Vec::as_slice).collect();
        let batched = m.vectors(&seqs).unwrap();
        for (i, ids) in r.tokens.iter().enumerate() {
            let tokens = text.tokenizer.encode(&r.texts[i], true).unwrap();
            assert_eq!(&tokens, ids, "{name} text {i}: our tokenizer");
            let alone = m.vectors(&[ids]).unwrap().remove(0);
            assert_close(&format!("{name} text {i} raw"), &alone, &r.raw[i]);
            assert_close(&format!("{name} text {i} batched"), &batched[i], &r.raw[i]);
            let mut out = alone.clone();
            if norm {
                normalize(&mut out);
            }
            assert_close(&format!("{name} text {i}"), &out, &r.embeddings[i]);
        }
    }
}

/// EmbeddingGemma's way: bidirectional attention within a sliding window
/// shorter than the texts, its two Dense modules after the mean (the
/// vector's width is theirs), and its prompts before the text, tokenized
/// with it as sentence-transformers does; from its folder and from the
/// GGUF llama.cpp's converter writes of it.
#[test]
fn embedding_gemma_attends_both_ways_and_runs_its_dense_modules_and_prompts() {
    let r = reference("embeddinggemma");
    assert!(!r.prompts.is_empty());
    for name in ["embeddinggemma", "embeddinggemma/model.gguf"] {
        let src = Source::open(&dir(name)).unwrap();
        let files = src.pooling_files().unwrap();
        assert_eq!(files.dense.len(), 2, "{name}: Dense modules");
        let m = embedder(name);
        assert_eq!(m.dim(), r.embeddings[0].len(), "{name}");
        let text = src.text().unwrap();
        for (prompt, want) in &r.prompts {
            // The GGUF carries no prompts: they are the folder's.
            let before = Source::open(&dir("embeddinggemma")).unwrap();
            let before = before.pooling_files().unwrap().prompts;
            let before = before.text(Some(prompt)).unwrap().unwrap();
            let seqs: Vec<&[u32]> = want.tokens.iter().map(Vec::as_slice).collect();
            let batched = m.vectors(&seqs).unwrap();
            for (i, t) in r.texts.iter().enumerate() {
                let ids = text
                    .tokenizer
                    .encode(&format!("{before}{t}"), true)
                    .unwrap();
                assert_eq!(ids, want.tokens[i], "{name} {prompt} {i}: our tokenizer");
                let mut got = batched[i].clone();
                normalize(&mut got);
                assert_close(&format!("{name} {prompt} {i}"), &got, &want.embeddings[i]);
            }
        }
    }
}

#[derive(Deserialize)]
struct RerankReference {
    tokens: Vec<Vec<u32>>,
    token_types: Vec<Vec<u32>>,
    scores: Vec<f32>,
    query: String,
    documents: Vec<String>,
}

/// The cross-encoders and the tokens each one's head reads: an encoder's
/// first (ModernBERT's as `classifier_pooling` says), a decoder's last.
const CROSS_ENCODERS: [(&str, PoolingMethod); 8] = [
    ("bert_rerank", PoolingMethod::Cls),
    ("xlmr_rerank", PoolingMethod::Cls),
    ("xlmr_rerank/model.gguf", PoolingMethod::Cls),
    ("qwen3_cls", PoolingMethod::Last),
    ("modernbert_rerank", PoolingMethod::Mean),
    ("modernbert_rerank/model.gguf", PoolingMethod::Mean),
    ("nomic_rerank", PoolingMethod::Cls),
    ("qwen3_cls_chat", PoolingMethod::Last),
];

#[test]
fn each_cross_encoder_matches_sentence_transformers_alone_and_batched() {
    for (name, read) in CROSS_ENCODERS {
        cross_encoder_matches(name, read);
    }
}

/// A file without one of its head's tensors is refused at load, naming
/// the tensor (not run with a zero in its place).
#[test]
fn a_cross_encoder_missing_a_head_tensor_is_refused_naming_it() {
    let cases = [
        ("modernbert_rerank", "head.norm.weight"),
        ("modernbert_rerank", "head.dense.weight"),
        ("modernbert_rerank", "classifier.bias"),
        ("nomic_rerank", "bert.pooler.dense.bias"),
        ("xlmr_rerank", "classifier.dense.weight"),
    ];
    for (name, tensor) in cases {
        let tmp = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(dir(name)).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                std::fs::copy(&path, tmp.path().join(path.file_name().unwrap())).unwrap();
            }
        }
        let file = tmp.path().join("model.safetensors");
        let mut tensors = candle_core::safetensors::load(&file, &Device::Cpu).unwrap();
        assert!(tensors.remove(tensor).is_some(), "{name} has no {tensor}");
        candle_core::safetensors::save(&tensors, &file).unwrap();
        let mut src = Source::open(tmp.path()).unwrap();
        let err = src.scorer(&Device::Cpu).unwrap_err().to_string();
        assert!(err.contains(tensor), "{name} without {tensor}: {err}");
    }
}

fn cross_encoder_matches(name: &str, read: PoolingMethod) {
    let r: RerankReference = {
        let refdir = dir(name.trim_end_matches("/model.gguf"));
        let text = std::fs::read_to_string(refdir.join("reference.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    };
    let mut src = Source::open(&dir(name)).unwrap();
    let m = src.scorer(&Device::Cpu).unwrap();
    assert!(m.scores() && m.decoder().kv_groups().is_empty());
    let typed = src.spec().unwrap().input.token_types > 1;
    assert_eq!(m.pooling().method, read, "{name}");
    let text = src.text().unwrap();
    // A pair through a chat template is the server's to render (its
    // `PairFormat`, tested there); the tokenizer's pair is checked here.
    let documents = match text.chat_template {
        Some(_) => &[][..],
        None => &r.documents[..],
    };
    for (i, doc) in documents.iter().enumerate() {
        let (ids, types) = text.tokenizer.encode_pair(&r.query, doc).unwrap();
        assert_eq!(ids, r.tokens[i], "{name} pair {i}");
        // A model of one type or none reads no types (a GGUF pair's are 0).
        if typed {
            assert_eq!(types, r.token_types[i], "{name} pair {i} types");
        }
    }
    let seqs: Vec<&[u32]> = r.tokens.iter().map(Vec::as_slice).collect();
    let types: Vec<&[u32]> = r.token_types.iter().map(Vec::as_slice).collect();
    let batched = m.vectors_typed(&seqs, Some(&types)).unwrap();
    for i in 0..seqs.len() {
        let alone = m.vectors_typed(&seqs[i..=i], Some(&types[i..=i])).unwrap();
        for got in [&alone[0], &batched[i]] {
            assert_eq!(got.len(), 1);
            assert!(
                (got[0] - r.scores[i]).abs() <= 1e-4,
                "{name} pair {i}: {got:?} vs {}",
                r.scores[i]
            );
        }
    }
    // Where the document has a segment of its own, it matters: typed all
    // 0, the scores move.
    if typed && r.token_types.iter().flatten().any(|&t| t != 0) {
        let untyped = m.vectors(&seqs).unwrap();
        assert!(
            untyped
                .iter()
                .zip(&r.scores)
                .any(|(u, s)| (u[0] - s).abs() > 1e-3)
        );
    }
}

#[derive(Deserialize)]
struct TokenPairReference {
    tokens: Vec<Vec<u32>>,
    scores: Vec<f32>,
    yes_no: (u32, u32),
}

/// Qwen3-Reranker's way: P("yes") against "no" at the last token of its
/// prompt, as its model card computes it with transformers.
#[test]
fn a_decoder_reranker_scores_by_its_yes_and_no_logits_alone_and_batched() {
    let name = "qwen3_rerank";
    let r: TokenPairReference = {
        let text = std::fs::read_to_string(dir(name).join("reference.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    };
    let mut src = Source::open(&dir(name)).unwrap();
    let text = src.text().unwrap();
    let ids = |t: &str| text.tokenizer.token_to_id(t).unwrap();
    assert_eq!((ids("yes"), ids("no")), r.yes_no);
    let m = src.token_scorer(&Device::Cpu, r.yes_no).unwrap();
    assert!(m.scores() && m.pooling().method == PoolingMethod::Last);
    let seqs: Vec<&[u32]> = r.tokens.iter().map(Vec::as_slice).collect();
    let batched = m.vectors(&seqs).unwrap();
    for i in 0..seqs.len() {
        let alone = m.vectors(&seqs[i..=i]).unwrap();
        for got in [&alone[0], &batched[i]] {
            assert!(
                (got[0] - r.scores[i]).abs() <= 1e-4,
                "pair {i}: {got:?} vs {}",
                r.scores[i]
            );
        }
    }
    // The tokens swapped score 1 - p: the head reads those two rows.
    let swapped = src
        .token_scorer(&Device::Cpu, (r.yes_no.1, r.yes_no.0))
        .unwrap();
    let got = swapped.vectors(&seqs[..1]).unwrap()[0][0];
    assert!((got - (1.0 - r.scores[0])).abs() <= 1e-4, "{got}");
}

/// llama-quantize's files of a one-type, one-label cross-encoder hold the
/// token-type table and the classifier as vectors: they load and score the
/// same.
#[test]
fn a_cross_encoder_whose_one_row_tables_are_vectors_scores_the_same() {
    let tmp = tempfile::tempdir().unwrap();
    let fixture = dir("xlmr_rerank");
    // Every one-row matrix written as a vector, as llama-quantize drops
    // trailing unit dimensions; the rest as they were (f32).
    let squeezed = std::cell::Cell::new(0);
    let f32 = candle_core::quantized::GgmlDType::F32;
    let squeeze = |_: &str, t: candle_core::Tensor| match t.dims() {
        [1, _] => {
            squeezed.set(squeezed.get() + 1);
            t.squeeze(0).unwrap()
        }
        _ => t,
    };
    let (src, dst) = (fixture.join("model.gguf"), tmp.path().join("model.gguf"));
    super::requantized::requantize_with(&src, &dst, (f32, f32), "", squeeze);
    assert_eq!(
        squeezed.get(),
        2,
        "token_types.weight and cls.output.weight"
    );
    std::fs::copy(
        fixture.join("reference.json"),
        tmp.path().join("reference.json"),
    )
    .unwrap();
    let name = tmp.path().join("model.gguf");
    cross_encoder_matches(name.to_str().unwrap(), PoolingMethod::Cls);
}
