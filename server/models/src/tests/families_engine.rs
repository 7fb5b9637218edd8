//! Every family through the engine's worker (scheduler, chunked prefill,
//! batching, the prefix cache, cancellation, window reclaim in window pools
//! sized as the plan sizes them, speculative decoding) against
//! transformers' committed references: greedy tokens and top-5
//! log-probabilities as the server would stream them.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrox_engine::{
    EngineConfig, EngineHandle, Event, Metrics, SamplingParams, Scheduler, Submission,
};

use ferrox_core::Pool;
use ferrox_plan::{CacheKind, KvDtype, SpeculativeConfig};

use super::reference::{FAMILIES, Prompt, Run, check_step, decoder, reference};
use super::request::{greedy, request};
use crate::PagedModel;

const MAX_SEQS: usize = 8;
const BLOCK: usize = 4;
/// Drafts of up to 4 tokens after a 1- to 3-token match: the tiny models'
/// outputs repeat short runs, which this finds.
const NGRAM: SpeculativeConfig = SpeculativeConfig {
    num_speculative_tokens: 4,
    prompt_lookup_min: 1,
    prompt_lookup_max: 3,
};

struct Engine {
    s: Scheduler<PagedModel>,
    h: EngineHandle,
    now: Instant,
    /// Each window pool's most blocks a row holds (the reservation).
    per_row: Vec<(CacheKind, usize)>,
    vocab: usize,
    /// Draft tokens accepted so far.
    accepted: usize,
}

impl Engine {
    /// The worker over `path`'s model: a KV pool of 256 blocks, and a
    /// window pool per window of `MAX_SEQS` rows' reservations (the window
    /// plus a chunk, page-aligned), which only the reclaim makes enough.
    fn new(
        path: &Path,
        run: &Run,
        caching: bool,
        chunk: usize,
        speculative: Option<SpeculativeConfig>,
    ) -> Self {
        let context = run.context.unwrap_or(256);
        let d = decoder(path, run.context);
        let vocab = d.spec().vocab;
        let per_row: Vec<(CacheKind, usize)> = d
            .cache_kinds()
            .into_iter()
            .filter_map(|kind| {
                let w = kind.window()?;
                let most = ferrox_plan::window_blocks(w, chunk as u64, BLOCK as u64);
                Some((kind, most as usize))
            })
            .collect();
        let pools: Vec<Pool> = d
            .cache_kinds()
            .into_iter()
            .map(|kind| Pool {
                kind,
                blocks: match kind {
                    CacheKind::Full => 256,
                    CacheKind::Window(_) => MAX_SEQS * blocks_for(&per_row, kind),
                    CacheKind::State => MAX_SEQS,
                },
            })
            .collect();
        let model = PagedModel::with_pools(d, &pools, BLOCK, KvDtype::F32).unwrap();
        let config = EngineConfig {
            max_seqs: MAX_SEQS,
            max_queue: 32,
            prefill_chunk: chunk,
            max_model_len: context,
            block_size: BLOCK,
            decode_log_interval: 0,
            prefix_caching: caching,
            cache_salt: "test".into(),
            pools,
            speculative,
            ..EngineConfig::default()
        };
        let now = Instant::now();
        let metrics = Arc::new(Metrics::new().unwrap());
        let (s, h) = Scheduler::new(model, config, metrics, now).unwrap();
        Engine {
            s,
            h,
            now,
            per_row,
            vocab,
            accepted: 0,
        }
    }

    /// Whether the model has a windowed group or recurrent layers (then
    /// the prefix cache is off).
    fn windowed(&self) -> bool {
        !self.per_row.is_empty() || self.s.stats_of(CacheKind::State).is_some()
    }

    fn submit(&self, prompt: &[u32], n: usize) -> Submission {
        let sampling = SamplingParams {
            logprobs: Some(5),
            ..greedy()
        };
        self.h
            .submit(request(prompt.to_vec(), n, sampling), self.now)
            .unwrap()
    }

    /// One tick; returns the prompt tokens the cache supplied. A window
    /// pool holds at most each running row's reservation.
    fn tick(&mut self) -> usize {
        self.now += Duration::from_millis(1);
        let report = self.s.tick(self.now);
        self.accepted += report.verified.iter().map(|v| v.accepted).sum::<usize>();
        let cached = report.admitted.cached_tokens;
        for &(kind, most) in &self.per_row {
            let stats = self.s.stats_of(kind).unwrap();
            assert!(stats.held <= self.s.running() * most, "{kind}: {stats:?}");
        }
        // One state slot a running row, never more.
        if let Some(slots) = self.s.stats_of(CacheKind::State) {
            assert_eq!(slots.reserved, self.s.running(), "{slots:?}");
        }
        cached
    }

    fn run_to_idle(&mut self) -> usize {
        let mut cached = 0;
        while !self.s.is_idle() {
            cached += self.tick();
        }
        for (kind, stats) in self.s.pools_stats() {
            assert_eq!(
                stats.reserved, 0,
                "{kind}: blocks (or slots) still reserved"
            );
        }
        cached
    }
}

/// The reservation of the window pool of `kind` among `per_row`.
fn blocks_for(per_row: &[(CacheKind, usize)], kind: CacheKind) -> usize {
    per_row
        .iter()
        .find(|(k, _)| *k == kind)
        .map_or(0, |&(_, n)| n)
}

/// A finished request's tokens, each with its log-probabilities as a
/// vocabulary-wide row (NaN where not reported).
fn collect(sub: &mut Submission, vocab: usize) -> Vec<(u32, Vec<f32>)> {
    let mut out = Vec::new();
    while let Some(e) = sub.try_next() {
        match e {
            Event::Token { id, logprob, .. } => {
                let mut row = vec![f32::NAN; vocab];
                for (t, lp) in logprob.expect("logprobs asked for").top {
                    row[t as usize] = lp;
                }
                out.push((id, row));
            }
            Event::Done { .. } | Event::PromptLogprobs(_) | Event::Vectors { .. } => {}
            Event::Error(e) => panic!("{e}"),
        }
    }
    out
}

fn check(what: &str, got: &[(u32, Vec<f32>)], p: &Prompt, near_tie: f32) {
    assert_eq!(got.len(), p.steps.len(), "{what}: tokens");
    for (i, ((token, lp), want)) in got.iter().zip(&p.steps).enumerate() {
        if !check_step(&format!("{what} step {i}"), *token, lp, want, near_tie) {
            return;
        }
    }
}

/// How a family is served.
#[derive(Debug, Clone, Copy)]
struct Serving {
    caching: bool,
    chunk: usize,
    speculative: Option<SpeculativeConfig>,
}

/// What serving a family found: prompt tokens the cache supplied, whether
/// the model has windows (or recurrent state), draft tokens accepted.
struct Served {
    cached: usize,
    windowed: bool,
    accepted: usize,
}

/// The run's prompts together on the model at `path`, beside a long
/// neighbour cancelled after three ticks; then again (a cache would now hold
/// them).
fn serve(path: &Path, run: &Run, near_tie: f32, how: Serving) -> Served {
    let family = path.display();
    let Serving {
        caching,
        chunk,
        speculative,
    } = how;
    let mut e = Engine::new(path, run, caching, chunk, speculative);
    let vocab = e.vocab;
    let n = run.prompts[0].steps.len();
    let neighbour: Vec<u32> = run
        .prompts
        .iter()
        .flat_map(|p| p.ids.clone())
        .take(60)
        .collect();
    let mut cached = 0;
    for round in 0..2 {
        let mut doomed = e.submit(&neighbour, n);
        let mut subs: Vec<Submission> = run.prompts.iter().map(|p| e.submit(&p.ids, n)).collect();
        for _ in 0..3 {
            cached += e.tick();
        }
        doomed.cancel();
        cached += e.run_to_idle();
        for (i, (sub, p)) in subs.iter_mut().zip(&run.prompts).enumerate() {
            let what = format!(
                "{family} {} round {round} cache {caching} speculative {} prompt {i}",
                run.name,
                speculative.is_some()
            );
            check(&what, &collect(sub, vocab), p, near_tie);
        }
    }
    Served {
        cached,
        windowed: e.windowed(),
        accepted: e.accepted,
    }
}

#[test]
fn the_engine_serves_every_family_as_transformers_does() {
    // Chunks of 5: their edges fall across every window of 8 to 12.
    let plain = Serving {
        caching: false,
        chunk: 5,
        speculative: None,
    };
    let cached = Serving {
        caching: true,
        ..plain
    };
    let speculating = Serving {
        speculative: Some(NGRAM),
        ..cached
    };
    let mut accepted = 0;
    for family in FAMILIES {
        let r = reference(family);
        for run in &r.runs {
            for path in r.files(run) {
                assert_eq!(serve(&path, run, r.near_tie, plain).cached, 0);
                let Served {
                    cached: hits,
                    windowed,
                    ..
                } = serve(&path, run, r.near_tie, cached);
                // The same tokens and logprobs while verifying drafts (on
                // the models whose pools allow it).
                let spec = serve(&path, run, r.near_tie, speculating);
                assert!(!windowed || spec.accepted == 0);
                accepted += spec.accepted;
                let what = format!("{family} {} {}", run.name, path.display());
                if windowed {
                    // A cached prefix would need its window's blocks, which
                    // the window pool gives back (or a recurrent state at
                    // its end, which is not kept): the cache is off.
                    assert_eq!(hits, 0, "{what}: the cache is off with windows");
                } else {
                    assert!(hits > 0, "{what}: the second round found its prompts");
                }
            }
        }
    }
    assert!(accepted > 0, "no family accepted a draft token");
}
