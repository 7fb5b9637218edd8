//! Test builders: a small byte-level vocabulary and a driver that feeds a
//! matcher text, checking each token against its mask.

use ferrox_engine::TokenConstraint;

use crate::{GrammarMatcher, GrammarSpec, Grammars, Vocab};

/// The end token of [`vocab`].
pub const EOS: u32 = 256;

/// Every byte as its own token (id = byte), an end token, and a few
/// multi-byte words.
pub fn vocab() -> Vocab {
    let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    tokens.push(Vec::new());
    for w in ["{\"", "\": ", ", \"", "\"}", "true", "null", "name"] {
        tokens.push(w.as_bytes().to_vec());
    }
    Vocab {
        tokens,
        special: vec![(EOS, "<|end|>".into())],
        eos: vec![EOS],
    }
}

pub fn grammars() -> Grammars {
    Grammars::new(vocab()).expect("the test vocabulary")
}

pub fn compile(spec: GrammarSpec) -> GrammarMatcher {
    grammars().compile(&spec).expect("compiles")
}

/// Feeds `text` one byte token at a time; `Err` at the first byte the mask
/// forbids.
pub fn feed(m: &mut GrammarMatcher, text: &str) -> Result<(), String> {
    for (i, &b) in text.as_bytes().iter().enumerate() {
        if m.is_finished() {
            return Err(format!("finished before byte {i} of {text:?}"));
        }
        let allowed = m.allowed()?;
        if !allowed.is_allowed(u32::from(b)) {
            return Err(format!("byte {i} of {text:?} not allowed"));
        }
        m.advance(u32::from(b))?;
    }
    Ok(())
}

/// True when the output may end here: complete, or the end token allowed.
pub fn may_end(m: &mut GrammarMatcher) -> bool {
    m.is_finished() || m.allowed().is_ok_and(|a| a.is_allowed(EOS))
}

/// The output `text` is accepted whole and may end after it.
pub fn accepts(spec: &GrammarSpec, text: &str) -> bool {
    let mut m = compile(spec.clone());
    feed(&mut m, text).is_ok() && may_end(&mut m)
}

/// SmolLM2's tokenizer and its vocabulary, if the default model is fetched
/// (`scripts/fetch-model`); with `FERROX_REQUIRE_MODEL=1` a missing model
/// fails instead of skipping.
pub fn smollm2() -> Option<(ferrox_models::TextModel, Vocab)> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        assert!(
            std::env::var("FERROX_REQUIRE_MODEL").as_deref() != Ok("1"),
            "{} missing and FERROX_REQUIRE_MODEL=1",
            path.display()
        );
        eprintln!("skipping: {} not fetched", path.display());
        return None;
    }
    let text = ferrox_models::Source::open(&path).unwrap().text().unwrap();
    let bytes = text.tokenizer.token_bytes();
    let vocab = Vocab {
        tokens: bytes.tokens,
        special: bytes.special,
        eos: text.end_of_generation.ids().to_vec(),
    };
    Some((text, vocab))
}
