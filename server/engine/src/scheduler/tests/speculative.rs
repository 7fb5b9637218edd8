//! Speculative decoding through the worker: exactly the events a request
//! gets without it, every rejected block back, nothing unverified in the
//! prefix cache or ever read from the KV, the target's distribution under
//! rejection sampling, and off where it does not pay.

use ferrox_plan::SpeculativeConfig;

use super::*;
use crate::fixtures::AllowSteps;

/// Blocks of 4; 64 of them, 8 rows, 16 tokens of step budget (so a few
/// rows' drafts fit beside a prompt chunk); k drafts, suffixes of 1 to 3.
fn speculating(k: u32) -> EngineConfig {
    let mut c = EngineConfig {
        prefill_chunk: 16,
        max_seqs: 8,
        max_queue: 64,
        speculative: Some(SpeculativeConfig {
            num_speculative_tokens: k,
            prompt_lookup_min: 1,
            prompt_lookup_max: 3,
        }),
        ..config()
    };
    c.set_pool(CacheKind::Full, 64);
    c
}

fn plain() -> EngineConfig {
    EngineConfig {
        speculative: None,
        ..speculating(5)
    }
}

/// A prompt whose tail `[2, 3]` occurred before, followed by `4, 9, 9`:
/// the first draft token is right (the model's next is last + 1), the
/// second is not.
const COPY: [u32; 9] = [1, 2, 3, 4, 9, 9, 1, 2, 3];

fn past_eos(prompt: &[u32], max_tokens: usize) -> GenerationRequest {
    let mut r = request(prompt, max_tokens);
    r.ignore_eos = true;
    r
}

/// Every event a request received, in order.
fn events(sub: &mut Submission) -> Vec<Event> {
    std::iter::from_fn(|| sub.try_next()).collect()
}

/// The token ids among `events`.
fn ids(events: &[Event]) -> Vec<u32> {
    let tokens = events.iter().filter_map(|e| match e {
        Event::Token { id, .. } => Some(*id),
        _ => None,
    });
    tokens.collect()
}

/// Runs every request (made afresh by each maker) together under `cfg`;
/// returns each one's events and the verifications.
fn run_all(
    cfg: EngineConfig,
    makers: &[fn() -> GenerationRequest],
) -> (Vec<Vec<Event>>, Vec<Verified>, Rig) {
    let mut rig = Rig::new(cfg);
    let mut subs: Vec<Submission> = makers.iter().map(|m| rig.submit(m())).collect();
    let reports = rig.run(400);
    let verified = reports.into_iter().flat_map(|r| r.verified).collect();
    (subs.iter_mut().map(events).collect(), verified, rig)
}

/// Every read of the KV (a run's context before the position its chunk
/// started at, and the chunk's first token) is a prefix of one of
/// `sequences`: no rejected draft token was ever read back.
fn assert_reads_are_verified(rig: &Rig, sequences: &[Vec<u32>]) {
    let reads = rig.s.model.reads.lock().unwrap();
    assert!(!reads.is_empty());
    for (start, c) in reads.iter() {
        let read = &c[..=*start];
        assert!(
            sequences.iter().any(|s| s.starts_with(read)),
            "read {read:?} (from {start}) is no request's sequence"
        );
    }
}

/// `events` with the cached prompt tokens of each usage left out.
fn uncached(mut events: Vec<Vec<Event>>) -> Vec<Vec<Event>> {
    for e in events.iter_mut().flatten() {
        if let Event::Done { usage, .. } = e {
            usage.cached_tokens = 0;
        }
    }
    events
}

fn requests() -> Vec<fn() -> GenerationRequest> {
    vec![
        // Past the vocabulary and round again: the second lap is all copy.
        || past_eos(&[5, 6, 7], 44),
        // A copied prompt, partly rejected.
        || past_eos(&COPY, 12),
        // The model's end token accepted inside a draft: what follows it
        // in the draft is dropped.
        || request(&[29, 30, 31, 0, 1, 2, 28, 29], 20),
        // A stop string completed inside a verified run.
        || {
            let mut r = past_eos(&[1, 2, 3, 4, 5, 6, 7, 8, 1, 2], 20);
            r.stop = vec!["fg".into()];
            r
        },
        // A stop token id inside a verified run.
        || {
            let mut r = past_eos(&[1, 2, 3, 4, 5, 6, 7, 8, 1, 2], 20);
            r.stop_token_ids = vec![6];
            r
        },
        // max_tokens bounds the drafts.
        || past_eos(&[1, 2, 3, 4, 5, 6, 7, 8, 1, 2], 4),
        // Logprobs of every token, verified or not.
        || {
            let mut r = past_eos(&[10, 11, 12, 13, 14, 10, 11], 9);
            r.sampling.logprobs = Some(2);
            r
        },
        // min_tokens masks the end token, which the draft then proposes.
        || {
            let mut r = request(&[29, 30, 31, 0, 1, 29, 30], 8);
            r.min_tokens = 4;
            r
        },
        // A grammar that forbids the model's favourite: drafts are checked
        // against it, token by token.
        || {
            let steps = vec![vec![3], vec![4], vec![9, 5], vec![6], vec![7], vec![20]];
            let mut r = past_eos(&[1, 2, 3, 4, 5, 6, 7, 1, 2], 10);
            r.constraint = Some(Box::new(AllowSteps::new(steps)));
            r
        },
        // bad_words and allowed_token_ids.
        || {
            let mut r = past_eos(&[1, 2, 3, 4, 5, 6, 7, 1, 2], 8);
            r.sampling.bad_words = vec![vec![4, 5]];
            r
        },
        || {
            let mut r = past_eos(&[1, 2, 3, 4, 5, 6, 7, 1, 2], 8);
            r.sampling.allowed_token_ids = Some(vec![3, 4, 5, 9, 10, 11]);
            r
        },
    ]
}

#[test]
fn drafts_are_cut_where_the_grammar_refuses_them_before_verification() {
    // The first token is 3; the prompt's n-gram then continues 4 5 6 7 1;
    // the grammar allows 3 4 (9|5) 6 7 then only 20: the 1 is never
    // verified, and the four before it are.
    let constrained = || {
        let steps = vec![vec![3], vec![4], vec![9, 5], vec![6], vec![7], vec![20]];
        let mut r = past_eos(&[1, 2, 3, 4, 5, 6, 7, 1, 2], 10);
        r.constraint = Some(Box::new(AllowSteps::new(steps)));
        r
    };
    let (want, _, _) = run_all(plain(), &[constrained]);
    let (got, verified, rig) = run_all(speculating(8), &[constrained]);
    assert_eq!(uncached(got), uncached(want));
    let drafted: usize = verified.iter().map(|v| v.drafted).sum();
    let accepted: usize = verified.iter().map(|v| v.accepted).sum();
    assert_eq!(drafted, 4, "{verified:?}");
    assert_eq!(
        accepted, drafted,
        "every verified draft token is the grammar's"
    );
    rig.assert_all_blocks_back();
}

#[test]
fn every_request_gets_exactly_the_events_it_gets_without_speculation() {
    let makers = requests();
    let (want, none, _) = run_all(plain(), &makers);
    assert!(none.is_empty());
    // Alone and all together (eight rows at once, the rest queued). Rows
    // that end sooner commit their blocks to the prefix cache sooner, so
    // together only how many prompt tokens a later row found cached may
    // differ.
    let (together, verified, rig) = run_all(speculating(5), &makers);
    let want = uncached(want);
    assert_eq!(uncached(together), want);
    for (i, maker) in makers.iter().enumerate() {
        let (alone, _, _) = run_all(speculating(5), &[*maker]);
        assert_eq!(uncached(alone)[0], want[i], "request {i} alone");
    }
    // Drafts were verified, some accepted and some rejected; their counts
    // went to the metrics.
    let drafted: usize = verified.iter().map(|v| v.drafted).sum();
    let accepted: usize = verified.iter().map(|v| v.accepted).sum();
    assert!(
        accepted > 20 && accepted < drafted,
        "{accepted} of {drafted}"
    );
    assert!(verified.iter().any(|v| v.accepted == 0));
    let text = rig.h.metrics().render("m");
    for line in [
        format!(
            "vllm:spec_decode_num_drafts_total{{model_name=\"m\"}} {}",
            verified.len()
        ),
        format!("vllm:spec_decode_num_draft_tokens_total{{model_name=\"m\"}} {drafted}"),
        format!("vllm:spec_decode_num_accepted_tokens_total{{model_name=\"m\"}} {accepted}"),
    ] {
        assert!(text.contains(&line), "{line} in\n{text}");
    }
    let first = verified.iter().filter(|v| v.accepted > 0).count();
    assert!(text.contains(&format!(
        "vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name=\"m\",position=\"0\"}} {first}"
    )));
    // No read of the KV ever saw a rejected draft token.
    let sequences: Vec<Vec<u32>> = (makers.iter().zip(&want))
        .map(|(m, e)| m().prompt.into_iter().chain(ids(e)).collect())
        .collect();
    assert_reads_are_verified(&rig, &sequences);
    rig.assert_all_blocks_back();
}

#[test]
fn seeded_sampling_gives_the_same_tokens_with_speculation_on_or_off() {
    let run = |cfg: EngineConfig| {
        let mut model = FakeModel::new(cfg.block_size);
        model.pools = cfg.pools.clone();
        // A soft distribution: the favourite at about 0.4.
        model.peak = 3.0;
        let mut rig = Rig::with_model(model, cfg);
        let mut subs: Vec<Submission> = (0..6)
            .map(|seed| {
                let mut r = past_eos(&[1, 2, 3, 4, 5, 6, 7, 8, 1, 2], 24);
                r.sampling.temperature = 1.0;
                r.sampling.seed = seed;
                rig.submit(r)
            })
            .collect();
        let verified: usize = rig.run(400).iter().map(|r| r.verified.len()).sum();
        (subs.iter_mut().map(events).collect::<Vec<_>>(), verified)
    };
    let (on, verified) = run(speculating(4));
    let (off, none) = run(plain());
    assert!(verified > 0 && none == 0, "{verified} {none}");
    assert_eq!(on, off);
}

#[test]
fn rollback_returns_every_rejected_block() {
    let mut rig = Rig::new(speculating(5));
    let idle = rig.s.pool_stats();
    let mut sub = rig.submit(past_eos(&COPY, 20));
    let id = sub.id();
    let mut rejected_a_block = false;
    for tick in 0.. {
        assert!(tick < 60);
        let r = rig.tick();
        let Some(row) = rig.s.rows.get(&id) else {
            break;
        };
        // After every step the row holds the blocks of its tokens in the
        // KV and its pending token's place, and no more; the rest of its
        // reservation stays promised to it.
        let tokens = row.prompt.len() + row.generated;
        let s = rig.s.pool_stats();
        assert_eq!(s.held, tokens.div_ceil(4), "{r:?}");
        assert_eq!(s.reserved, (COPY.len() + 20).div_ceil(4));
        for v in &r.verified {
            // Drafts past the kept blocks were drawn, then given back.
            let drawn = (tokens - 1 - v.accepted + v.drafted).div_ceil(4);
            rejected_a_block |= v.accepted < v.drafted && drawn > s.held;
        }
    }
    assert!(rejected_a_block, "a verification gave a block back");
    assert_eq!(
        outcome(&mut sub).end.map(|e| e.0),
        Some(FinishReason::Length)
    );
    let after = rig.s.pool_stats();
    assert_eq!(
        (after.reserved, after.held, after.free + after.cached),
        (0, 0, idle.free)
    );
    rig.assert_all_blocks_back();
}

#[test]
fn the_prefix_cache_never_holds_a_rejected_token() {
    let mut rig = Rig::new(speculating(5));
    // COPY's first step verifies [9, 9, 1, 2, 3] at positions 10..15 and
    // rejects them all (the model says 5).
    let mut first = rig.submit(past_eos(&COPY, 8));
    let reports = rig.run(60);
    let rejected = reports
        .iter()
        .flat_map(|r| &r.verified)
        .any(|v| v.accepted == 0);
    assert!(rejected);
    let first: Vec<u32> = COPY
        .iter()
        .copied()
        .chain(ids(&events(&mut first)))
        .collect();
    assert_eq!(first[9..], [4, 5, 6, 7, 8, 9, 10, 11]);
    // A prompt that follows the rejected drafts shares only the verified
    // blocks: [1, 2, 3, 4] and [9, 9, 1, 2]; the third block, [3, 4, 9, 9],
    // was never the sequence's.
    let follows_drafts: Vec<u32> = first[..10]
        .iter()
        .chain(&[9, 9, 1, 2, 3])
        .copied()
        .collect();
    let mut second = rig.submit(request(&follows_drafts, 2));
    let line = rig.run(60)[0].prefill_line.clone().unwrap();
    assert!(line.contains("#cached-token: 8,"), "{line}");
    // One that follows the accepted tokens shares the third block too, and
    // reads there the tokens it was cached under.
    let follows_output: Vec<u32> = first[..13].to_vec();
    let mut third = rig.submit(request(&follows_output, 2));
    let line = rig.run(60)[0].prefill_line.clone().unwrap();
    assert!(line.contains("#cached-token: 12,"), "{line}");
    let sequences = [
        first,
        follows_drafts
            .iter()
            .copied()
            .chain(ids(&events(&mut second)))
            .collect(),
        follows_output
            .iter()
            .copied()
            .chain(ids(&events(&mut third)))
            .collect(),
    ];
    assert_reads_are_verified(&rig, &sequences);
    rig.assert_all_blocks_back();
}

#[test]
fn a_client_gone_in_the_middle_of_a_verified_step_is_cancelled_alone() {
    // The victim copies its own prompt: every step verifies 5 drafts.
    let lap: Vec<u32> = (0..32).chain(0..3).collect();
    let mut model = FakeModel::new(4);
    let cfg = speculating(5);
    model.pools = cfg.pools.clone();
    // Armed, the next step drops the victim's receiver while it runs.
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let victim: Arc<Mutex<Option<Submission>>> = Arc::new(Mutex::new(None));
    let (a, v) = (Arc::clone(&armed), Arc::clone(&victim));
    model.during_step = Some(Box::new(move || {
        if a.load(std::sync::atomic::Ordering::SeqCst) {
            v.lock().unwrap().take();
        }
    }));
    let mut rig = Rig::with_model(model, cfg);
    let mut other = rig.submit(past_eos(&[5, 6, 7], 44));
    let sub = rig.submit(past_eos(&lap, 25));
    let victim_id = sub.id();
    *victim.lock().unwrap() = Some(sub);
    for tick in 0.. {
        assert!(tick < 30);
        let r = rig.tick();
        if r.verified
            .iter()
            .any(|v| v.id == victim_id && v.accepted == 5)
        {
            break;
        }
    }
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let r = rig.tick();
    // Its verification (of as many drafts as the rule tried) stopped at
    // the first token it could not send.
    let cut = r.verified.iter().find(|v| v.id == victim_id).unwrap();
    assert!(cut.drafted > 1, "{cut:?}");
    assert_eq!(cut.accepted, 1, "{cut:?}");
    rig.run(100);
    assert!(victim.lock().unwrap().is_none());
    let text = rig.h.metrics().render("m");
    assert!(
        text.contains("finished_total{reason=\"abort\"} 1"),
        "{text}"
    );
    // The other row got exactly what it gets alone without speculation.
    let (alone, _, _) = run_all(plain(), &[|| past_eos(&[5, 6, 7], 44)]);
    assert_eq!(events(&mut other), alone[0]);
    rig.assert_all_blocks_back();
}

#[test]
fn a_request_that_opts_out_never_verifies() {
    let (with, verified, _) = run_all(speculating(5), &[|| past_eos(&[5, 6, 7], 44)]);
    assert!(!verified.is_empty());
    let (without, verified, _) = run_all(
        speculating(5),
        &[|| {
            let mut r = past_eos(&[5, 6, 7], 44);
            r.sampling.disable_spec_decode = true;
            r
        }],
    );
    assert!(verified.is_empty());
    assert_eq!(with, without);
}

#[test]
fn a_model_with_windows_or_recurrent_state_runs_without_speculation() {
    for kind in [CacheKind::Window(8), CacheKind::State] {
        let mut cfg = speculating(5);
        cfg.set_pool(kind, 16);
        cfg.prefix_caching = false;
        assert!(cfg.speculation_off_reason().is_some());
        let mut rig = Rig::new(cfg);
        let mut sub = rig.submit(past_eos(&[5, 6, 7], 40));
        let reports = rig.run(200);
        assert!(reports.iter().all(|r| r.verified.is_empty()), "{kind}");
        assert_eq!(ids(&events(&mut sub)).len(), 40, "{kind}");
        assert!(
            !rig.h.metrics().render("m").contains("spec_decode"),
            "{kind}"
        );
    }
}

impl Rig {
    /// Ticks as a device would take them: each tick lasts `cost(tokens)`
    /// of the step it runs. Returns the reports until idle.
    fn run_timed(&mut self, limit: usize, cost: impl Fn(usize) -> Duration) -> Vec<TickReport> {
        let mut reports = Vec::new();
        let mut tokens = 0;
        loop {
            self.now += cost(tokens);
            let r = self.s.tick(self.now);
            tokens = r.tokens;
            reports.push(r);
            if self.s.is_idle() {
                return reports;
            }
            assert!(reports.len() < limit, "not idle after {limit} ticks");
        }
    }
}

/// Share of decode steps that verified drafts.
fn verified_share(reports: &[TickReport]) -> f64 {
    let decoding = reports.iter().filter(|r| !r.decoded.is_empty()).count();
    let verified = reports.iter().filter(|r| !r.verified.is_empty()).count();
    verified as f64 / decoding as f64
}

#[test]
fn speculation_runs_while_it_pays_and_turns_itself_off_where_it_does_not() {
    // One row copying its prompt on a memory-bound device (a step costs
    // its weights' read: 10 ms, plus 0.1 ms a token): nearly every step
    // verifies.
    let memory_bound = |tokens: usize| Duration::from_micros(10_000 + 100 * tokens as u64);
    let mut rig = Rig::new(speculating(5));
    let lap: Vec<u32> = (0..32).chain(0..3).collect();
    let _copying = rig.submit(past_eos(&lap, 28));
    let reports = rig.run_timed(200, memory_bound);
    assert!(
        verified_share(&reports) > 0.5,
        "{}",
        verified_share(&reports)
    );
    // Eight rows on a compute-bound device (1 ms a token) whose drafts are
    // never right (each token's earlier copy was followed by another): after
    // the first measurements, hardly a step verifies.
    let compute_bound = |tokens: usize| Duration::from_micros(200 + 1_000 * tokens as u64);
    let mut rig = Rig::new(speculating(5));
    let wrong: Vec<u32> = (0..16u32).flat_map(|t| [t, (t + 7) % 32]).collect();
    let subs: Vec<Submission> = (0..8)
        .map(|i| {
            let mut p = wrong.clone();
            p.push(i);
            rig.submit(past_eos(&p, 20))
        })
        .collect();
    let reports = rig.run_timed(400, compute_bound);
    assert!(
        verified_share(&reports) < 0.15,
        "{}",
        verified_share(&reports)
    );
    let text = rig.h.metrics().render("m");
    assert!(
        text.contains("ferrox_spec_decode_steps_total{decision=\"declined\"}"),
        "{text}"
    );
    drop(subs);
}

/// The chi-squared statistic of `counts` against probabilities `p`.
fn chi_squared(counts: &[usize], p: &[f64]) -> f64 {
    let n: usize = counts.iter().sum();
    let n = n as f64;
    counts
        .iter()
        .zip(p)
        .map(|(&c, &p)| (c as f64 - n * p).powi(2) / (n * p))
        .sum()
}

#[test]
fn rejection_sampling_keeps_the_target_distribution() {
    // Prompt: `c, v, v + 1 + shift` for every token v, then `c`. The first
    // token y1 is sampled after `c`; the tail `[c, y1]` occurred once, so
    // the draft is `y1 + 1 + shift`: the target's favourite (shift 0) or
    // a token it rarely picks (shift 4). Over many seeds the verified
    // token's distribution must be the target's: favourite y1 + 1 at
    // e^2 / (e^2 + 31), any other at 1 / (e^2 + 31).
    const C: u32 = 16;
    const SEEDS: u64 = 2500;
    let favourite = 2f64.exp() / (2f64.exp() + 31.0);
    let p: Vec<f64> = (0..VOCAB)
        .map(|d| {
            if d == 1 {
                favourite
            } else {
                (1.0 - favourite) / 31.0
            }
        })
        .collect();
    for shift in [0u32, 4] {
        let prompt: Vec<u32> = (0..VOCAB as u32)
            .flat_map(|v| [C, v, (v + 1 + shift) % VOCAB as u32])
            .chain([C])
            .collect();
        let mut cfg = speculating(1);
        cfg.max_seqs = 1;
        cfg.max_queue = SEEDS as usize;
        cfg.max_model_len = 128;
        cfg.set_pool(CacheKind::Full, 256);
        let mut model = FakeModel::new(4);
        model.pools = cfg.pools.clone();
        model.peak = 2.0;
        let mut rig = Rig::with_model(model, cfg);
        let mut subs: Vec<Submission> = (0..SEEDS)
            .map(|seed| {
                let mut r = past_eos(&prompt, 3);
                r.sampling.temperature = 1.0;
                r.sampling.seed = seed;
                rig.submit(r)
            })
            .collect();
        let reports = rig.run(SEEDS as usize * 8);
        let verified: HashSet<RequestId> = reports
            .iter()
            .flat_map(|r| &r.verified)
            .map(|v| v.id)
            .collect();
        assert!(verified.len() > SEEDS as usize / 2, "{}", verified.len());
        let mut counts = vec![0usize; VOCAB];
        for sub in subs.iter_mut().filter(|s| verified.contains(&s.id())) {
            let got = ids(&events(sub));
            counts[((got[1] + VOCAB as u32 - got[0]) % VOCAB as u32) as usize] += 1;
        }
        // 31 degrees of freedom: 61.1 is the 0.999 quantile.
        let chi2 = chi_squared(&counts, &p);
        assert!(chi2 < 61.1, "shift {shift}: chi2 {chi2:.1} over {counts:?}");
    }
}

mod draft_model;
