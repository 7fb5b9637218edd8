//! The window memory model through the worker: window reclaim, admission as
//! the plan counts it, and cancellation in every state, over a fake model
//! whose window pool's layers read only their window (a released block there
//! is an error) and must agree with the KV pool.

use ferrox_core::RELEASED;
use ferrox_plan::{KvDtype, ModelGeometry, PlanConfig, SlidingWindow};

use super::*;
use crate::fixtures::pools;

/// Blocks of 4, chunks of 4, a KV pool of `kv` blocks and an 8-token window
/// pool of `window` blocks: a row reserves at most ceil((8 + 4 - 1) / 4) + 1
/// = 4 window blocks, however long it runs.
fn windowed(kv: usize, window: usize) -> EngineConfig {
    EngineConfig {
        pools: pools(&[(CacheKind::Full, kv), (CacheKind::Window(8), window)]),
        max_model_len: 256,
        max_seqs: 64,
        max_queue: 16,
        ..config()
    }
}

/// A request that runs to `max_tokens` (the fake model's next token cycles
/// through its end token).
fn long(prompt: &[u32], max_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        ignore_eos: true,
        ..request(prompt, max_tokens)
    }
}

fn window_stats(rig: &Rig) -> PoolStats {
    rig.s.stats_of(CacheKind::Window(8)).unwrap()
}

#[test]
fn a_long_windowed_row_holds_no_more_than_its_window() {
    let mut rig = Rig::new(windowed(64, 4));
    assert!(
        !rig.h.config().prefix_cache_on(),
        "no prefix cache with windows"
    );
    // 10 + 150 tokens: 40 KV blocks, and 4 window blocks reserved.
    let mut sub = rig.submit(long(&[1; 10], 150));
    let id = sub.id();
    let mut ticks = 0;
    let mut lines = Vec::new();
    // The first tick drains the channel, where the submission waits.
    while ticks == 0 || !rig.s.is_idle() {
        let report = rig.tick();
        lines.extend(report.decode_line);
        let w = window_stats(&rig);
        assert!(w.held <= 4, "tick {ticks}: {w:?}");
        if let Some(row) = rig.s.rows.get(&id) {
            assert_eq!(
                w.reserved, 4,
                "tick {ticks}: the reservation keeps its size"
            );
            // The table keeps its shape: position p is still entry p / 4.
            let tables = row.kv.tables();
            let table = |kind| ferrox_core::batch_model::table_of(&tables, kind).unwrap();
            let (full, window) = (table(CacheKind::Full), table(CacheKind::Window(8)));
            let held = window.iter().filter(|&&b| b != RELEASED).count();
            assert_eq!(held, w.held);
            assert!(window.len() <= full.len());
            if row.kv_tokens() >= 24 {
                assert!(window[..2].iter().all(|&b| b == RELEASED), "{tables:?}");
            }
        }
        ticks += 1;
        assert!(ticks < 400, "not idle");
    }
    let o = outcome(&mut sub);
    assert_eq!(o.error, None, "{o:?}");
    assert_eq!(o.end.map(|e| e.0), Some(FinishReason::Length), "{ticks}");
    assert_eq!(o.ids.len(), 150);
    // The status lines carry the window pool beside the KV pool.
    assert!(
        lines.iter().all(|l| l.contains(", window usage: ")),
        "{lines:?}"
    );
    rig.assert_all_blocks_back();
    let w = window_stats(&rig);
    assert_eq!((w.reserved, w.held, w.free), (0, 0, 4));
}

#[test]
fn the_window_pool_admits_the_sequences_the_plan_counts_and_never_runs_dry() {
    // One full-attention and one 8-token-window layer of 1 KV head of 2
    // dims in f16: 8 bytes a layer-token, 32 a block. Typical sequences of
    // 12 + 20 tokens take 8 KV blocks and 4 window blocks: 384 bytes.
    let geometry = ModelGeometry {
        layers: 2,
        kv_heads: 1,
        head_dim: 2,
        kv_dtype: KvDtype::F16,
        context_length: 256,
        sliding_windows: vec![SlidingWindow {
            window: 8,
            layers: 1,
        }],
        ..ModelGeometry::default()
    };
    let config = PlanConfig {
        block_size: 4,
        prefill_chunk: 4,
        max_model_len: Some(64),
        max_seqs_cap: Some(64),
        typical_seq_len: Some(32),
        ..PlanConfig::default()
    };
    // 5 typical sequences' bytes and a little: 42 KV and 21 window blocks.
    let plan = ferrox_plan::plan_for_kv_bytes(&geometry, &config, 5 * 384 + 100).unwrap();
    assert_eq!(
        (plan.sizes(), plan.max_seqs),
        (vec![(CacheKind::Full, 42), (CacheKind::Window(8), 21)], 5)
    );
    let cfg = EngineConfig {
        max_model_len: 64,
        ..windowed(42, 21)
    };
    let mut rig = Rig::new(cfg);
    let mut subs: Vec<Submission> = (0..12)
        .map(|i| rig.submit(long(&[i + 1; 12], 20)))
        .collect();
    let first = rig.tick();
    // Both pools bind at the plan's count: a sixth would need 8 KV blocks
    // (2 left) and 4 window blocks (1 left).
    assert_eq!(first.admitted.new_seqs, 5);
    let mut most = 0;
    while !rig.s.is_idle() {
        rig.tick();
        most = most.max(rig.s.running());
    }
    assert_eq!(most, 5);
    for s in &mut subs {
        let o = outcome(s);
        let end = o.end.as_ref().map(|e| e.0.clone());
        assert_eq!(
            (end, o.ids.len()),
            (Some(FinishReason::Length), 20),
            "{o:?}"
        );
    }
    rig.assert_all_blocks_back();
}

#[test]
fn a_cancel_returns_every_block_of_every_pool_in_every_state() {
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum State {
        Waiting,
        Prefilling,
        Decoding,
    }
    for state in [State::Waiting, State::Prefilling, State::Decoding] {
        // The blocker fills the window pool while the victim should wait.
        let window_blocks = if state == State::Waiting { 4 } else { 8 };
        let mut rig = Rig::new(windowed(64, window_blocks));
        let _blocker = rig.submit(long(&[9], 30));
        // 40 prompt tokens: ten chunks of 4.
        let victim = rig.submit(long(&[3; 40], 20));
        let id = victim.id();
        rig.tick();
        while state == State::Decoding && rig.s.rows.get(&id).is_some_and(|r| r.is_prefilling()) {
            rig.tick();
        }
        let seen = match rig.s.rows.get(&id) {
            None => State::Waiting,
            Some(r) if r.is_prefilling() => State::Prefilling,
            Some(_) => State::Decoding,
        };
        assert_eq!(seen, state);
        let before = rig.s.pools_stats();
        drop(victim);
        rig.tick();
        let after = rig.s.pools_stats();
        assert!(!rig.s.rows.contains_key(&id) && rig.s.queued() == 0);
        // It reserved 15 KV blocks (60 tokens) and 4 window blocks.
        let own = |n| if state == State::Waiting { 0 } else { n };
        let freed: Vec<(CacheKind, usize)> = before
            .iter()
            .zip(&after)
            .map(|(b, a)| (b.0, b.1.reserved - a.1.reserved))
            .collect();
        let want = [(CacheKind::Full, own(15)), (CacheKind::Window(8), own(4))];
        assert_eq!(freed, want, "{state:?}");
        rig.run(200);
        for (spec, s) in rig.s.pools_stats() {
            assert_eq!(
                (s.reserved, s.held, s.filled),
                (0, 0, 0),
                "{state:?} {spec:?}"
            );
        }
        rig.assert_all_blocks_back();
    }
}
