//! Admission: whether a request could ever fit (checked at the door), the
//! bound on how many wait, and the waiting line itself, whose head is
//! admitted when both caps allow it: strict FIFO, so a head that does not fit
//! stops the line.
//!
//! Blocks are counted per pool, by kind ([`ferrox_plan::CacheKind::blocks_for`]):
//! a request reserves in the full-attention pool its whole length's blocks,
//! in each window pool its window plus one prefill chunk, page-aligned, or
//! its whole length when that is less, and in a state pool one slot. It is
//! admitted only when every pool can cover its reservation.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use ferrox_core::Pool;
use ferrox_plan::CacheKind;

use crate::job::Job;
use crate::kv_pools::{KvPools, Leases};
use crate::{EngineConfig, EngineError};

/// Blocks a request of `tokens` tokens (prompt plus everything it may
/// generate) reserves for its whole life in a pool of `kind`, with prefill
/// chunks of at most `prefill_chunk` tokens. Saturating: a sum past
/// `usize::MAX` asks for every block.
pub fn blocks_needed(
    tokens: usize,
    kind: CacheKind,
    block_size: usize,
    prefill_chunk: usize,
) -> usize {
    let wide = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    let blocks = kind.blocks_for(wide(tokens), wide(prefill_chunk), wide(block_size));
    usize::try_from(blocks).unwrap_or(usize::MAX)
}

/// Leading prompt blocks a cache may serve: all but the one holding the last
/// prompt token (whose logits are needed), none when every prompt token's
/// logits are (`prompt_logprobs`).
pub(crate) fn cacheable_blocks(prompt_tokens: usize, all_logits: bool, block_size: usize) -> usize {
    if all_logits {
        0
    } else {
        prompt_tokens.saturating_sub(1) / block_size
    }
}

/// The most tokens one sequence may hold in `pool`, and the pool named with
/// its numbers; `None` when any length fits (a window pool that holds a
/// whole window's reservation, a state pool with a slot).
fn pool_limit(pool: &Pool, config: &EngineConfig) -> Option<(usize, String)> {
    let bs = config.block_size;
    let tokens = pool.blocks.saturating_mul(bs);
    let most = blocks_needed(usize::MAX, pool.kind, bs, config.prefill_chunk);
    match pool.kind {
        CacheKind::Full => Some((
            tokens,
            format!("the KV pool's {} blocks of {bs} tokens", pool.blocks),
        )),
        CacheKind::Window(w) => (pool.blocks < most).then(|| {
            let name = format!(
                "the {w}-token window pool's {} blocks of {bs} tokens, where a long \
                 sequence reserves {most}",
                pool.blocks
            );
            (tokens, name)
        }),
        CacheKind::State => None,
    }
}

/// Refuses, at submission, a request an empty server could not hold; returns
/// the blocks it will reserve in each pool, by kind.
pub fn check_fits(
    prompt_tokens: usize,
    max_tokens: usize,
    config: &EngineConfig,
) -> Result<Vec<(CacheKind, usize)>, EngineError> {
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
    let mut limit = (config.max_model_len, "--max-model-len".to_string());
    for (tokens, name) in config.pools.iter().filter_map(|p| pool_limit(p, config)) {
        if tokens < limit.0 {
            limit = (tokens, name);
        }
    }
    if config.pool(CacheKind::State).is_some_and(|p| p.blocks == 0) {
        return Err(EngineError::invalid(
            "prompt",
            "the model has recurrent layers and the server holds no state slot for a sequence",
        ));
    }
    if needed > limit.0 {
        return Err(EngineError::TooLong {
            prompt_tokens,
            max_tokens,
            needed_tokens: needed,
            limit_tokens: limit.0,
            limit: limit.1,
        });
    }
    let need = |p: &Pool| {
        let n = blocks_needed(needed, p.kind, config.block_size, config.prefill_chunk);
        (p.kind, n)
    };
    Ok(config.pools.iter().map(need).collect())
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
    /// A pool cannot cover its reservation, less the cached blocks it would
    /// share.
    BlockCap,
    /// Its LoRA adapter is not among the running rows' and `max_loras`
    /// distinct adapters already run.
    AdapterCap,
    /// Every recurrent state slot is held (a model with recurrent layers).
    StateCap,
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

/// A request let in, with the blocks it reserved: one lease per pool, by
/// kind.
pub(crate) struct Admitted {
    pub job: Job,
    pub leases: Leases,
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
    /// any) may join the running ones, and every pool can reserve every
    /// block it may need there, less the cached prefix it shares. Nothing
    /// behind the head is ever considered.
    pub fn pop_admissible(
        &mut self,
        running: usize,
        max_seqs: usize,
        adapters: AdapterCap<'_>,
        pools: &KvPools,
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
        let all_logits = head.req.sampling.prompt_logprobs.is_some();
        let max_cached = cacheable_blocks(prompt, all_logits, self.block_size);
        let now = prompt.div_ceil(self.block_size);
        let leases = pools
            .reserve(&head.hashes, max_cached, now, &head.blocks)
            .map_err(|pool| match pool {
                CacheKind::State => Blocked::StateCap,
                CacheKind::Full | CacheKind::Window(_) => Blocked::BlockCap,
            })?;
        let job = self.jobs.pop_front().ok_or(Blocked::Empty)?;
        self.bound.leave();
        Ok(Admitted { job, leases })
    }
}

#[cfg(test)]
mod tests;
