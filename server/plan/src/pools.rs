//! The pools of a plan, one per cache group: what each costs, how a KV
//! budget is split between them, and the plan a set of pool sizes makes.
//!
//! Per group `g` (`crate::CacheGroup`): a block costs `block_bytes_g`
//! (`block_size` tokens in every layer of an attention group, one sequence's
//! state in a state group), and a sequence of `n` tokens reserves
//! `blocks_g(n)` blocks (`crate::CacheKind::blocks_for`: its length, at most
//! its window plus a chunk, or one slot). A budget `B` is split in
//! proportion to what a typical sequence (`T` tokens) takes of each, `pool_g
//! = B * blocks_g(T) / sum_h(blocks_h(T) * block_bytes_h)`, except that a
//! pool other than full attention never gets more than `max_seqs_cap`
//! sequences can ever hold (`cap * blocks_g(max_model_len)`): longer
//! sequences need more full-attention blocks, never more window blocks or
//! slots, so the rest goes to the full pool (a model without one leaves it
//! unused). Every pool holds at least one `max_model_len` sequence.
//! `max_seqs` is how many typical sequences every pool holds at once.

use std::collections::BTreeMap;

use crate::{
    CacheGroup, CacheKind, ModelGeometry, Plan, PlanConfig, PlanError, PoolPlan, PoolSizes,
};

/// What one group costs.
#[derive(Debug, Clone, Copy)]
struct Group {
    group: CacheGroup,
    block_bytes: u64,
    /// Blocks a `max_model_len` sequence reserves.
    most: u64,
    /// Blocks a typical sequence reserves.
    typical: u64,
}

/// The groups of a geometry under one plan's settings.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    groups: Vec<Group>,
    cap: u64,
    /// Bytes of a draft model's block, one beside each full-attention
    /// block (0 without a draft).
    draft_block_bytes: u64,
}

/// `a * b / c` without overflow, saturating.
fn mul_div(a: u64, b: u64, c: u64) -> u64 {
    u64::try_from(u128::from(a) * u128::from(b) / u128::from(c.max(1))).unwrap_or(u64::MAX)
}

impl Group {
    /// The full-attention group, which takes what the others leave.
    fn is_full(&self) -> bool {
        self.group.kind() == CacheKind::Full
    }
}

impl Layout {
    /// The groups of `geometry` for sequences of `max_model_len` tokens.
    pub fn new(geometry: &ModelGeometry, config: &PlanConfig, max_model_len: u64) -> Self {
        let typical = config
            .typical_seq_len
            .unwrap_or(max_model_len)
            .clamp(1, max_model_len);
        let (bs, chunk) = (config.block_size, config.prefill_chunk);
        let groups = geometry
            .cache_groups()
            .into_iter()
            .map(|group| Group {
                group,
                block_bytes: group.block_bytes(bs),
                most: group.kind().blocks_for(max_model_len, chunk, bs),
                typical: group.kind().blocks_for(typical, chunk, bs),
            })
            .collect();
        Layout {
            groups,
            cap: config.max_seqs_cap(),
            draft_block_bytes: config.draft.map_or(0, |d| d.block_bytes(bs)),
        }
    }

    /// The pools' kinds, in order.
    pub fn kinds(&self) -> Vec<CacheKind> {
        self.groups.iter().map(|g| g.group.kind()).collect()
    }

    fn full(&self) -> Option<usize> {
        self.groups.iter().position(Group::is_full)
    }

    /// Bytes of `pools` (one size per group).
    pub fn bytes(&self, pools: &[u64]) -> u64 {
        self.groups
            .iter()
            .zip(pools)
            .map(|(g, &n)| n.saturating_mul(g.block_bytes))
            .fold(0, u64::saturating_add)
    }

    /// Bytes of the draft model's pool beside `pools`: as many blocks as
    /// the full-attention pool.
    pub fn draft_bytes(&self, pools: &[u64]) -> u64 {
        let full = self.full().and_then(|i| pools.get(i)).copied();
        full.unwrap_or(0).saturating_mul(self.draft_block_bytes)
    }

    /// Bytes of `pools` and the draft's pool beside them.
    pub fn cost(&self, pools: &[u64]) -> u64 {
        self.bytes(pools).saturating_add(self.draft_bytes(pools))
    }

    /// KV bytes one `max_model_len` sequence reserves over every group (and
    /// the draft's pool).
    pub fn most_bytes(&self) -> u64 {
        let most: Vec<u64> = self.groups.iter().map(|g| g.most).collect();
        self.cost(&most)
    }

    /// `budget` bytes split between the pools (see the module note).
    pub fn split(&self, budget: u64) -> Vec<u64> {
        let typical: Vec<u64> = self.groups.iter().map(|g| g.typical).collect();
        let per_seq = self.cost(&typical).max(1);
        let share = |g: &Group, of: u64, whole: u64| mul_div(of, g.typical, whole);
        let mut pools: Vec<u64> = self
            .groups
            .iter()
            .map(|g| share(g, budget, per_seq))
            .collect();
        for (g, pool) in self.groups.iter().zip(pools.iter_mut()) {
            if !g.is_full() {
                *pool = (*pool).min(self.cap.saturating_mul(g.most)).max(g.most);
            }
        }
        let Some(full) = self.full().filter(|_| self.groups.len() > 1) else {
            return pools;
        };
        pools[full] = 0;
        let left = budget.saturating_sub(self.bytes(&pools));
        let full_block = self.groups[full].block_bytes + self.draft_block_bytes;
        pools[full] = left / full_block.max(1);
        let most = self.groups[full].most;
        if pools[full] < most {
            // The KV pool first holds one whole sequence; the windows share
            // what is left, in the same proportion.
            let left = budget.saturating_sub(most.saturating_mul(full_block));
            let windows = per_seq.saturating_sub(typical[full] * full_block);
            for (i, g) in self.groups.iter().enumerate() {
                pools[i] = if i == full {
                    most
                } else {
                    share(g, left, windows.max(1))
                };
            }
        }
        pools
    }

    /// `max_seqs_cap` sequences of `max_model_len` tokens in every pool, and
    /// the prefix cache's allowance in the KV pool.
    pub fn fit(&self, max_model_len: u64, block_size: u64) -> Vec<u64> {
        self.groups
            .iter()
            .map(|g| match g.is_full() {
                true => crate::fit_blocks(self.cap, max_model_len, block_size),
                false => self.cap.saturating_mul(g.most),
            })
            .collect()
    }

    /// `given` with every size not given derived so each pool holds as many
    /// typical sequences as the given ones do, and at least one whole one;
    /// refuses sizes for pools the model does not have.
    pub fn sized(&self, given: &PoolSizes) -> Result<Vec<u64>, PlanError> {
        let given: BTreeMap<CacheKind, u64> = given.resolve(&self.kinds())?;
        let pools: Vec<Option<u64>> = self
            .groups
            .iter()
            .map(|g| given.get(&g.group.kind()).copied())
            .collect();
        let seqs = self
            .groups
            .iter()
            .zip(&pools)
            .filter_map(|(g, p)| p.map(|n| n / g.typical.max(1)))
            .min()
            .unwrap_or(1)
            .clamp(1, self.cap);
        Ok(self
            .groups
            .iter()
            .zip(pools)
            .map(|(g, p)| p.unwrap_or_else(|| seqs.saturating_mul(g.typical).max(g.most)))
            .collect())
    }

    /// The plan with `pools` (one size per group), or why one of them cannot
    /// hold a `max_model_len` sequence.
    pub fn plan(
        &self,
        geometry: &ModelGeometry,
        config: &PlanConfig,
        max_model_len: u64,
        pools: &[u64],
    ) -> Result<Plan, PlanError> {
        let planned = self
            .groups
            .iter()
            .zip(pools)
            .map(|(g, &n)| g.check(n, config.block_size, max_model_len))
            .collect::<Result<Vec<PoolPlan>, PlanError>>()?;
        let max_seqs = self
            .groups
            .iter()
            .zip(pools)
            .map(|(g, &n)| n / g.typical.max(1))
            .min()
            .unwrap_or(0)
            .clamp(1, self.cap);
        Ok(Plan {
            pools: planned,
            block_size: config.block_size,
            max_seqs,
            weight_bytes: geometry.weight_bytes,
            kv_budget_bytes: self.bytes(pools),
            activation_reserve_bytes: config.activation_reserve(geometry),
            overhead_bytes: config.overhead(geometry),
            adapter_bytes: config.adapter_bytes,
            draft_bytes: config.draft.map_or(0, |d| {
                d.weight_bytes.saturating_add(self.draft_bytes(pools))
            }),
            max_model_len,
            params: geometry.params,
            active_params: geometry.active_params,
        })
    }
}

impl Group {
    /// The group's pool of `n` blocks, or why it cannot hold one
    /// `max_model_len` sequence.
    fn check(&self, n: u64, block_size: u64, max_model_len: u64) -> Result<PoolPlan, PlanError> {
        let kind = self.group.kind();
        if n < self.most {
            return Err(match kind {
                CacheKind::Window(window) => PlanError::WindowPoolTooSmall {
                    window,
                    kv_blocks: n,
                    blocks_per_seq: self.most,
                    max_model_len,
                },
                CacheKind::Full | CacheKind::State => PlanError::PoolTooSmall {
                    kv_blocks: n,
                    block_size,
                    pool_tokens: match kind.holds_tokens() {
                        true => n.saturating_mul(block_size),
                        false => 0,
                    },
                    max_model_len,
                },
            });
        }
        Ok(PoolPlan {
            kind,
            layers: self.group.layers,
            block_bytes: self.block_bytes,
            blocks_per_seq: self.most,
            blocks: n,
        })
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod experts_tests;

#[cfg(test)]
mod recurrent_tests;
