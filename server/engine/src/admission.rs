//! Admission: whether a request could ever fit (checked at the door), the
//! bound on how many wait, and the waiting line itself, whose head is
//! admitted when both caps allow it: strict FIFO, so a head that does not fit
//! stops the line.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use ferrox_core::{BlockLease, BlockPool, Reservation};

use crate::job::Job;
use crate::{EngineConfig, EngineError};

/// KV blocks a request reserves for its whole life: prompt plus everything it
/// may generate. Saturating: a sum past `usize::MAX` asks for every block.
pub fn blocks_needed(prompt_tokens: usize, max_tokens: usize, block_size: usize) -> usize {
    prompt_tokens
        .saturating_add(max_tokens)
        .div_ceil(block_size.max(1))
}

/// Refuses, at submission, a request an empty server could not hold; returns
/// the blocks it will reserve.
pub fn check_fits(
    prompt_tokens: usize,
    max_tokens: usize,
    config: &EngineConfig,
) -> Result<usize, EngineError> {
    if prompt_tokens == 0 {
        return Err(EngineError::invalid("prompt", "the prompt is empty"));
    }
    if max_tokens == 0 {
        return Err(EngineError::invalid(
            "max_tokens",
            "max_tokens must be at least 1",
        ));
    }
    // Client numbers: saturating, so no sum can wrap below the limit.
    let needed = prompt_tokens.saturating_add(max_tokens);
    let pool_tokens = config.kv_blocks.saturating_mul(config.block_size);
    let limit = config.max_model_len.min(pool_tokens);
    if needed > limit {
        return Err(EngineError::TooLong {
            prompt_tokens,
            max_tokens,
            needed_tokens: needed,
            limit_tokens: limit,
        });
    }
    Ok(blocks_needed(prompt_tokens, max_tokens, config.block_size))
}

/// Requests submitted and not yet admitted, counted from submission (the
/// channel and the worker's line together) and bounded at the door: the
/// handle counts them in, the line counts them out.
#[derive(Debug)]
pub(crate) struct LineBound {
    waiting: AtomicUsize,
    max: usize,
}

impl LineBound {
    /// A bound of `max` waiting requests.
    pub fn new(max: usize) -> Self {
        LineBound {
            waiting: AtomicUsize::new(0),
            max,
        }
    }

    /// Counts one more request in, or refuses it when `max` already wait.
    pub fn enter(&self) -> Result<(), EngineError> {
        self.waiting
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| {
                (w < self.max).then_some(w + 1)
            })
            .map(|_| ())
            .map_err(|_| EngineError::QueueFull {
                max_queue: self.max,
            })
    }

    /// Counts one request out: admitted, cancelled, or never sent.
    pub fn leave(&self) {
        let _ = self
            .waiting
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| w.checked_sub(1));
    }

    /// Requests waiting now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }
}

/// Why the head of the line stays where it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocked {
    /// Nobody is waiting.
    Empty,
    /// `max_seqs` rows are already running.
    SeqCap,
    /// The pool cannot cover its reservation, less the cached blocks it
    /// would share.
    BlockCap,
    /// Its LoRA adapter is not among the running rows' and `max_loras`
    /// distinct adapters already run.
    AdapterCap,
}

/// The LoRA adapters the running rows use (by key), and how many distinct
/// ones may run at once (`--max-loras`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct AdapterCap<'a> {
    pub running: &'a std::collections::HashSet<String>,
    pub max: usize,
}

impl AdapterCap<'_> {
    /// Whether a request for `adapter` may join the running rows.
    fn admits(&self, adapter: Option<&ferrox_core::AdapterRef>) -> bool {
        adapter.is_none_or(|a| self.running.contains(a.key()) || self.running.len() < self.max)
    }
}

/// A request let in, with the blocks it reserved.
pub(crate) struct Admitted {
    pub job: Job,
    pub lease: BlockLease,
}

/// The worker's FIFO of requests not yet admitted.
pub(crate) struct WaitingLine {
    jobs: VecDeque<Job>,
    bound: Arc<LineBound>,
    block_size: usize,
}

impl WaitingLine {
    /// An empty line for blocks of `block_size` tokens, counting out of `bound`.
    pub fn new(bound: Arc<LineBound>, block_size: usize) -> Self {
        WaitingLine {
            jobs: VecDeque::new(),
            bound,
            block_size: block_size.max(1),
        }
    }

    /// Joins the back of the line.
    pub fn push(&mut self, job: Job) {
        self.jobs.push_back(job);
    }

    /// Jobs in the line (the channel may hold more).
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// The LoRA adapters of the jobs in the line (`None` for the base), in
    /// line order.
    pub fn adapters(&self) -> impl Iterator<Item = Option<&ferrox_core::AdapterRef>> {
        self.jobs.iter().map(|j| j.req.adapter.as_ref())
    }

    /// True when the line is empty.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// Takes out every job `pick` chooses, in line order; the rest keep
    /// theirs.
    pub fn remove(&mut self, mut pick: impl FnMut(&Job) -> bool) -> Vec<Job> {
        let mut removed = Vec::new();
        let mut kept = VecDeque::with_capacity(self.jobs.len());
        for job in self.jobs.drain(..) {
            if pick(&job) {
                self.bound.leave();
                removed.push(job);
            } else {
                kept.push_back(job);
            }
        }
        self.jobs = kept;
        removed
    }

    /// Admits the head if fewer than `max_seqs` rows run, its adapter (if
    /// any) may join the running ones, and `pool` can reserve every block it
    /// may need, less the cached prefix it shares. Nothing behind the head
    /// is ever considered.
    pub fn pop_admissible(
        &mut self,
        running: usize,
        max_seqs: usize,
        adapters: AdapterCap<'_>,
        pool: &BlockPool,
    ) -> Result<Admitted, Blocked> {
        let head = self.jobs.front().ok_or(Blocked::Empty)?;
        if running >= max_seqs {
            return Err(Blocked::SeqCap);
        }
        if !adapters.admits(head.req.adapter.as_ref()) {
            return Err(Blocked::AdapterCap);
        }
        let prompt = head.req.prompt.len();
        // At least the prompt's last token is computed, for its logits; all
        // of it when the caller wants every prompt token's logprob.
        let max_cached = if head.req.sampling.prompt_logprobs.is_some() {
            0
        } else {
            prompt.saturating_sub(1) / self.block_size
        };
        let ask = Reservation {
            hashes: &head.hashes,
            max_cached,
            now: prompt.div_ceil(self.block_size),
            total: head.blocks,
        };
        let lease = pool.reserve(&ask).map_err(|_| Blocked::BlockCap)?;
        let job = self.jobs.pop_front().ok_or(Blocked::Empty)?;
        self.bound.leave();
        Ok(Admitted { job, lease })
    }
}

#[cfg(test)]
mod tests {
    use ferrox_core::BlockHasher;

    use super::*;
    use crate::fixtures::{job, request};

    fn config() -> EngineConfig {
        EngineConfig {
            max_model_len: 100,
            block_size: 4,
            kv_blocks: 20,
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
                (Ok(b), Ok(w)) => assert_eq!(b, w),
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
             server's limit of 80 tokens"
        );
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
        let pool = BlockPool::new(8);
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
        let pool = BlockPool::new(8);
        let _held = pool.allocate(4).unwrap();
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
        let pool = BlockPool::new(8);
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
        let pool = BlockPool::new(16);
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
        let pool = BlockPool::new(8);
        let prompt: Vec<u32> = (0..17).collect();
        // 17 + 3 tokens: 5 blocks, 4 of them full prompt blocks.
        join(&mut l, &bound, &prompt, 3, Some(&h));
        let mut first = l
            .pop_admissible(0, 4, no_adapters(), &pool)
            .ok()
            .unwrap()
            .lease;
        assert_eq!(first.cached_blocks(), 0);
        first.commit(5, &h.chain(&prompt));
        // While the first holds 5 of 8 blocks, an equal request needs only
        // its own last block: it fits in the 3 left.
        join(&mut l, &bound, &prompt, 3, Some(&h));
        let second = l
            .pop_admissible(1, 4, no_adapters(), &pool)
            .ok()
            .unwrap()
            .lease;
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
        let pool = BlockPool::new(16);
        let prompt: Vec<u32> = (0..8).collect();
        join(&mut l, &bound, &prompt, 1, Some(&h));
        let mut first = l
            .pop_admissible(0, 4, no_adapters(), &pool)
            .ok()
            .unwrap()
            .lease;
        first.commit(2, &h.chain(&prompt));
        drop(first);
        // Both blocks are cached, but the second is recomputed.
        join(&mut l, &bound, &prompt, 1, Some(&h));
        let again = l
            .pop_admissible(0, 4, no_adapters(), &pool)
            .ok()
            .unwrap()
            .lease;
        assert_eq!(again.cached_blocks(), 1);
    }
}
