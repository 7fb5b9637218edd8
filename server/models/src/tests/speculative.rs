//! Speculative decoding on real numerics: the worker over the real default
//! model (and a tiny random one) gives exactly the greedy tokens it gives
//! without speculation, alone and sixteen at once, with the prefix cache
//! on and prompts prefilled in chunks, while verifying drafts in the same
//! step as the other rows.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::Device;
use candle_core::quantized::GgmlDType;
use ferrox_core::BatchModel;
use ferrox_engine::{EngineConfig, Event, Metrics, SamplingParams, Scheduler};
use ferrox_plan::SpeculativeConfig;

use super::request::{greedy, request};
use crate::fixtures::{Tiny, default_model, random_weights, write_gguf};
use crate::{PagedModel, Source};

/// vLLM's example: 5 drafts, suffixes of 2 to 4.
const NGRAM: SpeculativeConfig = SpeculativeConfig {
    num_speculative_tokens: 5,
    prompt_lookup_min: 2,
    prompt_lookup_max: 4,
};

/// Each prompt's `n` greedy tokens, all submitted at once to a worker over
/// `model` (prefix cache on, prompts in chunks of 7), and the draft tokens
/// it verified and accepted.
fn run(
    model: PagedModel,
    spec: Option<SpeculativeConfig>,
    prompts: &[Vec<u32>],
    n: usize,
) -> (Vec<Vec<u32>>, usize, usize) {
    run_with(model, spec, prompts, n, |_| greedy())
}

/// As [`run`], prompt `i` sampled by `sampling(i)`.
fn run_with(
    model: PagedModel,
    spec: Option<SpeculativeConfig>,
    prompts: &[Vec<u32>],
    n: usize,
    sampling: impl Fn(usize) -> SamplingParams,
) -> (Vec<Vec<u32>>, usize, usize) {
    run_drafted(model, None, spec, prompts, n, sampling)
}

/// As [`run_with`], drafted by `draft` when one is given; the draft's
/// pool is checked to have every block back at the end.
fn run_drafted(
    model: PagedModel,
    draft: Option<PagedModel>,
    spec: Option<SpeculativeConfig>,
    prompts: &[Vec<u32>],
    n: usize,
    sampling: impl Fn(usize) -> SamplingParams,
) -> (Vec<Vec<u32>>, usize, usize) {
    let config = EngineConfig {
        max_seqs: 16,
        max_queue: 64,
        prefill_chunk: 7,
        max_model_len: 512,
        block_size: model.block_size(),
        pools: model.cache_pools(),
        decode_log_interval: 0,
        prefix_caching: true,
        cache_salt: "test".into(),
        max_loras: 1,
        speculative: spec,
        max_batch_tokens: 16384,
        kv_offload: Vec::new(),
    };
    let mut now = Instant::now();
    let (mut s, h) = Scheduler::new(model, config, Arc::new(Metrics::new().unwrap()), now).unwrap();
    if let Some(draft) = draft {
        s.set_draft(Box::new(draft)).unwrap();
    }
    let mut subs: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| h.submit(request(p.clone(), n, sampling(i)), now).unwrap())
        .collect();
    let (mut drafted, mut accepted) = (0, 0);
    for tick in 0.. {
        assert!(tick < 10_000);
        now += Duration::from_millis(1);
        for v in s.tick(now).verified {
            drafted += v.drafted;
            accepted += v.accepted;
        }
        if s.is_idle() {
            break;
        }
    }
    assert_eq!(s.blocks_used(), 0, "blocks still reserved");
    if let Some(d) = s.draft_stats() {
        assert_eq!((d.reserved, d.free), (0, d.total), "draft blocks kept");
    }
    let tokens = subs
        .iter_mut()
        .map(|sub| {
            let ids: Vec<u32> = std::iter::from_fn(|| sub.try_next())
                .filter_map(|e| match e {
                    Event::Token { id, .. } => Some(id),
                    Event::Error(e) => panic!("{e}"),
                    _ => None,
                })
                .collect();
            assert_eq!(ids.len(), n);
            ids
        })
        .collect();
    (tokens, drafted, accepted)
}

/// Greedy with speculation equals greedy without, for the prompts alone
/// and all together; drafts were verified and some accepted.
fn check(open: impl Fn() -> PagedModel, prompts: &[Vec<u32>], n: usize) {
    let (want, none, _) = run(open(), None, prompts, n);
    assert_eq!(none, 0);
    let (together, drafted, accepted) = run(open(), Some(NGRAM), prompts, n);
    assert!(accepted > 0 && drafted > 0, "{accepted} of {drafted}");
    for (i, (got, want)) in together.iter().zip(&want).enumerate() {
        assert_eq!(got, want, "prompt {i} among {}", prompts.len());
    }
    for (i, p) in prompts.iter().enumerate().take(3) {
        let (alone, _, _) = run(open(), Some(NGRAM), std::slice::from_ref(p), n);
        assert_eq!(alone[0], want[i], "prompt {i} alone");
    }
}

#[test]
fn a_tiny_model_gives_the_same_greedy_tokens_with_speculation() {
    let t = Tiny::default();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_gguf(&path, &t, &random_weights(&t, 11), GgmlDType::Q8_0);
    let open = || tiny(&path);
    // Repeated runs of a few tokens: drafts to find, beside prompts with
    // nothing to copy.
    let prompts: Vec<Vec<u32>> = (0..16u32)
        .map(|i| {
            let run: Vec<u32> = (0..5).map(|j| (i * 7 + j * 11) % 96).collect();
            let times = if i % 2 == 0 { 4 } else { 1 };
            run.iter().cycle().take(5 * times + 3).copied().collect()
        })
        .collect();
    check(open, &prompts, 24);
}

/// Sampled rows verify by rejection sampling with one uniform a position,
/// as a step without drafts draws it: a seeded request gives the very
/// tokens it gives without speculation, on real logits and the real
/// sampler (the distribution check is the engine's chi-squared test).
#[test]
fn a_tiny_model_gives_the_same_seeded_samples_with_speculation() {
    let t = Tiny::default();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_gguf(&path, &t, &random_weights(&t, 11), GgmlDType::Q8_0);
    let prompts: Vec<Vec<u32>> = (0..8u32)
        .map(|i| {
            (0..4)
                .map(|j| (i * 5 + j * 13) % 96)
                .cycle()
                .take(19)
                .collect()
        })
        .collect();
    let sampling = |i: usize| SamplingParams {
        temperature: [0.3, 0.7, 1.0][i % 3],
        top_p: [1.0, 0.9][i % 2],
        seed: i as u64,
        ..SamplingParams::default()
    };
    let (off, none, _) = run_with(tiny(&path), None, &prompts, 24, sampling);
    let (on, drafted, accepted) = run_with(tiny(&path), Some(NGRAM), &prompts, 24, sampling);
    assert!(none == 0 && drafted > 0, "{none} {drafted}");
    assert!(accepted > 0, "{accepted} of {drafted}");
    assert_eq!(on, off);
}

fn tiny(path: &Path) -> PagedModel {
    let llama = Source::open(path).unwrap().decoder(&Device::Cpu).unwrap();
    PagedModel::new(llama, 1024, 4, ferrox_plan::KvDtype::F32).unwrap()
}

#[test]
fn the_default_model_gives_the_same_greedy_tokens_with_speculation() {
    let Some(path) = default_model() else { return };
    let open = || {
        let llama = Source::open(&path).unwrap().decoder(&Device::Cpu).unwrap();
        PagedModel::new(llama, 1024, 16, ferrox_plan::KvDtype::F16).unwrap()
    };
    // "The capital of France is Paris. ..." repeated (the model goes on
    // repeating it: copy work), and cut at different places, beside
    // prompts made of its tokens in other orders (little to copy).
    let sentence = super::real_model::PROMPT;
    let prompts: Vec<Vec<u32>> = (0..16usize)
        .map(|i| {
            if i % 2 == 0 {
                sentence.iter().cycle().take(40 + 3 * i).copied().collect()
            } else {
                let mut p = sentence.to_vec();
                p.rotate_left(i);
                p
            }
        })
        .collect();
    check(open, &prompts, 32);
}

mod draft_model;
