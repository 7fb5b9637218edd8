//! Corrupt tokenizer files: any byte mutation of a `tokenizer.json`, and any
//! damage to a GGUF vocabulary, gives a tokenizer or a clean error, never a
//! panic; a tokenizer that loads then encodes and decodes without one.

use proptest::prelude::*;

use super::Tokenizer;
use super::tests::{tiny_gpt2, tiny_llama};
use crate::gguf_vocab::GgufVocab;

/// A byte-level change to a file.
#[derive(Debug, Clone)]
enum Mutation {
    Set(usize, u8),
    Insert(usize, u8),
    Delete(usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    // Positions are taken modulo the file's length when applied.
    let byte = prop_oneof![
        any::<u8>(),
        prop::sample::select(b"{}[]\",:0123456789-.eE ntfu\\\\".to_vec()),
    ];
    prop_oneof![
        4 => (any::<usize>(), byte.clone()).prop_map(|(i, b)| Mutation::Set(i, b)),
        1 => (any::<usize>(), byte).prop_map(|(i, b)| Mutation::Insert(i, b)),
        1 => any::<usize>().prop_map(Mutation::Delete),
        1 => any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    let n = bytes.len().max(1);
    match *m {
        Mutation::Set(i, b) if !bytes.is_empty() => bytes[i % n] = b,
        Mutation::Insert(i, b) => bytes.insert(i % (bytes.len() + 1), b),
        Mutation::Delete(i) if !bytes.is_empty() => {
            bytes.remove(i % n);
        }
        Mutation::Truncate(i) => bytes.truncate(i % n),
        _ => {}
    }
}

/// Uses a tokenizer the way the server does; nothing here may panic.
fn exercise(tok: &Tokenizer) {
    for text in ["hello world", "<|im_start|>hi the 12 é 🚀", ""] {
        if let Ok(ids) = tok.encode(text, true) {
            let _ = tok.decode(&ids, true);
            let _ = tok.decode(&ids, false);
        }
    }
    let all: Vec<u32> = (0..tok.vocab_size() as u32 + 2).collect();
    let _ = tok.decode(&all, false);
    let mut d = crate::Detokenizer::new(true);
    for id in all {
        let _ = d.push(tok, id);
    }
    let _ = d.finish(tok);
}

fn json_of(vocab: GgufVocab) -> Vec<u8> {
    let tok = Tokenizer::from_gguf(&vocab).unwrap();
    tok.inner.to_string(false).unwrap().into_bytes()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 400,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_mutated_tokenizer_json_loads_or_fails_cleanly(
        llama in any::<bool>(),
        mutations in prop::collection::vec(mutation(), 1..6),
    ) {
        let mut bytes = json_of(if llama { tiny_llama() } else { tiny_gpt2() });
        for m in &mutations {
            apply(&mut bytes, m);
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        std::fs::write(&path, &bytes).unwrap();
        match Tokenizer::from_file(&path) {
            Ok(tok) => exercise(&tok),
            Err(e) => prop_assert!(e.to_string().contains("tokenizer.json"), "{e}"),
        }
    }

    #[test]
    fn a_damaged_gguf_vocabulary_builds_or_fails_cleanly(
        llama in any::<bool>(),
        edits in prop::collection::vec((any::<usize>(), ".{0,6}"), 0..6),
        merges in prop::collection::vec((any::<usize>(), "[a-zĠ ]{0,7}"), 0..4),
        types in prop::collection::vec((any::<usize>(), any::<i32>()), 0..4),
        scores in prop::collection::vec((any::<usize>(), any::<f32>()), 0..4),
        truncate in prop::option::of(any::<usize>()),
        ids in (prop::option::of(any::<u32>()), prop::option::of(any::<u32>()), prop::option::of(any::<u32>())),
        pre in prop::option::of(prop::sample::select(vec!["smollm", "llama-bpe", "qwen2", "gpt-2", "nonsense", ""])),
    ) {
        let mut v = if llama { tiny_llama() } else { tiny_gpt2() };
        let n = v.tokens.len();
        for (i, t) in edits {
            v.tokens[i % n] = t;
        }
        if let Some(m) = v.merges.as_mut().filter(|m| !m.is_empty()) {
            let k = m.len();
            for (i, t) in merges {
                m[i % k] = t;
            }
        }
        if let Some(t) = v.token_types.as_mut() {
            let k = t.len();
            for (i, x) in types {
                t[i % k] = x;
            }
        }
        if let Some(s) = v.scores.as_mut() {
            let k = s.len();
            for (i, x) in scores {
                s[i % k] = x;
            }
        }
        if let Some(t) = truncate {
            v.tokens.truncate(t % (n + 1));
        }
        (v.bos_id, v.eos_id, v.unk_id) = (
            ids.0.map(|x| x % (n as u32 + 3)).or(v.bos_id),
            ids.1.map(|x| x % (n as u32 + 3)).or(v.eos_id),
            ids.2.or(v.unk_id),
        );
        if !llama {
            v.pre = pre.map(String::from).or(v.pre);
        }
        if let Ok(tok) = Tokenizer::from_gguf(&v) {
            exercise(&tok);
        }
    }
}
