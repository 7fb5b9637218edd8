//! The grammar's cost per decode step on the default model's vocabulary:
//! compiling a schema (once per request, off the worker), then for each
//! token of a valid output the mask computation and its application to a
//! row of logits (on the worker). Usage:
//! `cargo run -p ferrox-grammar --example mask_cost -- [MODEL.gguf] [SCHEMA.json]`

use std::time::{Duration, Instant};

use ferrox_engine::TokenConstraint;
use ferrox_grammar::matcher::apply_mask;
use ferrox_grammar::{GrammarSpec, Grammars, Vocab};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let model = args
        .next()
        .unwrap_or_else(|| "models/SmolLM2-135M-Instruct.Q4_1.gguf".into());
    let schema: serde_json::Value = match args.next() {
        Some(path) => serde_json::from_str(&std::fs::read_to_string(path)?)?,
        None => serde_json::json!({"type": "array", "items": {"type": "string"}, "minItems": 64}),
    };
    let text = ferrox_models::Source::open(std::path::Path::new(&model))?.text()?;
    let bytes = text.tokenizer.token_bytes();
    let vocab_len = bytes.tokens.len();
    let started = Instant::now();
    let grammars = Grammars::new(Vocab {
        tokens: bytes.tokens,
        special: bytes.special,
        eos: text.end_of_generation.ids().to_vec(),
    })?;
    println!(
        "vocabulary of {vocab_len}: token trie built in {:?}",
        started.elapsed()
    );
    let spec = GrammarSpec::JsonSchema(schema);
    let output = format!("[{}]", vec!["\"hello world\""; 64].join(", "));
    let ids = text.tokenizer.encode(&output, false)?;
    let mut compiles = Vec::new();
    let mut masks = Vec::new();
    let mut applies = Vec::new();
    let mut logits = vec![0.0f32; vocab_len];
    for _ in 0..5 {
        let t = Instant::now();
        let mut m = grammars.compile(&spec)?;
        compiles.push(t.elapsed());
        for (step, &id) in ids.iter().enumerate() {
            let t = Instant::now();
            let allowed = m.allowed()?;
            // The first mask was computed by compile.
            if step > 0 {
                masks.push(t.elapsed());
            }
            assert!(allowed.is_allowed(id), "the valid output is masked");
            logits.fill(0.0);
            let t = Instant::now();
            apply_mask(&allowed, &mut logits);
            applies.push(t.elapsed());
            m.advance(id)?;
        }
    }
    println!("compile: {}", summary(&mut compiles));
    println!(
        "mask computation per step ({} steps): {}",
        masks.len(),
        summary(&mut masks)
    );
    println!(
        "mask applied to {vocab_len} logits per step: {}",
        summary(&mut applies)
    );
    Ok(())
}

fn summary(v: &mut [Duration]) -> String {
    v.sort();
    let mean = v.iter().sum::<Duration>() / v.len().max(1) as u32;
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize];
    format!(
        "mean {mean:?}, p50 {:?}, p99 {:?}, max {:?}",
        at(0.5),
        at(0.99),
        at(1.0)
    )
}
