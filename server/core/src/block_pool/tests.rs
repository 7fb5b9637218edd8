//! The pool's accounting: leases, reservations, the prefix cache and its
//! eviction order.

use std::collections::HashSet;

use super::*;
use crate::block_hash::BlockHasher;

const BS: usize = 2;

fn hasher() -> BlockHasher {
    BlockHasher::new("test-model/f32", BS)
}

/// A reservation for `prompt` plus `gen` tokens, as the engine asks it.
fn ask<'a>(hashes: &'a [BlockHash], prompt: usize, generate: usize) -> Reservation<'a> {
    Reservation {
        hashes,
        max_cached: (prompt - 1) / BS,
        now: prompt.div_ceil(BS),
        total: (prompt + generate).div_ceil(BS),
    }
}

/// Runs a sequence's whole prompt into its lease, as the worker does after
/// computing it: every block marked written, every full block offered.
fn compute(lease: &mut BlockLease, hashes: &[BlockHash], prompt: usize) {
    lease.commit(prompt.div_ceil(BS), &hashes[..prompt / BS]);
}

/// A lease for `tokens` whose prompt has been computed.
fn computed(pool: &BlockPool, tokens: &[u32], generate: usize) -> BlockLease {
    let hashes = hasher().chain(tokens);
    let mut lease = pool.reserve(&ask(&hashes, tokens.len(), generate)).unwrap();
    compute(&mut lease, &hashes, tokens.len());
    lease
}

fn stats(total: usize, reserved: usize, pinned: usize, cached: usize, free: usize) -> PoolStats {
    PoolStats {
        total,
        reserved,
        pinned,
        cached,
        free,
        ..PoolStats::default()
    }
}

/// The stats without `filled` and `held`, which the tests that care check on
/// their own.
fn shape(pool: &BlockPool) -> PoolStats {
    PoolStats {
        filled: 0,
        held: 0,
        ..pool.stats()
    }
}

#[test]
fn blocks_come_back_on_drop() {
    let pool = BlockPool::new(10);
    let a = pool.allocate(4).unwrap();
    let b = pool.allocate(6).unwrap();
    assert_eq!((pool.used(), pool.free()), (10, 0));
    drop(a);
    assert_eq!((pool.used(), pool.free()), (6, 4));
    drop(b);
    assert_eq!((pool.used(), pool.free(), pool.total()), (0, 10, 10));
}

#[test]
fn exhaustion_is_an_error_and_takes_nothing() {
    let pool = BlockPool::new(5);
    let _held = pool.allocate(3).unwrap();
    let err = pool.allocate(3).unwrap_err();
    assert!(matches!(
        err,
        Error::PoolExhausted {
            asked: 3,
            free: 2,
            total: 5
        }
    ));
    assert_eq!(pool.free(), 2);
    assert!(pool.allocate(2).is_ok());
}

#[test]
fn hit_partial_hit_and_miss() {
    let pool = BlockPool::new(32);
    let h = hasher();
    drop(computed(&pool, &[1, 2, 3, 4, 5, 6, 7], 0));
    // (prompt, cached blocks): whole run, a shared first block, nothing in
    // common, and a prompt that is exactly the cached run (its last block is
    // recomputed so the request has logits).
    let cases: [(&[u32], usize); 5] = [
        (&[1, 2, 3, 4, 5, 6, 9], 3),
        (&[1, 2, 3, 9, 5, 6, 7], 1),
        (&[9, 2, 3, 4, 5, 6, 7], 0),
        (&[1, 2, 3, 4], 1),
        (&[1, 2, 3, 4, 5], 2),
    ];
    for (prompt, want) in cases {
        let hashes = h.chain(prompt);
        let lease = pool.reserve(&ask(&hashes, prompt.len(), 2)).unwrap();
        assert_eq!(lease.cached_blocks(), want, "{prompt:?}");
        assert_eq!(lease.len(), prompt.len().div_ceil(BS), "{prompt:?}");
    }
}

#[test]
fn the_same_block_after_another_prefix_is_a_miss() {
    let pool = BlockPool::new(16);
    drop(computed(&pool, &[1, 2, 3, 4, 5], 0));
    // Block [3, 4] is cached, but after [1, 2]: after [7, 8] it is not.
    let hashes = hasher().chain(&[7, 8, 3, 4, 5]);
    assert_eq!(pool.cached_prefix(&hashes), 0);
    assert_eq!(pool.cached_prefix(&hasher().chain(&[1, 2, 3, 4, 5])), 2);
}

#[test]
fn shared_blocks_are_pinned_once_and_cached_when_the_last_lease_ends() {
    let pool = BlockPool::new(20);
    let tokens = [1, 2, 3, 4, 5, 6, 7];
    // 4 blocks now (3 full), 2 more promised.
    let a = computed(&pool, &tokens, 4);
    assert_eq!(shape(&pool), stats(20, 6, 3, 0, 14));
    let b = computed(&pool, &tokens, 4);
    assert_eq!(b.cached_blocks(), 3);
    assert_eq!(&b.blocks()[..3], &a.blocks()[..3], "shared, not copied");
    assert_ne!(b.blocks()[3], a.blocks()[3], "the partial block is its own");
    // Reserved: 3 shared + 2 own partial blocks + 2 x 2 promised.
    assert_eq!(shape(&pool), stats(20, 9, 3, 0, 11));
    assert_eq!(pool.stats().filled, 5);
    drop(a);
    assert_eq!(shape(&pool), stats(20, 6, 3, 0, 14), "b still pins them");
    drop(b);
    assert_eq!(shape(&pool), stats(20, 0, 0, 3, 17));
    assert_eq!(pool.stats().filled, 0);
    assert_eq!(pool.free(), 20, "cached blocks count as free");
}

#[test]
fn eviction_is_least_recently_used_and_a_lease_tail_goes_first() {
    let pool = BlockPool::new(6);
    let h = hasher();
    let (x, y) = ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]);
    drop(computed(&pool, &x, 0)); // caches x's 2 full blocks, frees 1
    drop(computed(&pool, &y, 0)); // then y's
    assert_eq!(shape(&pool), stats(6, 0, 0, 4, 2));
    // Touch x again: now y is the least recently used.
    drop(computed(&pool, &x, 0));
    // 4 blocks needed, 2 free: the 2 evicted are y's, tail first.
    let a = pool.allocate(3).unwrap();
    assert_eq!(pool.cached_prefix(&h.chain(&y)), 1, "y's tail went first");
    let _b = pool.allocate(1).unwrap();
    assert_eq!(pool.cached_prefix(&h.chain(&y)), 0);
    assert_eq!(pool.cached_prefix(&h.chain(&x)), 2, "x survives");
    drop(a);
}

#[test]
fn a_full_pool_whose_only_room_is_evictable_still_admits() {
    let pool = BlockPool::new(4);
    drop(computed(&pool, &[1, 2, 3, 4, 5, 6, 7, 8], 0));
    assert_eq!(shape(&pool), stats(4, 0, 0, 4, 0));
    let lease = pool.allocate(4).unwrap();
    assert_eq!(lease.len(), 4);
    assert_eq!(shape(&pool), stats(4, 4, 0, 0, 0));
}

#[test]
fn a_pinned_block_is_never_evicted() {
    let pool = BlockPool::new(5);
    let tokens = [1, 2, 3, 4, 5];
    let pinning = computed(&pool, &tokens, 0); // 2 full + 1 partial
    // 2 blocks are free; asking for 3 must fail rather than evict.
    assert!(matches!(
        pool.allocate(3),
        Err(Error::PoolExhausted { free: 2, .. })
    ));
    let other = pool.allocate(2).unwrap();
    assert_eq!(pool.cached_prefix(&hasher().chain(&tokens)), 2);
    drop(other);
    drop(pinning);
}

#[test]
fn pinning_an_evictable_block_counts_against_the_reservation() {
    // 4 blocks: [1,2] and [3,4] cached. A prompt of [1, 2, 3, 4, 5] hits
    // both, needs 1 block now and asks 4 more to generate: 5 of which 2
    // are cached, 3 new, but pinning the hits leaves only 2 to take.
    let pool = BlockPool::new(4);
    drop(computed(&pool, &[1, 2, 3, 4], 0));
    let hashes = hasher().chain(&[1, 2, 3, 4, 5]);
    let err = pool.reserve(&ask(&hashes, 5, 4)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::PoolExhausted {
                asked: 3,
                free: 2,
                total: 4
            }
        ),
        "{err}"
    );
    assert_eq!(shape(&pool), stats(4, 0, 0, 2, 2), "took nothing");
    let lease = pool.reserve(&ask(&hashes, 5, 2)).unwrap();
    assert_eq!((lease.cached_blocks(), lease.capacity()), (2, 4));
}

#[test]
fn promised_blocks_are_drawn_as_the_sequence_grows_and_no_further() {
    let pool = BlockPool::new(6);
    let mut a = pool.reserve(&ask(&[], 3, 5)).unwrap(); // 2 now, 4 in all
    assert_eq!((a.len(), a.capacity()), (2, 4));
    assert_eq!(pool.free(), 2, "the promise is not for others");
    assert!(pool.allocate(3).is_err());
    let _b = pool.allocate(2).unwrap();
    a.grow(3).unwrap();
    a.grow(3).unwrap();
    assert_eq!(a.len(), 3);
    a.grow(4).unwrap();
    let err = a.grow(5).unwrap_err();
    assert!(matches!(
        err,
        Error::OverReservation {
            asked: 5,
            reserved: 4
        }
    ));
    assert_eq!(a.blocks().iter().collect::<HashSet<_>>().len(), 4);
    drop(a);
    assert_eq!(pool.used(), 2);
}

#[test]
fn a_duplicate_block_stays_private_and_the_first_copy_stays_cached() {
    let pool = BlockPool::new(8);
    let tokens = [1, 2, 3, 4, 5];
    let hashes = hasher().chain(&tokens);
    // Both admitted before either computed: neither hits.
    let mut a = pool.reserve(&ask(&hashes, 5, 0)).unwrap();
    let mut b = pool.reserve(&ask(&hashes, 5, 0)).unwrap();
    assert_eq!(b.cached_blocks(), 0);
    compute(&mut a, &hashes, 5);
    compute(&mut b, &hashes, 5);
    assert_eq!(pool.stats().pinned, 2, "only a's copies are cached");
    let a_blocks = a.blocks()[..2].to_vec();
    drop(b);
    drop(a);
    assert_eq!(shape(&pool), stats(8, 0, 0, 2, 6));
    let c = pool.reserve(&ask(&hashes, 5, 0)).unwrap();
    assert_eq!(&c.blocks()[..2], &a_blocks[..]);
}

#[test]
fn churn_never_over_commits_and_the_counts_add_up() {
    let pool = BlockPool::new(64);
    let h = hasher();
    let mut leases: Vec<(BlockLease, Vec<BlockHash>, usize)> = Vec::new();
    let mut step = 0usize;
    for round in 0..400usize {
        // Prompts from a few families, so some share prefixes.
        let family = (round % 5) as u32;
        let len = (round * 7) % 13 + 1;
        let tokens: Vec<u32> = (0..len as u32).map(|i| family * 100 + i).collect();
        let hashes = h.chain(&tokens);
        match pool.reserve(&ask(&hashes, len, round % 6)) {
            Ok(mut lease) => {
                compute(&mut lease, &hashes, len);
                leases.push((lease, hashes, len));
            }
            Err(_) => {
                step = (step + 3) % leases.len().max(1);
                if !leases.is_empty() {
                    leases.swap_remove(step);
                }
            }
        }
        for (lease, _, _) in leases.iter_mut().step_by(3) {
            let cap = lease.capacity();
            lease.grow((lease.len() + 1).min(cap)).unwrap();
        }
        // A block a lease took for itself is in no other lease's own part;
        // only cached blocks are shared.
        let s = pool.stats();
        let mut own = HashSet::new();
        let mut held = HashSet::new();
        for (lease, _, _) in &leases {
            for &b in &lease.blocks()[lease.cached_blocks()..] {
                assert!(own.insert(b), "block {b} taken twice");
            }
            held.extend(lease.blocks().iter().copied());
        }
        let promised: usize = leases.iter().map(|l| l.0.capacity() - l.0.len()).sum();
        assert_eq!(s.reserved, held.len() + promised);
        assert_eq!(s.reserved + s.cached + s.free, 64);
        assert!(s.pinned <= s.reserved);
    }
    leases.clear();
    let s = pool.stats();
    assert_eq!(
        (s.reserved, s.pinned, s.filled, s.cached + s.free),
        (0, 0, 0, 64)
    );
    assert_eq!(pool.free(), 64);
}

#[test]
fn the_event_log_follows_what_is_cached_and_evicted() {
    let pool = BlockPool::with_event_log(3, 64, 5);
    let a: Vec<u32> = vec![1, 2, 3, 4, 5];
    let chain = hasher().chain(&a);
    drop(computed(&pool, &a, 0));
    let p = pool.kv_events(0, 5);
    let mut want = chain.clone();
    want.sort_unstable();
    assert_eq!((p.stored.clone(), p.cursor), (want, 2));
    // Another prompt needs all 3 blocks: both cached ones are evicted.
    let b: Vec<u32> = vec![9, 9, 9, 9, 9, 9];
    let lease = computed(&pool, &b, 0);
    let p = pool.kv_events(2, 5);
    let mut evicted = chain.clone();
    evicted.sort_unstable();
    assert_eq!(p.evicted, evicted);
    let held: HashSet<BlockHash> = hasher().chain(&b).into_iter().collect();
    assert_eq!(p.stored.iter().copied().collect::<HashSet<_>>(), held);
    // A reader of another pool gets the held set whole.
    let r = pool.kv_events(p.cursor, 6);
    assert!(r.reset);
    assert_eq!(r.stored.into_iter().collect::<HashSet<_>>(), held);
    drop(lease);
    // No log: empty pages.
    assert_eq!(BlockPool::new(2).kv_events(0, 0), KvEventsPage::default());
}

#[test]
fn a_window_gives_blocks_back_and_keeps_its_reservation() {
    let pool = BlockPool::new(10);
    // A windowed lease: 4 blocks reserved, drawn as the sequence grows.
    let mut lease = pool
        .reserve(&Reservation {
            total: 4,
            ..Reservation::default()
        })
        .unwrap();
    let other = pool.allocate(6).unwrap();
    lease.grow(4).unwrap();
    lease.commit(4, &[]);
    assert_eq!((pool.stats().held, pool.stats().filled), (10, 4));
    // The window has left the first two: they go back to the pool...
    lease.release_before(2);
    // `other` took ids 0..6 first.
    assert_eq!(lease.blocks(), [RELEASED, RELEASED, 8, 9]);
    assert_eq!((lease.held(), lease.len(), lease.capacity()), (2, 4, 6));
    let s = pool.stats();
    assert_eq!((s.held, s.filled, s.reserved, s.free), (8, 2, 10, 0));
    // ...but stay promised to the lease: nobody else can take them.
    assert!(pool.allocate(1).is_err());
    // The table grows by the same entries, the positions keep their place.
    lease.grow(6).unwrap();
    assert_eq!(&lease.blocks()[..2], [RELEASED; 2]);
    assert_eq!((lease.held(), pool.stats().held), (4, 10));
    assert!(lease.grow(7).is_err(), "never past the reservation");
    // Giving back again, or less, changes nothing; then more.
    lease.release_before(1);
    lease.release_before(2);
    assert_eq!(lease.held(), 4);
    lease.release_before(5);
    assert_eq!((lease.held(), pool.stats().held, pool.used()), (1, 7, 10));
    lease.commit(6, &[]);
    // The drop gives back the rest, held and promised: nothing leaks.
    drop(lease);
    drop(other);
    let s = pool.stats();
    assert_eq!((s.reserved, s.held, s.filled, s.free), (0, 0, 0, 10));
}

#[test]
fn a_window_releases_cached_blocks_to_the_cache() {
    let pool = BlockPool::new(4);
    let tokens = [1u32, 2, 3, 4, 5, 6];
    let hashes = hasher().chain(&tokens);
    let mut lease = pool.reserve(&ask(&hashes, 6, 0)).unwrap();
    compute(&mut lease, &hashes, 6);
    lease.release_before(1);
    // The first block stays cached, unpinned; committing again skips it.
    assert_eq!(shape(&pool), stats(4, 3, 2, 1, 0));
    lease.commit(3, &hashes);
    assert_eq!(pool.cached_prefix(&hashes), 3);
    drop(lease);
    assert_eq!(shape(&pool), stats(4, 0, 0, 3, 1));
}

#[test]
fn a_truncated_lease_gives_back_its_rejected_blocks_and_keeps_its_reservation() {
    let pool = BlockPool::new(10);
    let tokens = [1, 2, 3];
    let mut lease = computed(&pool, &tokens, 9); // 6 blocks reserved, 2 held
    let before = pool.stats();
    assert_eq!((before.reserved, before.held, before.filled), (6, 2, 2));
    // A verification draws for 3 draft tokens past the 4th token (blocks
    // of 2: 4 held), then keeps only the first draft.
    lease.grow(4).unwrap();
    assert_eq!(pool.stats().held, 4);
    lease.truncate(3);
    assert_eq!(pool.stats(), PoolStats { held: 3, ..before });
    // A block holding tokens, or cached, is never given back here.
    lease.truncate(0);
    assert_eq!((lease.len(), lease.capacity()), (2, 6));
    assert_eq!(pool.stats(), before);
    // What was given back may be drawn again, up to the reservation.
    lease.grow(6).unwrap();
    assert!(lease.grow(7).is_err());
    drop(lease);
    let after = pool.stats();
    assert_eq!(
        (after.reserved, after.held, after.free + after.cached),
        (0, 0, 10)
    );
}
