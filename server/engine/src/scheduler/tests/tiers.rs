//! The lower KV tiers through the worker: a prompt evicted from the device
//! pool comes back from the tier, holding the right tokens; a damaged copy
//! is recomputed; a later process on the same directory hits; another
//! tenant never does.

use super::*;
use crate::fixtures::{Chunk, eventually};
use ferrox_plan::{KvTier, OffloadTier};

/// 3 full blocks of 4 tokens and one of 2.
const A: [u32; 14] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14];

fn tiered(dir: &std::path::Path) -> EngineConfig {
    let mut c = EngineConfig {
        kv_offload: vec![OffloadTier::Disk {
            path: dir.display().to_string(),
            bytes: 1 << 20,
        }],
        ..config()
    };
    c.set_pool(CacheKind::Full, 8);
    c
}

/// Runs `prompt` alone to the end.
fn answer(rig: &mut Rig, req: GenerationRequest) -> Outcome {
    let mut sub = rig.submit(req);
    rig.run(60);
    outcome(&mut sub)
}

fn cached(o: &Outcome) -> usize {
    o.end.as_ref().map_or(usize::MAX, |e| e.1.cached_tokens)
}

/// A's blocks leave the device pool: other prompts take every block.
fn evict_a(rig: &mut Rig) {
    for k in 0..3u32 {
        let other: Vec<u32> = (0..14).map(|i| 20 + k * 3 + i % 3).collect();
        answer(rig, request(&other, 3));
    }
    let hashes = BlockHasher::new("fake", 4).chain(&A);
    assert_eq!(
        rig.s.pools.full().cached_prefix(&hashes),
        0,
        "A still cached"
    );
}

#[test]
fn an_evicted_prompt_comes_back_from_disk_with_its_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(tiered(dir.path()));
    let first = answer(&mut rig, request(&A, 3));
    let on_disk = |rig: &Rig| rig.h.tier_blocks()[0].1;
    eventually("A written", || on_disk(&rig) >= 4);
    evict_a(&mut rig);
    take_calls(&rig);
    let again = answer(&mut rig, request(&A, 3));
    // The fake model fails a step whose earlier positions hold nothing, and
    // answers from what it holds: same tokens, only the last 2 computed.
    assert_eq!((again.ids.clone(), cached(&again)), (first.ids.clone(), 12));
    let calls = take_calls(&rig);
    assert!(
        matches!(&calls[0], Call::Step { prefill, .. } if matches!(prefill[..], [Chunk { len: 2, pos: 12, .. }])),
        "{calls:?}"
    );
    rig.assert_all_blocks_back();
    let text = rig.h.metrics().render("m");
    assert!(
        text.contains("ferrox_kv_tier_hits_total{tier=\"disk\"} 3"),
        "{text}"
    );
    assert!(
        text.contains("vllm:external_prefix_cache_hits_total{model_name=\"m\"} 12"),
        "{text}"
    );

    // Another tenant's salt never hits; a damaged copy is recomputed.
    evict_a(&mut rig);
    let salted = GenerationRequest {
        cache_salt: Some("tenant-b".into()),
        ..request(&A, 3)
    };
    let other = answer(&mut rig, salted);
    assert_eq!((other.ids.clone(), cached(&other)), (first.ids.clone(), 0));
    evict_a(&mut rig);
    let file = |i: usize| {
        let name = BlockHasher::new("fake", 4).chain(&A)[i].to_string();
        dir.path().join(&name[..2]).join(format!("{name}.kvb"))
    };
    let mut d = std::fs::read(file(1)).unwrap();
    let last = d.len() - 1;
    d[last] ^= 0xff;
    std::fs::write(file(1), &d).unwrap();
    // The first block is read back; the damaged second and the third after
    // it are computed again.
    let damaged = answer(&mut rig, request(&A, 3));
    assert_eq!(
        (damaged.ids.clone(), cached(&damaged)),
        (first.ids.clone(), 4)
    );
    let text = rig.h.metrics().render("m");
    assert!(
        text.contains("ferrox_kv_tier_corrupt_total{tier=\"disk\"} 1"),
        "{text}"
    );
    rig.assert_all_blocks_back();

    // A later process on the same directory: the recomputed copy is there.
    eventually("A rewritten", || {
        std::fs::read(file(1)).is_ok_and(|r| r != d)
    });
    drop(rig);
    let mut later = Rig::new(tiered(dir.path()));
    assert_eq!(later.h.tier_blocks()[0].0, KvTier::Disk);
    let back = answer(&mut later, request(&A, 3));
    assert_eq!((back.ids.clone(), cached(&back)), (first.ids, 12));
    later.assert_all_blocks_back();
}

#[test]
fn a_row_cancelled_while_its_blocks_are_read_gives_them_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(tiered(dir.path()));
    answer(&mut rig, request(&A, 3));
    eventually("A written", || rig.h.tier_blocks()[0].1 >= 4);
    evict_a(&mut rig);
    let sub = rig.submit(request(&A, 3));
    rig.tick();
    drop(sub);
    rig.run(60);
    rig.assert_all_blocks_back();
}
