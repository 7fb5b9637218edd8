//! The prefix cache on real numerics: the engine's worker over a tiny random
//! model and over the real default model gives exactly the same greedy and
//! seeded tokens with the cache as without it, and as each request alone,
//! for prompts sharing no block, one, many, and the whole prompt with what
//! is cached, under chunked prefill and in batches.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::Device;
use candle_core::quantized::GgmlDType;
use ferrox_core::BatchModel;
use ferrox_engine::{
    EngineConfig, EngineHandle, Event, GenerationRequest, Metrics, SamplingParams, Scheduler,
};

use super::request::request;
use crate::fixtures::{Tiny, default_model, random_weights, write_gguf};
use crate::{PagedModel, Source};

/// One request: its prompt, and a seed to sample with (`None`: greedy).
#[derive(Debug, Clone)]
struct Ask {
    prompt: Vec<u32>,
    seed: Option<u64>,
}

fn generation(ask: &Ask, n: usize) -> GenerationRequest {
    let sampling = SamplingParams {
        temperature: if ask.seed.is_some() { 0.8 } else { 0.0 },
        seed: ask.seed.unwrap_or(0),
        ..SamplingParams::default()
    };
    request(ask.prompt.clone(), n, sampling)
}

/// The worker over one model, driven tick by tick.
struct Engine {
    s: Scheduler<PagedModel>,
    h: EngineHandle,
    now: Instant,
}

impl Engine {
    fn new(model: PagedModel, block_size: usize, caching: bool, chunk: usize) -> Self {
        let config = EngineConfig {
            max_seqs: 16,
            max_queue: 32,
            prefill_chunk: chunk,
            max_model_len: 256,
            block_size,
            pools: model.cache_pools(),
            decode_log_interval: 0,
            prefix_caching: caching,
            cache_salt: "test".into(),
            max_loras: 1,
            speculative: None,
            max_batch_tokens: 16384,
            kv_offload: Vec::new(),
        };
        let now = Instant::now();
        let metrics = Arc::new(Metrics::new().unwrap());
        let (s, h) = Scheduler::new(model, config, metrics, now).unwrap();
        Engine { s, h, now }
    }

    /// Runs `asks` together to the end; returns each one's tokens and the
    /// prompt tokens the cache supplied.
    fn run(&mut self, asks: &[Ask], n: usize) -> (Vec<Vec<u32>>, usize) {
        self.run_joining(&[(0, asks)], n)
    }

    /// Runs each group of asks from its tick on, to the end of all.
    fn run_joining(&mut self, groups: &[(usize, &[Ask])], n: usize) -> (Vec<Vec<u32>>, usize) {
        let mut subs = Vec::new();
        let mut cached = 0;
        for tick in 0.. {
            for (_, asks) in groups.iter().filter(|g| g.0 == tick) {
                let now = self.now;
                subs.extend(
                    asks.iter()
                        .map(|a| self.h.submit(generation(a, n), now).unwrap()),
                );
            }
            self.now += Duration::from_millis(1);
            cached += self.s.tick(self.now).admitted.cached_tokens;
            if self.s.is_idle() && groups.iter().all(|g| g.0 <= tick) {
                break;
            }
        }
        assert_eq!(self.s.pool_stats().reserved, 0, "blocks still reserved");
        let tokens = subs
            .iter_mut()
            .map(|sub| {
                let mut ids = Vec::new();
                while let Some(e) = sub.try_next() {
                    match e {
                        Event::Token { id, .. } => ids.push(id),
                        Event::Done { .. } | Event::PromptLogprobs(_) | Event::Vectors { .. } => {}
                        Event::Error(e) => panic!("{e}"),
                    }
                }
                assert_eq!(ids.len(), n);
                ids
            })
            .collect();
        (tokens, cached)
    }
}

/// Prompts that share, with `base`, no block, the first block, all but the
/// last few tokens, exactly two blocks, and the whole prompt; each greedy and
/// seeded.
fn asks(base: &[u32], bs: usize, other: impl Fn(usize) -> u32) -> Vec<Ask> {
    let tail = |from: usize, n: usize| -> Vec<u32> {
        base[..from]
            .iter()
            .copied()
            .chain((0..n).map(&other))
            .collect()
    };
    let prompts = [
        tail(0, base.len()),
        tail(bs, 5),
        tail(base.len() - 3, 4),
        base[..2 * bs].to_vec(),
        base.to_vec(),
    ];
    prompts
        .iter()
        .flat_map(|p| {
            [None, Some(7)].map(|seed| Ask {
                prompt: p.clone(),
                seed,
            })
        })
        .collect()
}

/// Full blocks `prompt` shares with `cached` (tokens in the KV), capped so
/// at least its last token is computed.
fn expected_hit(prompt: &[u32], cached: &[u32], bs: usize) -> usize {
    let common = prompt
        .iter()
        .zip(cached)
        .take_while(|(a, b)| a == b)
        .count();
    (common / bs).min((prompt.len() - 1) / bs) * bs
}

/// Warms the cache with `base`, then runs the asks together; compares with
/// the cache off and with each ask alone.
fn check(open: impl Fn() -> PagedModel, bs: usize, base: &[u32], other: impl Fn(usize) -> u32) {
    let n = 6;
    let warm = [Ask {
        prompt: base.to_vec(),
        seed: None,
    }];
    let batch = asks(base, bs, &other);
    let mut results = Vec::new();
    for caching in [false, true] {
        let mut e = Engine::new(open(), bs, caching, 7);
        let (w, warm_hits) = e.run(&warm, n);
        assert_eq!(warm_hits, 0);
        let (got, hits) = e.run(&batch, n);
        let in_kv: Vec<u32> = base.iter().chain(&w[0][..n - 1]).copied().collect();
        let want: usize = if caching {
            batch
                .iter()
                .map(|a| expected_hit(&a.prompt, &in_kv, bs))
                .sum()
        } else {
            0
        };
        assert_eq!(hits, want, "cache {caching}");
        assert_eq!(want > 0, caching);
        results.push(got);
    }
    assert_eq!(results[1], results[0], "with the cache vs without");
    // Requests that arrive while an equal prompt is still prefilling share
    // only the blocks it has computed by then.
    let mut e = Engine::new(open(), bs, true, 7);
    let fresh: Vec<u32> = (0..base.len()).map(|i| other(i + 3)).collect();
    let first = [Ask {
        prompt: fresh.clone(),
        seed: None,
    }];
    let joiners = asks(&fresh, bs, |i| other(i + 1));
    // Chunks of 7: by then about 3 blocks of the first are computed.
    let join = 3 * bs / 7 + 1;
    assert!(join * 7 < fresh.len(), "still prefilling when they join");
    let (joined, hits) = e.run_joining(&[(0, &first), (join, &joiners)], n);
    assert!(hits > 0, "the joiners found the computed blocks");
    // One at a time, whole prompts, no cache: each alone.
    let mut alone = Engine::new(open(), bs, false, 512);
    let all = batch.iter().zip(&results[1]);
    let later = first.iter().chain(&joiners).zip(&joined);
    for (ask, got) in all.chain(later) {
        let (want, _) = alone.run(std::slice::from_ref(ask), n);
        assert_eq!(got, &want[0], "with hits vs alone: {ask:?}");
    }
}

fn tiny(path: &Path) -> PagedModel {
    let llama = Source::open(path).unwrap().decoder(&Device::Cpu).unwrap();
    PagedModel::new(llama, 256, 4, ferrox_plan::KvDtype::F32).unwrap()
}

#[test]
fn a_tiny_model_gives_the_same_tokens_with_the_cache() {
    let t = Tiny::default();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_gguf(&path, &t, &random_weights(&t, 11), GgmlDType::Q8_0);
    let base: Vec<u32> = (0..26u32).map(|i| (i * 37 + 5) % 96).collect();
    check(|| tiny(&path), 4, &base, |i| (i as u32 * 13 + 50) % 96);
}

#[test]
fn the_default_model_gives_the_same_tokens_with_the_cache() {
    let Some(path) = default_model() else { return };
    let open = || {
        let llama = Source::open(&path).unwrap().decoder(&Device::Cpu).unwrap();
        PagedModel::new(llama, 128, 16, ferrox_plan::KvDtype::F16).unwrap()
    };
    // "The capital of France is Paris. ..." repeated: 67 tokens, 4 full
    // blocks of 16.
    let sentence = super::real_model::PROMPT;
    let base: Vec<u32> = sentence.iter().cycle().take(67).copied().collect();
    check(open, 16, &base, |i| [1097, 2863, 4206, 915, 1443][i % 5]);
}
