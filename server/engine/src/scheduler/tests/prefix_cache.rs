//! The prefix cache through the worker: hits counted where they happen,
//! shared blocks that hold the right tokens, and exact accounting on every
//! way out.

use super::*;
use crate::fixtures::Chunk;

/// Blocks of 4 tokens: this prompt has 3 full blocks and one of 2.
const SHARED: [u32; 14] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14];

fn with_cache(on: bool) -> EngineConfig {
    EngineConfig {
        prefix_caching: on,
        ..config()
    }
}

/// `SHARED[..n]` followed by `tail`.
fn prompt(n: usize, tail: &[u32]) -> Vec<u32> {
    SHARED[..n].iter().chain(tail).copied().collect()
}

/// The pool once idle: nothing reserved, pinned or filled, every block
/// cached or free.
fn assert_idle_pool(rig: &Rig, cached: usize) {
    let s = rig.s.pool_stats();
    assert_eq!(
        (s.reserved, s.pinned, s.filled, s.cached, s.free),
        (0, 0, 0, cached, s.total - cached),
        "{s:?}"
    );
    rig.assert_all_blocks_back();
}

/// Every context the model attended to is a prefix of one of `sequences`:
/// a shared block never held another request's tokens.
fn assert_contexts_are_prefixes(rig: &Rig, sequences: &[Vec<u32>]) {
    let contexts = rig.contexts.lock().unwrap();
    assert!(!contexts.is_empty());
    for c in contexts.iter() {
        assert!(
            sequences.iter().any(|s| s.starts_with(c)),
            "context {c:?} is no request's sequence"
        );
    }
}

#[test]
fn a_repeated_prompt_is_taken_from_the_cache_and_answers_the_same() {
    let p = prompt(14, &[]);
    let mut rig = Rig::new(with_cache(true));
    let mut first = rig.submit(request(&p, 3));
    let reports = rig.run(20);
    let line = reports[0].prefill_line.as_deref().unwrap();
    assert!(line.contains("#new-token: 14, #cached-token: 0"), "{line}");
    let first = outcome(&mut first);
    // 14 prompt tokens + 2 fed back: 4 full blocks computed, all cached.
    assert_idle_pool(&rig, 4);
    take_calls(&rig);
    let mut second = rig.submit(request(&p, 3));
    let r = rig.tick();
    let line = r.prefill_line.as_deref().unwrap();
    assert!(
        line.contains("#new-seq: 1, #new-token: 2, #cached-token: 12"),
        "{line}"
    );
    assert_eq!(r.admitted.cached_tokens, 12);
    // Only the last 2 prompt tokens ran, from position 12, in the first
    // block the second request owns.
    let calls = take_calls(&rig);
    assert!(
        matches!(&calls[..], [Call::Step { prefill, decode: 0 }]
            if matches!(prefill[..], [Chunk { len: 2, pos: 12, .. }])),
        "{calls:?}"
    );
    rig.run(20);
    let mut second = outcome(&mut second);
    // The usage says where the prompt came from; nothing else differs.
    let cached = |o: &Outcome| o.end.as_ref().map(|e| e.1.cached_tokens);
    assert_eq!((cached(&first), cached(&second)), (Some(0), Some(12)));
    if let Some(end) = second.end.as_mut() {
        end.1.cached_tokens = 0;
    }
    assert_eq!(second, first);
    let text = rig.h.metrics().render("m");
    for (series, want) in [
        ("ferrox_prefix_cache_queries_total", 28),
        ("ferrox_prefix_cache_hits_total", 12),
        ("vllm:prefix_cache_hits_total{model_name=\"m\"}", 12),
        ("ferrox_prompt_tokens_total", 28),
    ] {
        assert!(
            text.contains(&format!("{series} {want}\n")),
            "{series}\n{text}"
        );
    }
    assert_contexts_are_prefixes(&rig, &[[p.clone(), first.ids.clone()].concat()]);
}

#[test]
fn outputs_with_the_cache_equal_those_without_it() {
    // Prompts sharing 0, 1, many blocks and the whole prompt with the first,
    // run together under a budget of 4 prompt tokens a tick, then again
    // once their blocks are cached.
    let prompts = [
        prompt(14, &[]),
        prompt(3, &[20, 21, 22, 23, 24]),
        prompt(4, &[25, 26]),
        prompt(12, &[27, 28, 29]),
        prompt(14, &[]),
    ];
    let run = |on: bool| {
        let mut cfg = with_cache(on);
        cfg.max_seqs = 8;
        cfg.set_pool(CacheKind::Full, 64);
        let mut rig = Rig::new(cfg);
        let mut outcomes = Vec::new();
        let mut cached = 0;
        for _round in 0..2 {
            let mut subs: Vec<_> = prompts.iter().map(|p| rig.submit(request(p, 4))).collect();
            let reports = rig.run(80);
            cached += reports
                .iter()
                .map(|r| r.admitted.cached_tokens)
                .sum::<usize>();
            outcomes.extend(subs.iter_mut().map(outcome));
        }
        (outcomes, cached, rig)
    };
    let (off, none, _) = run(false);
    let (mut on, cached, rig) = run(true);
    assert_eq!(none, 0);
    // The first round is admitted in one tick, before anything is computed:
    // no hits. The second finds every full block but each prompt's last:
    // 12 + 4 + 4 + 12 + 12 tokens, and each request's usage says so.
    assert_eq!(cached, 44);
    let per_request: Vec<usize> = on
        .iter_mut()
        .map(|o| o.end.as_mut().unwrap().1.cached_tokens)
        .collect();
    assert_eq!(per_request, [0, 0, 0, 0, 0, 12, 4, 4, 12, 12]);
    for o in &mut on {
        o.end.as_mut().unwrap().1.cached_tokens = 0;
    }
    assert_eq!(on, off);
    let sequences: Vec<Vec<u32>> = prompts
        .iter()
        .zip(&on)
        .map(|(p, o)| [p.clone(), o.ids.clone()].concat())
        .collect();
    assert_contexts_are_prefixes(&rig, &sequences);
}

#[test]
fn with_the_cache_off_nothing_is_shared_or_kept() {
    let mut rig = Rig::new(with_cache(false));
    let p = prompt(14, &[]);
    for _ in 0..2 {
        let _sub = rig.submit(request(&p, 3));
        let reports = rig.run(20);
        assert_eq!(reports[0].admitted.cached_tokens, 0);
    }
    assert_idle_pool(&rig, 0);
    let text = rig.h.metrics().render("m");
    assert!(
        text.contains("ferrox_prefix_cache_queries_total 0\n"),
        "{text}"
    );
}

#[test]
fn every_way_out_leaves_the_shared_blocks_cached_and_nothing_held() {
    // A first request caches SHARED's 3 full blocks; each case then runs a
    // request that pins them, ends its own way, and must leave exactly those
    // 3 (plus its own full blocks) cached, nothing reserved.
    let mut stop = request(&prompt(12, &[15]), 10);
    stop.stop = vec!["r".into()]; // 'r' is token 17, the second generated
    let mut stop_id = request(&prompt(12, &[15]), 10);
    stop_id.stop_token_ids = vec![17];
    // (name, request, its end (None: an error), whether decode fails, full
    // blocks cached after it)
    let cases: Vec<(&str, GenerationRequest, Option<FinishReason>, bool, usize)> = vec![
        // 13 prompt + 2 fed = 15 tokens in the KV: 3 full blocks.
        (
            "length",
            request(&prompt(12, &[15]), 3),
            Some(FinishReason::Length),
            false,
            3,
        ),
        // 28..31 then EOS (0): 17 tokens in the KV, 4 full blocks.
        (
            "eos",
            request(&prompt(12, &[27]), 10),
            Some(FinishReason::Stop),
            false,
            4,
        ),
        ("stop string", stop, Some(FinishReason::Stop), false, 3),
        ("stop token id", stop_id, Some(FinishReason::Stop), false, 3),
        (
            "bad token",
            request(&prompt(12, &[VOCAB as u32]), 3),
            None,
            false,
            3,
        ),
        ("model error", request(&prompt(12, &[15]), 3), None, true, 3),
    ];
    for (name, req, end, fail_decode, full) in cases {
        let mut model = FakeModel::new(4);
        model.fail_decode = fail_decode;
        let mut rig = Rig::with_model(model, config());
        let _warm = rig.submit(request(&prompt(14, &[]), 1));
        rig.run(20);
        assert_idle_pool(&rig, 3);
        let mut sub = rig.submit(req);
        let reports = rig.run(30);
        assert_eq!(reports[0].admitted.cached_tokens, 12, "{name}");
        let got = outcome(&mut sub);
        assert_eq!(got.end.map(|e| e.0), end, "{name}");
        assert_eq!(got.error.is_some(), end.is_none(), "{name}");
        assert_idle_pool(&rig, full);
    }
}

#[test]
fn a_cancel_in_each_state_releases_exactly_its_own_blocks() {
    // The holder pins SHARED's 3 cached blocks and keeps decoding; the
    // victim shares them. Whenever the victim goes, the shared blocks stay
    // pinned by the holder and only the victim's own reservation returns.
    for state in [State::Waiting, State::Prefilling, State::Decoding] {
        let mut cfg = config();
        cfg.prefill_chunk = 1;
        cfg.max_seqs = if state == State::Waiting { 2 } else { 3 };
        let mut rig = Rig::new(cfg);
        let _warm = rig.submit(request(&prompt(14, &[]), 1));
        rig.run(40);
        let _holder = rig.submit(request(&prompt(12, &[2]), 30));
        let _blocker = rig.submit(request(&[9], 30));
        let victim = rig.submit(request(&prompt(12, &[20, 21, 22]), 5));
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
        let before = rig.s.pool_stats();
        drop(victim);
        rig.tick();
        let after = rig.s.pool_stats();
        assert!(!rig.s.rows.contains_key(&id) && rig.s.queued() == 0);
        // The victim reserved ceil((15 + 5) / 4) = 5 blocks, 3 of them the
        // shared ones: 2 of its own come back (none while it waited), and
        // the shared ones stay pinned by the holder, not cached-unpinned.
        let own = if state == State::Waiting { 0 } else { 2 };
        assert_eq!(before.reserved - after.reserved, own, "{state:?}");
        assert_eq!(after.cached, before.cached, "{state:?}");
        assert!(after.pinned >= 3, "{state:?}");
        assert_eq!(after.reserved + after.cached + after.free, after.total);
        rig.run(100);
        assert_eq!(rig.s.pool_stats().reserved, 0, "{state:?}");
    }
}

#[test]
fn a_head_that_fits_only_through_the_cache_is_admitted() {
    // 8 blocks. The runner holds 5 (20 tokens), of which the first 3 are
    // SHARED's. A second request for the same 12 + 5 + 3 tokens needs 5
    // blocks, 3 of them shared: it fits in the 3 left only with the cache.
    for on in [true, false] {
        let mut cfg = with_cache(on);
        cfg.set_pool(CacheKind::Full, 8);
        let mut rig = Rig::new(cfg);
        let p = prompt(12, &[20, 21, 22, 23, 24]);
        let _runner = rig.submit(request(&p, 3));
        rig.tick();
        rig.tick();
        rig.tick();
        assert_eq!(rig.s.running(), 1);
        let _second = rig.submit(request(&p, 3));
        let r = rig.tick();
        assert_eq!(r.admitted.new_seqs, usize::from(on), "cache {on}");
        rig.run(40);
    }
}

#[test]
fn a_pool_full_of_cached_blocks_still_admits_and_evicts_the_oldest() {
    let mut cfg = config();
    cfg.set_pool(CacheKind::Full, 16);
    cfg.max_model_len = 64;
    let mut rig = Rig::new(cfg);
    // Four different 16-token prompts, one after the other: each leaves its
    // 4 full blocks cached, and then no block is free.
    let prompts: Vec<Vec<u32>> = (0..4u32)
        .map(|i| (0..16).map(|t| (i * 7 + t) % 30 + 1).collect())
        .collect();
    for p in &prompts {
        let _s = rig.submit(request(p, 1));
        rig.run(20);
    }
    let s = rig.s.pool_stats();
    assert_eq!((s.cached, s.free), (16, 0), "{s:?}");
    // 60 tokens: 15 blocks, 10 of them at once, all evicted.
    let mut big = rig.submit(request(&[3; 40], 20));
    let r = rig.tick();
    assert_eq!(r.admitted.new_seqs, 1);
    // The oldest went first, each prompt's tail before its head.
    let h = ferrox_core::BlockHasher::new("fake", 4);
    let left: Vec<usize> = prompts
        .iter()
        .map(|p| rig.s.pools.full().cached_prefix(&h.chain(p)))
        .collect();
    assert_eq!(left, vec![0, 0, 2, 4]);
    rig.run(60);
    assert!(outcome(&mut big).end.is_some());
    rig.assert_all_blocks_back();
}

#[test]
fn only_requests_with_the_same_salt_share_blocks() {
    let p = prompt(14, &[]);
    let salted = |salt: Option<&str>| {
        let mut r = request(&p, 2);
        r.cache_salt = salt.map(String::from);
        r
    };
    let mut rig = Rig::new(with_cache(true));
    // (salt, prompt tokens it takes from the cache): the first of each salt
    // computes everything, including the blocks' tail it generated into.
    for (salt, cached) in [
        (Some("a"), 0),
        (Some("b"), 0),
        (None, 0),
        (Some("a"), 12),
        (Some("b"), 12),
        (None, 12),
    ] {
        let mut sub = rig.submit(salted(salt));
        rig.run(20);
        let got = outcome(&mut sub);
        assert_eq!(got.end.map(|e| e.1.cached_tokens), Some(cached), "{salt:?}");
    }
    let bad = salted(Some(""));
    let err = rig.h.submit(bad, Instant::now()).err();
    assert_eq!(
        err.as_ref().and_then(EngineError::param),
        Some("cache_salt")
    );
    rig.assert_all_blocks_back();
}

#[test]
fn the_handle_reports_the_cached_chain_by_the_handles_hasher() {
    let p = prompt(14, &[]);
    let mut rig = Rig::new(with_cache(true));
    let mut sub = rig.submit(request(&p, 2));
    rig.run(20);
    assert!(outcome(&mut sub).end.is_some());
    // What a router computes from the published root is what is cached.
    let root = rig.h.block_hasher().unwrap().root();
    let chain = ferrox_core::BlockHasher::from_root(root, 4).chain(&p);
    let page = rig.h.kv_events(0, 0);
    assert!(page.reset, "a first read is whole");
    for h in &chain {
        assert!(page.stored.contains(h), "{h} not reported");
    }
    let again = rig.h.kv_events(page.cursor, page.epoch);
    assert!(again.stored.is_empty() && !again.reset);
    rig.assert_all_blocks_back();
}
