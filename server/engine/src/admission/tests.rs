//! Admission: the door's refusals, the bound, strict FIFO, every pool.
use ferrox_core::BlockHasher;

use super::*;
use crate::fixtures::{ConfigPools, job, pools as sized, request};

const FULL: CacheKind = CacheKind::Full;
const WINDOW: CacheKind = CacheKind::Window(8);

fn config() -> EngineConfig {
    EngineConfig {
        max_model_len: 100,
        block_size: 4,
        pools: sized(&[(FULL, 20)]),
        ..EngineConfig::default()
    }
}

#[test]
fn refusal_at_the_door_names_the_numbers() {
    // (prompt, max_tokens, expected)
    let cases: Vec<(usize, usize, Result<usize, &str>)> = vec![
        (10, 6, Ok(4)),
        (10, 7, Ok(5)),
        (0, 5, Err("prompt")),
        (5, 0, Err("max_tokens")),
        // The pool holds 80 tokens, less than max_model_len.
        (70, 10, Ok(20)),
        (90, 10, Err("the KV pool's 20 blocks of 4 tokens")),
        (70, 11, Err("81 tokens")),
        (10, usize::MAX, Err("more than the server's limit")),
        // Sums past usize::MAX saturate rather than wrap to a small count.
        (5, usize::MAX, Err("max_tokens")),
        (usize::MAX, usize::MAX, Err("TooLong")),
        (1, usize::MAX - 1, Err("TooLong")),
    ];
    for (prompt, max, want) in cases {
        let got = check_fits(prompt, max, &config());
        match (got, want) {
            (Ok(b), Ok(w)) => assert_eq!(b, vec![(FULL, w)]),
            (Err(e), Err(w)) => {
                let text = format!("{e} {e:?}");
                assert!(text.contains(w), "{text}");
            }
            (g, w) => panic!("{prompt}+{max}: {g:?} vs {w:?}"),
        }
    }
    let err = check_fits(70, 11, &config()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "this request needs 81 tokens (70 prompt + 11 max_tokens), more than the \
         server's limit of 80 tokens (the KV pool's 20 blocks of 4 tokens)"
    );
    let mut long = config();
    long.set_pool(FULL, 100);
    let err = check_fits(90, 11, &long).unwrap_err().to_string();
    assert!(
        err.ends_with("limit of 100 tokens (--max-model-len)"),
        "{err}"
    );
}

/// A KV pool of 20 blocks of 4 and a window pool of `blocks` for an
/// 8-token window, chunks of 4: a row reserves at most ceil(11 / 4) + 1 =
/// 4 window blocks.
fn windowed(blocks: usize) -> EngineConfig {
    EngineConfig {
        prefill_chunk: 4,
        pools: sized(&[(FULL, 20), (WINDOW, blocks)]),
        ..config()
    }
}

#[test]
fn a_request_reserves_its_window_in_a_window_pool_and_the_door_names_the_pool() {
    // (prompt, max_tokens, window pool, blocks in each pool or the error)
    type Case<'a> = (usize, usize, usize, Result<Vec<usize>, &'a str>);
    let cases: Vec<Case> = vec![
        // Short: its whole length in both pools.
        (3, 2, 4, Ok(vec![2, 2])),
        (6, 2, 4, Ok(vec![2, 2])),
        // Long: the window plus a chunk, however long.
        (10, 6, 4, Ok(vec![4, 4])),
        (70, 10, 4, Ok(vec![20, 4])),
        // A window pool smaller than one reservation bounds the length.
        (6, 6, 3, Ok(vec![3, 3])),
        (
            10,
            3,
            3,
            Err(
                "more than the server's limit of 12 tokens (the 8-token window pool's \
                 3 blocks of 4 tokens, where a long sequence reserves 4)",
            ),
        ),
    ];
    for (prompt, max, window_blocks, want) in cases {
        let got = check_fits(prompt, max, &windowed(window_blocks));
        match (got, want) {
            (Ok(b), Ok(w)) => {
                let want: Vec<(CacheKind, usize)> = vec![(FULL, w[0]), (WINDOW, w[1])];
                assert_eq!(b, want, "{prompt}+{max}");
            }
            (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{e}"),
            (g, w) => panic!("{prompt}+{max}: {g:?} vs {w:?}"),
        }
    }
    // The arithmetic is ferrox-plan's, for any window.
    let w1024 = CacheKind::Window(1024);
    assert_eq!(blocks_needed(1000, w1024, 16, 512), 63);
    assert_eq!(blocks_needed(100_000, w1024, 16, 512), 97);
    assert_eq!(blocks_needed(100_000, CacheKind::State, 16, 512), 1);
    let widest = CacheKind::Window(u64::MAX);
    assert_eq!(blocks_needed(usize::MAX, widest, 1, 1), usize::MAX);
}

#[test]
fn admission_counts_blocks_in_every_pool() {
    let cfg = windowed(4);
    let pools = KvPools::new(&cfg.pools, 0);
    let bound = Arc::new(LineBound::new(8));
    let mut l = WaitingLine::new(Arc::clone(&bound), 4);
    let mut push = |prompt: &[u32], max| {
        bound.enter().unwrap();
        l.push(job(0, request(prompt, max), &cfg));
    };
    // 4 + 4 blocks in the KV pool, 4 in the window pool: the window pool
    // is full after the first, and the second waits though the KV pool
    // has room.
    push(&[1; 12], 4);
    push(&[1; 12], 4);
    let first = l.pop_admissible(0, 4, no_adapters(), &pools).ok().unwrap();
    assert_eq!(
        first
            .leases
            .iter()
            .map(|(k, x)| (*k, x.capacity()))
            .collect::<Vec<_>>(),
        [(FULL, 4), (WINDOW, 4)]
    );
    assert_eq!(
        l.pop_admissible(1, 4, no_adapters(), &pools).err(),
        Some(Blocked::BlockCap)
    );
    let s = pools.stats();
    assert_eq!(
        (s[0].1.reserved, s[1].1.reserved),
        (4, 4),
        "a refusal takes nothing"
    );
    drop(first);
    assert!(l.pop_admissible(0, 4, no_adapters(), &pools).is_ok());
}

/// One full-attention pool of `n` blocks.
fn pools(n: usize) -> KvPools {
    KvPools::new(&sized(&[(FULL, n)]), 0)
}

static NONE_RUNNING: std::sync::LazyLock<std::collections::HashSet<String>> =
    std::sync::LazyLock::new(Default::default);

fn no_adapters() -> AdapterCap<'static> {
    AdapterCap {
        running: &NONE_RUNNING,
        max: 1,
    }
}

fn line(max: usize) -> (WaitingLine, Arc<LineBound>) {
    let bound = Arc::new(LineBound::new(max));
    (WaitingLine::new(Arc::clone(&bound), 4), bound)
}

/// Joins `prompt` + `max_tokens` to the line, hashed with `hasher`;
/// returns its id.
fn join(
    l: &mut WaitingLine,
    bound: &LineBound,
    prompt: &[u32],
    max: usize,
    hasher: Option<&BlockHasher>,
) -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    bound.enter().unwrap();
    let id = NEXT.fetch_add(1, Ordering::SeqCst);
    let mut j = job(id, request(prompt, max), &config());
    j.hashes = hasher.map_or_else(Vec::new, |h| h.chain(prompt));
    l.push(j);
    id
}

#[test]
fn the_bound_counts_from_the_door_to_admission_or_cancel() {
    let (mut l, bound) = line(2);
    let a = join(&mut l, &bound, &[1], 3, None);
    join(&mut l, &bound, &[1], 3, None);
    assert_eq!(bound.enter(), Err(EngineError::QueueFull { max_queue: 2 }));
    let pool = pools(8);
    let got = l
        .pop_admissible(0, 4, no_adapters(), &pool)
        .ok()
        .map(|x| x.job.id);
    assert_eq!((got, bound.waiting()), (Some(a), 1));
    assert_eq!(l.remove(|_| true).len(), 1);
    assert_eq!((bound.waiting(), l.len()), (0, 0));
    bound.leave();
    assert_eq!(bound.waiting(), 0, "never below zero");
}

#[test]
fn strict_fifo_a_head_that_does_not_fit_stops_the_line() {
    let (mut l, bound) = line(8);
    let pool = pools(8);
    let _held = pool.full().allocate(4).unwrap();
    // (prompt, max_tokens): 6 blocks, then 1.
    let big = join(&mut l, &bound, &[1; 4], 20, None);
    join(&mut l, &bound, &[1; 2], 2, None);
    assert_eq!(
        l.pop_admissible(0, 4, no_adapters(), &pool).err(),
        Some(Blocked::BlockCap)
    );
    assert_eq!(l.len(), 2, "the small one did not skip ahead");
    assert_eq!(pool.used(), 4, "a refused head takes nothing");
    drop(_held);
    let first = l
        .pop_admissible(0, 4, no_adapters(), &pool)
        .ok()
        .map(|a| a.job.id);
    assert_eq!(first, Some(big));
}

#[test]
fn the_sequence_cap_and_the_empty_line() {
    let (mut l, bound) = line(8);
    let pool = pools(8);
    assert_eq!(
        l.pop_admissible(0, 1, no_adapters(), &pool).err(),
        Some(Blocked::Empty)
    );
    join(&mut l, &bound, &[1], 1, None);
    assert_eq!(
        l.pop_admissible(1, 1, no_adapters(), &pool).err(),
        Some(Blocked::SeqCap)
    );
    assert!(l.pop_admissible(0, 1, no_adapters(), &pool).is_ok());
}

#[test]
fn a_head_whose_adapter_cannot_join_stops_the_line() {
    let (mut l, bound) = line(8);
    let pool = pools(16);
    let adapter = |name: &str| {
        let a = ferrox_core::AdapterRef::new(name, &format!("{name}@0"), Arc::new(()));
        let mut r = request(&[1, 2], 2);
        r.adapter = Some(a);
        r
    };
    let push = |l: &mut WaitingLine, r, id| {
        bound.enter().unwrap();
        l.push(job(id, r, &config()));
    };
    push(&mut l, adapter("c"), 0);
    push(&mut l, request(&[1], 1), 1);
    push(&mut l, adapter("a"), 2);
    let running: std::collections::HashSet<String> = ["a@0".to_string(), "b@0".into()].into();
    let cap = |max| AdapterCap {
        running: &running,
        max,
    };
    // Two adapters run, max two: "c" waits and the base request behind it too.
    assert_eq!(
        l.pop_admissible(2, 8, cap(2), &pool).err(),
        Some(Blocked::AdapterCap)
    );
    assert_eq!(l.len(), 3);
    // Room for a third: "c" goes, then the base request, then "a" (running).
    let order: Vec<u64> = (0..3)
        .map(|_| l.pop_admissible(2, 8, cap(3), &pool).ok().unwrap().job.id)
        .collect();
    assert_eq!(order, [0, 1, 2]);
    // A running adapter always joins, whatever the cap.
    push(&mut l, adapter("b"), 3);
    assert!(l.pop_admissible(2, 8, cap(1), &pool).is_ok());
}

#[test]
fn a_cached_prefix_is_pinned_not_reserved_twice() {
    let h = BlockHasher::new("m", 4);
    let (mut l, bound) = line(8);
    let pool = pools(8);
    let prompt: Vec<u32> = (0..17).collect();
    // 17 + 3 tokens: 5 blocks, 4 of them full prompt blocks.
    join(&mut l, &bound, &prompt, 3, Some(&h));
    let mut first = l
        .pop_admissible(0, 4, no_adapters(), &pool)
        .ok()
        .unwrap()
        .leases
        .remove(0)
        .1;
    assert_eq!(first.cached_blocks(), 0);
    first.commit(5, &h.chain(&prompt));
    // While the first holds 5 of 8 blocks, an equal request needs only
    // its own last block: it fits in the 3 left.
    join(&mut l, &bound, &prompt, 3, Some(&h));
    let second = l
        .pop_admissible(1, 4, no_adapters(), &pool)
        .ok()
        .unwrap()
        .leases
        .remove(0)
        .1;
    assert_eq!(second.cached_blocks(), 4);
    assert_eq!(pool.used(), 6);
    // Without hashes (the cache off) the same request does not fit.
    join(&mut l, &bound, &prompt, 3, None);
    assert_eq!(
        l.pop_admissible(2, 4, no_adapters(), &pool).err(),
        Some(Blocked::BlockCap)
    );
}

#[test]
fn the_last_prompt_token_is_always_computed() {
    let h = BlockHasher::new("m", 4);
    let (mut l, bound) = line(8);
    let pool = pools(16);
    let prompt: Vec<u32> = (0..8).collect();
    join(&mut l, &bound, &prompt, 1, Some(&h));
    let mut first = l
        .pop_admissible(0, 4, no_adapters(), &pool)
        .ok()
        .unwrap()
        .leases
        .remove(0)
        .1;
    first.commit(2, &h.chain(&prompt));
    drop(first);
    // Both blocks are cached, but the second is recomputed.
    join(&mut l, &bound, &prompt, 1, Some(&h));
    let again = l
        .pop_admissible(0, 4, no_adapters(), &pool)
        .ok()
        .unwrap()
        .leases
        .remove(0)
        .1;
    assert_eq!(again.cached_blocks(), 1);
}
