//! Shared test helpers: the default model's GGUF vocabulary.

pub mod gguf_meta;

use std::collections::HashMap;
use std::path::PathBuf;

use ferrox_core::GgufVocab;
use gguf_meta::Meta;

/// Where the default model lives; `scripts` fetch it there.
pub fn model_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// The model's metadata, or `None` (with a message) when the file is absent.
pub fn model_metadata() -> Option<HashMap<String, Meta>> {
    let path = model_path();
    if !path.exists() {
        eprintln!(
            "skipping: {} is absent (fetch the model first)",
            path.display()
        );
        return None;
    }
    Some(gguf_meta::read_metadata(&path).expect("GGUF metadata"))
}

fn strings(md: &HashMap<String, Meta>, key: &str) -> Option<Vec<String>> {
    let items = md.get(key)?.as_array()?;
    Some(
        items
            .iter()
            .map(|m| m.as_str().expect("string item").to_string())
            .collect(),
    )
}

fn id(md: &HashMap<String, Meta>, key: &str) -> Option<u32> {
    md.get(key)?
        .as_int()
        .map(|i| u32::try_from(i).expect("token id"))
}

fn flag(md: &HashMap<String, Meta>, key: &str) -> Option<bool> {
    match md.get(key)? {
        Meta::Bool(b) => Some(*b),
        _ => None,
    }
}

/// The GGUF vocabulary, as the models crate would fill it.
pub fn vocab(md: &HashMap<String, Meta>) -> GgufVocab {
    let k = |s: &str| format!("tokenizer.ggml.{s}");
    let scores = md.get(&k("scores")).and_then(Meta::as_array).map(|a| {
        a.iter()
            .map(|m| match m {
                Meta::Float(f) => *f as f32,
                other => panic!("score {other:?}"),
            })
            .collect()
    });
    let token_types = md.get(&k("token_type")).and_then(Meta::as_array).map(|a| {
        a.iter()
            .map(|m| m.as_int().expect("token type") as i32)
            .collect()
    });
    GgufVocab {
        model: md[&k("model")].as_str().expect("model").to_string(),
        pre: md.get(&k("pre")).and_then(Meta::as_str).map(str::to_string),
        tokens: strings(md, &k("tokens")).expect("tokens"),
        scores,
        token_types,
        merges: strings(md, &k("merges")),
        bos_id: id(md, &k("bos_token_id")),
        eos_id: id(md, &k("eos_token_id")),
        unk_id: id(md, &k("unknown_token_id")),
        eot_id: id(md, &k("eot_token_id")),
        eom_id: id(md, &k("eom_token_id")),
        add_bos: flag(md, &k("add_bos_token")),
        add_eos: flag(md, &k("add_eos_token")),
        ..GgufVocab::default()
    }
}
