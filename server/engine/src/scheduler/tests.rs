//! The worker's invariants, driven tick by tick over the fake model.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::*;
use crate::fixtures::{
    Call, ConfigPools, EOS, FakeModel, Outcome, VOCAB, config, letters, pools, request,
};
use crate::{GenerationRequest, Liveness, Submission};

struct Rig {
    s: Scheduler<FakeModel>,
    h: EngineHandle,
    now: Instant,
    calls: Arc<Mutex<Vec<Call>>>,
    contexts: Arc<Mutex<Vec<Vec<u32>>>>,
}

impl Rig {
    fn new(config: EngineConfig) -> Self {
        let mut model = FakeModel::new(config.block_size);
        model.pools = config.pools.clone();
        Rig::with_model(model, config)
    }

    fn with_model(model: FakeModel, config: EngineConfig) -> Self {
        let calls = Arc::clone(&model.calls);
        let contexts = Arc::clone(&model.contexts);
        let now = Instant::now();
        let metrics = Arc::new(Metrics::new().unwrap());
        let (s, h) = Scheduler::new(model, config, metrics, now).expect("the pool is the model's");
        Rig {
            s,
            h,
            now,
            calls,
            contexts,
        }
    }

    fn submit(&self, req: GenerationRequest) -> Submission {
        self.h.submit(req, self.now).expect("accepted")
    }

    fn tick(&mut self) -> TickReport {
        self.now += Duration::from_millis(10);
        self.s.tick(self.now)
    }

    /// Ticks until idle; panics if that takes more than `limit` ticks.
    fn run(&mut self, limit: usize) -> Vec<TickReport> {
        // The first tick drains the channel, where submissions wait.
        let mut reports = vec![self.tick()];
        while !self.s.is_idle() {
            assert!(reports.len() < limit, "not idle after {limit} ticks");
            reports.push(self.tick());
        }
        reports
    }

    fn assert_all_blocks_back(&self) {
        assert_eq!(self.s.blocks_used(), 0, "leaked KV blocks");
        assert_eq!(self.h.metrics().kv_used(), 0);
    }
}

fn outcome(sub: &mut Submission) -> Outcome {
    let mut o = Outcome::default();
    o.absorb(std::iter::from_fn(|| sub.try_next()));
    o
}

fn usage(prompt_tokens: usize, completion_tokens: usize) -> Usage {
    Usage {
        prompt_tokens,
        completion_tokens,
        cached_tokens: 0,
    }
}

#[test]
fn every_way_out_returns_the_reservation_once() {
    // (name, request, expected finish, expected text)
    let mut with_stop = request(&[6], 10);
    with_stop.stop = vec!["ij".into()];
    let mut with_stop_id = request(&[6], 10);
    with_stop_id.stop_token_ids = vec![9];
    let mut past_eos = request(&[29], 4);
    past_eos.ignore_eos = true;
    let mut eos_but_stop_id = request(&[29], 6);
    eos_but_stop_id.ignore_eos = true;
    eos_but_stop_id.stop_token_ids = vec![1];
    // min_tokens: the model's EOS (after 30, 31) is masked at the third
    // token, so the fake model's flat row gives token 1 and counts on.
    let mut min_past_eos = request(&[29], 5);
    min_past_eos.min_tokens = 3;
    let mut min_past_stop_id = request(&[6], 5);
    min_past_stop_id.stop_token_ids = vec![8];
    min_past_stop_id.min_tokens = 3;
    // ... and a stop string inside the first min_tokens is text.
    let mut min_past_stop = request(&[6], 6);
    min_past_stop.stop = vec!["ij".into()];
    min_past_stop.min_tokens = 4;
    // At min_tokens the end counts again.
    let mut min_then_eos = request(&[27], 10);
    min_then_eos.min_tokens = 2;
    let mut keep_stop = request(&[6], 10);
    keep_stop.stop = vec!["ij".into()];
    keep_stop.include_stop_str = true;
    let cases: Vec<(&str, GenerationRequest, FinishReason, usize, String)> = vec![
        (
            "length",
            request(&[1, 2, 3], 5),
            FinishReason::Length,
            5,
            letters(4..9),
        ),
        (
            "eos",
            request(&[29], 10),
            FinishReason::Stop,
            3,
            letters([30, 31]),
        ),
        ("stop string", with_stop, FinishReason::Stop, 3, "h".into()),
        (
            "stop token id",
            with_stop_id,
            FinishReason::Stop,
            3,
            letters([7, 8]),
        ),
        (
            "ignore_eos",
            past_eos,
            FinishReason::Length,
            4,
            letters([30, 31, EOS, 1]),
        ),
        (
            "ignore_eos keeps stop ids",
            eos_but_stop_id,
            FinishReason::Stop,
            4,
            letters([30, 31, EOS]),
        ),
        (
            "min_tokens masks the end token",
            min_past_eos,
            FinishReason::Length,
            5,
            letters([30, 31, 1, 2, 3]),
        ),
        (
            "min_tokens masks stop ids",
            min_past_stop_id,
            FinishReason::Length,
            5,
            letters([7, 1, 2, 3, 4]),
        ),
        (
            "min_tokens: a stop string before it is text",
            min_past_stop,
            FinishReason::Length,
            6,
            letters(7..13),
        ),
        (
            "min_tokens: the end counts once reached",
            min_then_eos,
            FinishReason::Stop,
            5,
            letters([28, 29, 30, 31]),
        ),
        (
            "include_stop_str keeps the stop",
            keep_stop,
            FinishReason::Stop,
            3,
            "hij".into(),
        ),
    ];
    for (name, req, reason, generated, text) in cases {
        let mut rig = Rig::new(config());
        let prompt = req.prompt.len();
        let mut sub = rig.submit(req);
        rig.run(50);
        let got = outcome(&mut sub);
        assert_eq!(got.end, Some((reason, usage(prompt, generated))), "{name}");
        assert_eq!(got.text, text, "{name}");
        rig.assert_all_blocks_back();
        assert_eq!(rig.h.in_flight(), 0, "{name}");
    }
}

#[test]
fn in_flight_counts_a_request_from_submission_to_its_last_event() {
    // Drain waits on this count, so it must not dip while a request moves
    // from the line into a row, nor stay up after any way out.
    let mut cfg = config();
    cfg.max_seqs = 1;
    let mut rig = Rig::new(cfg);
    let _a = rig.submit(request(&[1; 8], 3));
    let b = rig.submit(request(&[1; 2], 3));
    let mut bad = rig.submit(request(&[VOCAB as u32], 3));
    assert_eq!(rig.h.in_flight(), 3);
    rig.tick();
    assert_eq!(rig.h.in_flight(), 3, "admitted or waiting, all in flight");
    drop(b);
    rig.tick();
    assert_eq!(rig.h.in_flight(), 2, "the cancelled waiting one has ended");
    rig.run(30);
    assert!(outcome(&mut bad).error.is_some());
    assert_eq!(rig.h.in_flight(), 0);
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Waiting,
    Prefilling,
    Decoding,
}

#[test]
fn cancel_in_each_state_frees_blocks_within_one_tick() {
    // max_seqs 2: the blocker and the target run, the third waits. Prompts of
    // 12 under a budget of 4 a tick alternate, so the target prefills on
    // ticks 2, 4, 6 (sampling its first token on 6) and decodes from tick 7. Blocker and target hold 13 blocks each
    // (12 + 40 tokens), the small one 2.
    let mut cfg = config();
    cfg.max_seqs = 2;
    let cases = [
        (State::Waiting, 1, 26),
        (State::Prefilling, 3, 15),
        (State::Decoding, 7, 15),
    ];
    for (state, ticks, used_after) in cases {
        for by_drop in [false, true] {
            let name = format!("{state:?} by_drop={by_drop}");
            let mut rig = Rig::new(cfg.clone());
            let _blocker = rig.submit(request(&[1; 12], 40));
            let target = rig.submit(request(&[2; 12], 40));
            let small = rig.submit(request(&[3; 4], 4));
            let target_id = target.id();
            for _ in 0..ticks {
                rig.tick();
            }
            let seen = match rig.s.rows.get(&target_id) {
                None => State::Waiting,
                Some(r) if r.is_prefilling() => State::Prefilling,
                Some(_) => State::Decoding,
            };
            let (mut victim, _other) = if state == State::Waiting {
                assert_eq!(rig.s.queued(), 1, "{name}");
                (small, target)
            } else {
                assert_eq!(seen, state, "{name}");
                (target, small)
            };
            if by_drop {
                drop(victim);
                rig.tick();
            } else {
                victim.cancel();
                rig.tick();
                let got = outcome(&mut victim);
                assert_eq!(
                    got.end.map(|e| e.0),
                    Some(FinishReason::Cancelled),
                    "{name}"
                );
            }
            // Gone within the tick; if a slot opened, the small one took it.
            assert_eq!(rig.s.blocks_used(), used_after, "{name}");
            assert_eq!((rig.s.running(), rig.s.queued()), (2, 0), "{name}");
            let text = rig.h.metrics().render("m");
            assert!(
                text.contains("finished_total{reason=\"abort\"} 1"),
                "{name}"
            );
        }
    }
}

#[test]
fn a_cancel_that_beats_its_job_is_carried_until_the_job_arrives() {
    let mut rig = Rig::new(config());
    rig.h.cancel(1);
    rig.tick();
    let mut first = rig.submit(request(&[1, 2], 3));
    let mut second = rig.submit(request(&[1, 2], 3));
    assert_eq!(second.id(), 1);
    rig.run(20);
    assert_eq!(
        outcome(&mut first).end.map(|e| e.0),
        Some(FinishReason::Length)
    );
    let got = outcome(&mut second);
    assert_eq!(got.end, Some((FinishReason::Cancelled, usage(2, 0))));
    assert!(got.ids.is_empty());
    // A stale cancel (an id already gone) is dropped, not carried forever.
    rig.h.cancel(0);
    rig.tick();
    assert!(rig.s.carried.is_empty());
}

#[test]
fn fifo_head_of_line_blocks_smaller_requests_behind_it() {
    let mut cfg = config();
    cfg.set_pool(CacheKind::Full, 8);
    let mut rig = Rig::new(cfg);
    let mut a = rig.submit(request(&[1; 4], 20)); // 6 blocks
    let mut b = rig.submit(request(&[1; 4], 12)); // 4 blocks: does not fit
    let mut c = rig.submit(request(&[1; 2], 2)); // 1 block: would fit, must wait
    let r = rig.tick();
    assert_eq!(r.admitted.new_seqs, 1);
    assert_eq!((rig.s.running(), rig.s.queued()), (1, 2));
    while outcome(&mut a).end.is_none() {
        assert_eq!(rig.s.queued(), 2, "c skipped ahead of b");
        rig.tick();
    }
    let r = rig.tick();
    assert_eq!(r.admitted.new_seqs, 2, "b then c once a left");
    rig.run(40);
    assert!(outcome(&mut b).end.is_some() && outcome(&mut c).end.is_some());
    rig.assert_all_blocks_back();
}

#[test]
fn the_sequence_cap_counts_prefilling_rows() {
    let mut cfg = config();
    cfg.max_seqs = 2;
    cfg.prefill_chunk = 2;
    let mut rig = Rig::new(cfg);
    let subs: Vec<_> = (0..3).map(|_| rig.submit(request(&[5; 8], 2))).collect();
    let r = rig.tick();
    // Both admitted rows are still prefilling; the third must wait.
    assert_eq!(r.admitted.new_seqs, 2);
    assert_eq!((rig.s.running(), rig.s.queued()), (2, 1));
    for _ in 0..5 {
        assert!(rig.s.running() <= 2);
        rig.tick();
    }
    rig.run(30);
    drop(subs);
    rig.assert_all_blocks_back();
}

/// The model calls made since the last look, emptied.
fn take_calls(rig: &Rig) -> Vec<Call> {
    std::mem::take(&mut *rig.calls.lock().unwrap())
}

#[test]
fn prefill_shares_a_token_budget_round_robin_and_decode_runs_meanwhile() {
    // Budget 4, prompts of 6 and 3 tokens.
    let mut rig = Rig::new(config());
    let mut a = rig.submit(request(&[1; 6], 3));
    let mut b = rig.submit(request(&[1; 3], 3));
    let (ida, idb) = (a.id(), b.id());
    let ticks: Vec<_> = (0..4).map(|_| rig.tick()).collect();
    let prefilled: Vec<_> = ticks.iter().map(|r| r.prefilled.clone()).collect();
    let decoded: Vec<_> = ticks.iter().map(|r| r.decoded.clone()).collect();
    // Tick 1: a takes the whole budget and goes to the back. Tick 2: b's
    // whole prompt, then a gets the 1 token left. Tick 3: a's last token.
    assert_eq!(
        prefilled,
        vec![
            vec![(ida, 4)],
            vec![(idb, 3), (ida, 1)],
            vec![(ida, 1)],
            vec![]
        ]
    );
    // b's prompt is done on tick 2, where it samples its first token; it
    // decodes from tick 3, in the same step as a's last chunk.
    assert_eq!(decoded, vec![vec![], vec![], vec![idb], vec![ida, idb]]);
    assert_eq!(outcome(&mut b).ids, vec![2, 3, 4]);
    assert_eq!(outcome(&mut a).ids, vec![2, 3]);
    rig.run(20);
    assert_eq!(outcome(&mut a).ids, vec![4]);
}

#[test]
fn short_prompts_prefill_together_in_the_decode_step() {
    let mut cfg = config();
    cfg.max_seqs = 9;
    cfg.max_queue = 16;
    cfg.prefill_chunk = 40;
    let mut rig = Rig::new(cfg);
    let mut long = rig.submit(request(&[1, 2], 20));
    rig.tick();
    assert_eq!(
        outcome(&mut long).ids,
        vec![3],
        "decoding before the others arrive"
    );
    take_calls(&rig);
    let mut subs: Vec<_> = (0..8u32)
        .map(|i| rig.submit(request(&[i + 5, i + 6, i + 7, i + 8], 4)))
        .collect();
    let r = rig.tick();
    assert_eq!(r.admitted.new_seqs, 8);
    let want: Vec<_> = subs.iter().map(|s| (s.id(), 4)).collect();
    assert_eq!(r.prefilled, want, "all eight in the first tick");
    assert_eq!(r.decoded, vec![long.id()], "the decoding row did not wait");
    let calls = take_calls(&rig);
    assert_eq!(calls.len(), 1, "one model call for the tick: {calls:?}");
    assert!(
        matches!(&calls[0], Call::Step { prefill, decode: 1 }
            if prefill.len() == 8 && prefill.iter().all(|c| c.len == 4 && c.pos == 0)),
        "{calls:?}"
    );
    assert_eq!(outcome(&mut long).ids, vec![4]);
    for (i, sub) in subs.iter_mut().enumerate() {
        assert_eq!(
            outcome(sub).ids,
            vec![i as u32 + 9],
            "first token after one tick"
        );
    }
    // From the next tick all nine decode together, one call per tick.
    let r = rig.tick();
    assert!(r.prefilled.is_empty());
    assert_eq!(r.decoded.len(), 9);
    let calls = take_calls(&rig);
    assert!(matches!(&calls[..], [Call::Step { prefill, decode: 9 }] if prefill.is_empty()));
}

#[test]
fn one_decode_step_serves_every_ready_row_and_each_gets_its_own_answer() {
    let prompts: [&[u32]; 3] = [&[3], &[10, 11], &[20, 21, 22]];
    let alone: Vec<Outcome> = prompts
        .iter()
        .zip([4, 6, 5])
        .map(|(p, n)| {
            let mut rig = Rig::new(config());
            let mut sub = rig.submit(request(p, n));
            rig.run(30);
            outcome(&mut sub)
        })
        .collect();
    let mut rig = Rig::new(config());
    let mut subs: Vec<_> = prompts
        .iter()
        .zip([4, 6, 5])
        .map(|(p, n)| rig.submit(request(p, n)))
        .collect();
    let reports = rig.run(30);
    assert!(reports.iter().any(|r| r.decoded.len() == 3));
    let steps = rig
        .calls
        .lock()
        .unwrap()
        .iter()
        .filter(|c| matches!(c, Call::Step { decode, .. } if *decode > 0))
        .count();
    assert!(
        steps < 4 + 6 + 5 - 3,
        "decode steps were not shared: {steps}"
    );
    for (sub, want) in subs.iter_mut().zip(alone) {
        assert_eq!(outcome(sub), want);
    }
}

#[test]
fn a_seed_gives_the_same_tokens_whatever_else_is_in_the_batch() {
    let sampled = |seed| {
        let mut r = request(&[4, 5], 12);
        r.sampling.temperature = 1.0;
        r.sampling.seed = seed;
        r.eos_token_ids.clear();
        r
    };
    let flat = || {
        let mut m = FakeModel::new(4);
        m.peak = 2.0;
        m
    };
    let mut rig = Rig::with_model(flat(), config());
    let mut alone = rig.submit(sampled(42));
    rig.run(30);
    let alone = outcome(&mut alone);
    let mut rig = Rig::with_model(flat(), config());
    let _noise = rig.submit(sampled(1));
    let mut batched = rig.submit(sampled(42));
    let _more = rig.submit(sampled(2));
    rig.run(30);
    assert_eq!(outcome(&mut batched), alone);
    // And the draws are not simply greedy, or this test could not fail.
    assert_ne!(alone.ids, (6..18).collect::<Vec<u32>>());
}

#[test]
fn refused_at_the_door() {
    let mut cfg = config();
    cfg.max_queue = 2;
    let mut rig = Rig::new(cfg);
    let now = rig.now;
    let too_long = rig.h.submit(request(&[1; 60], 10), now).err();
    assert!(matches!(
        too_long,
        Some(EngineError::TooLong {
            needed_tokens: 70,
            limit_tokens: 64,
            ..
        })
    ));
    // Each refused for the field named, none reaching the line.
    type Spoil = fn(&mut GenerationRequest);
    let invalid: [(&str, Spoil); 6] = [
        ("top_p", |r| r.sampling.top_p = 0.0),
        ("stop", |r| r.stop = vec!["x".into(); 17]),
        ("stop", |r| r.stop = vec!["y".repeat(257)]),
        ("stop_token_ids", |r| r.stop_token_ids = vec![1; 65]),
        ("max_tokens", |r| r.max_tokens = usize::MAX),
        ("min_tokens", |r| r.min_tokens = r.max_tokens + 1),
    ];
    for (field, spoil) in invalid {
        let mut bad = request(&[1], 2);
        spoil(&mut bad);
        let err = rig.h.submit(bad, now).err();
        assert_eq!(
            err.as_ref().and_then(EngineError::param),
            Some(field),
            "{field}"
        );
    }
    // The bounds themselves are allowed.
    let mut edge = request(&[1], 2);
    edge.stop = vec!["z".repeat(256); 16];
    edge.stop_token_ids = vec![1; 64];
    let mut edge = rig.submit(edge);
    rig.run(10);
    assert!(outcome(&mut edge).end.is_some());
    let _a = rig.submit(request(&[1], 2));
    let _b = rig.submit(request(&[1], 2));
    let full = rig.h.submit(request(&[1], 2), now).err();
    assert_eq!(full, Some(EngineError::QueueFull { max_queue: 2 }));
    rig.h.start_draining();
    assert_eq!(
        rig.h.submit(request(&[1], 2), now).err(),
        Some(EngineError::Draining)
    );
    let text = rig.h.metrics().render("m");
    for (reason, n) in [
        ("too_long", 2),
        ("invalid", 5),
        ("queue_full", 1),
        ("draining", 1),
    ] {
        let series = format!("ferrox_requests_rejected_total{{reason=\"{reason}\"}} {n}");
        assert!(text.contains(&series), "{series}");
    }
}

#[test]
fn a_token_outside_the_vocabulary_fails_and_frees_its_lease() {
    let mut rig = Rig::new(config());
    let mut bad = rig.submit(request(&[1, VOCAB as u32], 3));
    let mut biased = request(&[1], 3);
    biased.sampling.logit_bias = vec![(2, 1.0), (VOCAB as u32, 1.0)];
    let mut bad_bias = rig.submit(biased);
    let mut good = rig.submit(request(&[1], 3));
    rig.tick();
    let got = outcome(&mut bad);
    assert!(got.error.unwrap().contains("outside the vocabulary"));
    let got = outcome(&mut bad_bias).error.unwrap();
    assert!(
        got.contains(&format!("token id {VOCAB} is outside")),
        "{got}"
    );
    assert_eq!(rig.s.running(), 1);
    rig.run(20);
    assert!(outcome(&mut good).end.is_some());
    rig.assert_all_blocks_back();
}

#[test]
fn a_failed_step_fails_every_row_in_it_and_frees_their_blocks() {
    let mut model = FakeModel::new(4);
    model.fail_decode = true;
    let mut rig = Rig::with_model(model, config());
    let mut decoding = rig.submit(request(&[1, 2], 5));
    rig.tick();
    assert_eq!(
        outcome(&mut decoding).ids,
        vec![3],
        "prefill alone succeeds"
    );
    // The next step carries the decoding row and the new prompt's chunk.
    let mut prefilling = rig.submit(request(&[1; 6], 5));
    let r = rig.tick();
    assert_eq!((r.prefilled.len(), r.decoded.len()), (1, 1));
    rig.run(10);
    assert!(outcome(&mut decoding).error.unwrap().contains("injected"));
    assert!(outcome(&mut prefilling).error.unwrap().contains("injected"));
    rig.assert_all_blocks_back();
}

/// Outcomes of `reqs` run together on `model`, after every request ended.
fn run_together(model: FakeModel, reqs: Vec<GenerationRequest>) -> (Vec<Outcome>, Rig) {
    let mut rig = Rig::with_model(model, config());
    let mut subs: Vec<_> = reqs.into_iter().map(|r| rig.submit(r)).collect();
    rig.run(60);
    let outcomes = subs.iter_mut().map(outcome).collect();
    (outcomes, rig)
}

#[test]
fn a_row_the_model_cannot_run_fails_alone_and_the_others_are_intact() {
    // Token 20 is poison: a step that carries it fails whole, so only the
    // input check keeps the other rows alive. One row has it in its prompt;
    // one generates it (18 -> 19 -> 20) and must fail when it is fed back.
    let poisoned = || {
        let mut m = FakeModel::new(4);
        m.poison = Some(20);
        m
    };
    let reqs = || {
        vec![
            request(&[1, 2], 6),
            request(&[3, 20, 4], 6),
            request(&[18], 6),
            request(&[5, 6, 7, 8, 9], 6),
        ]
    };
    let alone: Vec<Outcome> = reqs()
        .into_iter()
        .map(|r| run_together(poisoned(), vec![r]).0.remove(0))
        .collect();
    let (together, rig) = run_together(poisoned(), reqs());
    assert!(together[1].error.as_deref().unwrap().contains("poison"));
    assert!(together[1].ids.is_empty());
    assert_eq!(together[2].ids, vec![19, 20]);
    assert!(together[2].error.as_deref().unwrap().contains("poison"));
    for i in [0, 3] {
        assert_eq!(together[i], alone[i], "request {i}");
        assert_eq!(
            together[i].end.as_ref().map(|e| e.0.clone()),
            Some(FinishReason::Length)
        );
    }
    assert_eq!(together[1..3], alone[1..3]);
    rig.assert_all_blocks_back();
    assert_eq!(rig.h.in_flight(), 0);
}

#[test]
fn a_failed_forward_is_retried_once_then_ends_only_the_rows_in_it() {
    let reqs = || vec![request(&[1, 2], 4), request(&[7; 6], 4)];
    let (clean, _) = run_together(FakeModel::new(4), reqs());
    assert!(clean.iter().all(|o| o.error.is_none() && o.ids.len() == 4));
    // (name, spoil the model, rows fail)
    type Spoil = fn(&mut FakeModel);
    let cases: [(&str, Spoil, bool); 3] = [
        ("fails once", |m| m.fail_next = 1, false),
        ("panics once", |m| m.panic_next = 1, false),
        ("fails twice", |m| m.fail_next = 2, true),
    ];
    for (name, spoil, fails) in cases {
        let mut model = FakeModel::new(4);
        spoil(&mut model);
        let (got, mut rig) = run_together(model, reqs());
        if fails {
            for o in &got {
                assert!(
                    o.error.as_deref().unwrap().contains("injected"),
                    "{name}: {o:?}"
                );
            }
        } else {
            assert_eq!(got, clean, "{name}");
        }
        rig.assert_all_blocks_back();
        // The worker goes on: the next request is served.
        let mut next = rig.submit(request(&[1, 2], 3));
        rig.run(20);
        assert_eq!(outcome(&mut next).ids, vec![3, 4, 5], "{name}");
        rig.assert_all_blocks_back();
    }
}

#[test]
fn status_lines_count_what_admission_and_decode_saw() {
    let mut cfg = config();
    cfg.max_seqs = 2;
    let mut rig = Rig::new(cfg);
    let _a = rig.submit(request(&[1; 3], 4));
    let _b = rig.submit(request(&[1; 5], 4));
    let _c = rig.submit(request(&[1; 2], 4));
    let r = rig.tick();
    // Counted at admission: the prompts' full lengths, not what this tick's
    // prefill chunks happened to process (a's 3 and b's first 1).
    assert_eq!(
        r.prefill_line.as_deref(),
        Some(
            "Prefill batch, #new-seq: 2, #new-token: 8, #cached-token: 0, token usage: 0.16, \
             #running-req: 2, #queue-req: 1"
        )
    );
    let r = rig.tick();
    assert_eq!(r.prefill_line, None);
    // Tick 2: b's last 4 tokens, a decodes (its first decode step: tick 1
    // prefilled both). KV: a 3 + 1, b 5. One token in the 20 ms since the
    // reporter started.
    assert_eq!(r.prefilled.len(), 1);
    assert_eq!(r.decoded.len(), 1);
    let line = r.decode_line.unwrap();
    assert!(
        line.starts_with(
            "Decode batch, #running-req: 2, #token: 9, token usage: 0.16, \
             gen throughput (token/s): 50.00"
        ),
        "{line}"
    );
    assert!(line.ends_with("#queue-req: 1"), "{line}");
}

#[test]
fn the_worker_thread_serves_and_idles() {
    let (h, _thread) = crate::worker::spawn(FakeModel::new(4), config()).unwrap();
    let mut subs: Vec<_> = (0..6)
        .map(|i| {
            h.submit(request(&[i + 1, i + 2], 5), Instant::now())
                .unwrap()
        })
        .collect();
    for (i, sub) in subs.iter_mut().enumerate() {
        let mut o = Outcome::default();
        o.absorb(std::iter::from_fn(|| sub.blocking_next()));
        let first = i as u32 + 3;
        assert_eq!(o.ids, (first..first + 5).collect::<Vec<_>>());
    }
    // The worker published its gauges after the last tick.
    for _ in 0..100 {
        if h.metrics().kv_used() == 0 && h.in_flight() == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("blocks still used after every request ended");
}

mod constraint;
mod prefix_cache;
mod prompt_logprobs;
mod recurrent;
mod speculative;
mod tiers;
mod window;
#[test]
fn liveness_sees_a_stalled_tick_and_a_dead_worker() {
    let bound = Duration::from_millis(100);
    let mut model = FakeModel::new(4);
    model.stall = Duration::from_millis(400);
    let die = Arc::clone(&model.die);
    let (h, thread) = crate::worker::spawn(model, config()).unwrap();
    assert_eq!(h.liveness(Instant::now(), bound), Liveness::Live, "idle");
    let mut sub = h.submit(request(&[1, 2], 2), Instant::now()).unwrap();
    std::thread::sleep(Duration::from_millis(250));
    assert!(
        matches!(h.liveness(Instant::now(), bound), Liveness::Stalled(d) if d > bound),
        "inside a 400 ms step"
    );
    let mut o = Outcome::default();
    o.absorb(std::iter::from_fn(|| sub.blocking_next()));
    assert_eq!(o.ids, vec![3, 4]);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        h.liveness(Instant::now(), bound),
        Liveness::Live,
        "idle again"
    );
    die.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut doomed = h.submit(request(&[1, 2], 2), Instant::now()).unwrap();
    thread.join().unwrap();
    assert_eq!(h.liveness(Instant::now(), bound), Liveness::Stopped);
    assert!(
        doomed.blocking_next().is_none(),
        "the dead worker's request ends"
    );
    assert_eq!(
        h.submit(request(&[1], 1), Instant::now()).err(),
        Some(EngineError::WorkerGone)
    );
}

#[test]
fn token_masks_steer_the_fake_model() {
    // The fake model's next token is last + 1 (all others at 0): a masked
    // prediction leaves a flat row, whose argmax is the lowest allowed id.
    use crate::SamplingParams;
    type Mask = fn(&mut SamplingParams);
    let cases: [(&str, Mask, Vec<u32>); 5] = [
        ("none", |_| {}, vec![2, 3, 4, 5]),
        (
            "allowed",
            |s| s.allowed_token_ids = Some(vec![9, 5]),
            vec![5, 5, 5, 5],
        ),
        (
            "a one-token bad word",
            |s| s.bad_words = vec![vec![3]],
            vec![2, EOS, 1, 2],
        ),
        (
            "a two-token bad word after its prefix",
            |s| s.bad_words = vec![vec![2, 3]],
            vec![2, EOS, 1, 2],
        ),
        (
            "a two-token bad word without its prefix",
            |s| s.bad_words = vec![vec![5, 3]],
            vec![2, 3, 4, 5],
        ),
    ];
    for (name, mask, want) in cases {
        let mut rig = Rig::new(config());
        let mut req = request(&[1], 4);
        req.ignore_eos = true;
        mask(&mut req.sampling);
        let mut sub = rig.submit(req);
        rig.run(20);
        assert_eq!(outcome(&mut sub).ids, want, "{name}");
        rig.assert_all_blocks_back();
    }
    // Empty lists are refused at the door, ids outside the vocabulary at
    // admission; both name the field.
    let mut rig = Rig::new(config());
    type Spoil = fn(&mut SamplingParams);
    let empty: [(&str, Spoil); 2] = [
        ("allowed_token_ids", |s| s.allowed_token_ids = Some(vec![])),
        ("bad_words", |s| s.bad_words = vec![vec![]]),
    ];
    for (field, spoil) in empty {
        let mut req = request(&[1], 2);
        spoil(&mut req.sampling);
        let err = rig.h.submit(req, Instant::now()).err();
        assert_eq!(err.as_ref().and_then(EngineError::param), Some(field));
    }
    let outside: [Spoil; 2] = [
        |s| s.allowed_token_ids = Some(vec![VOCAB as u32]),
        |s| s.bad_words = vec![vec![1, VOCAB as u32]],
    ];
    for spoil in outside {
        let mut req = request(&[1], 2);
        spoil(&mut req.sampling);
        let mut sub = rig.submit(req);
        rig.run(10);
        let got = outcome(&mut sub).error.unwrap_or_default();
        assert!(
            got.contains(&format!("token id {VOCAB} is outside")),
            "{got}"
        );
    }
    rig.assert_all_blocks_back();
}

#[test]
fn a_pool_that_is_not_the_models_cache_is_refused_at_start() {
    let cfg = config();
    // (model's blocks, model's block size): only the config's own geometry starts.
    for (blocks, block_size, starts) in [
        (cfg.kv_blocks(), cfg.block_size, true),
        (cfg.kv_blocks() - 1, cfg.block_size, false),
        (cfg.kv_blocks() + 1, cfg.block_size, false),
        (cfg.kv_blocks(), cfg.block_size * 2, false),
    ] {
        let mut model = FakeModel::new(block_size);
        model.pools = pools(&[(CacheKind::Full, blocks)]);
        let metrics = Arc::new(Metrics::new().unwrap());
        match Scheduler::new(model, cfg.clone(), metrics, Instant::now()) {
            Ok((s, _)) => {
                assert!(starts, "{blocks} x {block_size} started");
                assert_eq!(s.pool_stats().total, cfg.kv_blocks());
            }
            Err(e) => {
                assert!(!starts, "{blocks} x {block_size} refused: {e}");
                assert_eq!(
                    e,
                    EngineError::PoolMismatch {
                        model_pools: format!("full={blocks}"),
                        model_block_size: block_size,
                        pools: format!("full={}", cfg.kv_blocks()),
                        block_size: cfg.block_size,
                    }
                );
            }
        }
    }
}
