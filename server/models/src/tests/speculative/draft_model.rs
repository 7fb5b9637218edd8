//! A draft model on real numerics: a draft identical to the target has
//! every draft accepted and changes no token; a draft of another family
//! sharing the tokenizer (the committed tiny llama and qwen3, which share
//! one `tokenizer.json`) keeps greedy output exact; the real default model
//! drafts for itself.

use super::*;
use crate::tests::reference::dir;

/// Draft tokens a row verifies at most.
const K: u32 = 4;

/// The committed tiny model of `family`, with a pool of blocks of 4.
fn family(family: &str) -> PagedModel {
    let decoder = Source::open(&dir(family)).unwrap().decoder(&Device::Cpu);
    PagedModel::new(decoder.unwrap(), 512, 4, ferrox_plan::KvDtype::F32).unwrap()
}

/// Prompts with nothing to copy (n-gram lookup finds nothing there) and
/// with runs to copy, inside the tiny vocabulary of 320.
fn prompts() -> Vec<Vec<u32>> {
    (0..8u32)
        .map(|i| {
            let len = 5 + 3 * i as usize;
            (0..len as u32)
                .map(|j| (i * 37 + j * 53 + j * j) % 300 + 10)
                .collect()
        })
        .collect()
}

fn drafting() -> Option<SpeculativeConfig> {
    SpeculativeConfig::parse(&format!(
        r#"{{"method": "ngram", "num_speculative_tokens": {K}}}"#
    ))
    .ok()
}

#[test]
fn drafts_of_the_same_or_another_family_keep_greedy_output_exact() {
    let prompts = prompts();
    let n = 24;
    let (want, _, _) = run(family("llama"), None, &prompts, n);
    // The target as its own draft: every draft accepted.
    let (same, drafted, accepted) = run_drafted(
        family("llama"),
        Some(family("llama")),
        drafting(),
        &prompts,
        n,
        |_| greedy(),
    );
    assert_eq!(same, want);
    assert!(
        drafted > 0 && accepted == drafted,
        "{accepted} of {drafted}"
    );
    // Another family, another shape (qwen3's q/k norms), the same
    // tokenizer: drafts mostly rejected, output the same.
    let (other, drafted, accepted) = run_drafted(
        family("llama"),
        Some(family("qwen3")),
        drafting(),
        &prompts,
        n,
        |_| greedy(),
    );
    assert_eq!(other, want);
    assert!(drafted > 0 && accepted < drafted, "{accepted} of {drafted}");
}

#[test]
fn a_draft_keeps_seeded_samples_exact() {
    let prompts = prompts();
    let sampling = |i: usize| SamplingParams {
        temperature: [0.5, 1.0][i % 2],
        seed: i as u64,
        ..SamplingParams::default()
    };
    let (off, _, _) = run_with(family("llama"), None, &prompts, 16, sampling);
    let (on, drafted, _) = run_drafted(
        family("llama"),
        Some(family("qwen3")),
        drafting(),
        &prompts,
        16,
        sampling,
    );
    assert!(drafted > 0);
    assert_eq!(on, off);
}

#[test]
fn the_default_model_drafting_for_itself_accepts_every_draft() {
    let Some(path) = default_model() else { return };
    let open = || {
        let llama = Source::open(&path).unwrap().decoder(&Device::Cpu).unwrap();
        PagedModel::new(llama, 512, 16, ferrox_plan::KvDtype::F16).unwrap()
    };
    let sentence = super::super::real_model::PROMPT;
    let prompts: Vec<Vec<u32>> = (0..4usize)
        .map(|i| {
            sentence
                .iter()
                .cycle()
                .skip(i)
                .take(19 + 5 * i)
                .copied()
                .collect()
        })
        .collect();
    let (want, _, _) = run(open(), None, &prompts, 24);
    let (got, drafted, accepted) =
        run_drafted(open(), Some(open()), drafting(), &prompts, 24, |_| greedy());
    assert_eq!(got, want);
    assert!(
        drafted > 0 && accepted == drafted,
        "{accepted} of {drafted}"
    );
}
