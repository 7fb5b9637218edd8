//! The pools of a plan, one per KV group: what each costs, how a KV budget is
//! split between them, and the plan a set of pool sizes makes.
//!
//! Per group `g` (full attention, or one window size): `block_bytes_g =
//! block_size * layers_g * layer_kv_bytes_per_token`, and a sequence of `n`
//! tokens reserves `blocks_g(n)` blocks ([`KvGroupGeometry::seq_blocks`]: its
//! length, or in a windowed group at most its window plus a chunk). A budget
//! `B` is split in proportion to what a typical sequence (`T` tokens) takes
//! of each, `pool_g = B * blocks_g(T) / sum_h(blocks_h(T) * block_bytes_h)`,
//! except that a window pool never gets more than `max_seqs_cap` sequences can
//! ever hold (`cap * blocks_g(max_model_len)`): longer sequences need more
//! full-attention blocks, never more window blocks, so the rest goes to the
//! KV pool (a model whose every layer has a window leaves it unused). Every pool holds at least one `max_model_len` sequence.
//! `max_seqs` is how many typical sequences every pool holds at once.
//!
//! A model with recurrent layers adds the pool of state slots, last: a
//! "group" whose block is one sequence's state (`state_bytes_per_seq`),
//! one a sequence whatever its length, split and capped like a window pool.

use serde::{Deserialize, Serialize};

use crate::window::KvGroupGeometry;
use crate::{ModelGeometry, Plan, PlanConfig, PlanError};

/// One window pool of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WindowPlan {
    /// Tokens the group's layers attend to.
    pub window: u64,
    /// Layers with this window.
    pub layers: u64,
    /// Bytes of K and V one token takes across these layers.
    pub kv_bytes_per_token: u64,
    /// Bytes of one block of this pool.
    pub block_bytes: u64,
    /// The most blocks one sequence reserves here: its window plus a prefill
    /// chunk, page-aligned, or its whole length when shorter.
    pub blocks_per_seq: u64,
    /// Blocks in the pool.
    pub kv_blocks: u64,
}

/// Pool sizes given by hand (the server's flags); `None`: derive it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolSizes {
    /// Blocks of the KV pool (the full-attention layers).
    pub kv_blocks: Option<u64>,
    /// Blocks of each window pool, smallest window first.
    pub window_blocks: Option<Vec<u64>>,
}

/// What one group costs.
#[derive(Debug, Clone, Copy)]
struct Group {
    /// The KV group; `None` for the state slots.
    kv: Option<KvGroupGeometry>,
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
}

/// `a * b / c` without overflow, saturating.
fn mul_div(a: u64, b: u64, c: u64) -> u64 {
    u64::try_from(u128::from(a) * u128::from(b) / u128::from(c.max(1))).unwrap_or(u64::MAX)
}

impl Group {
    /// The full-attention KV group.
    fn is_full(&self) -> bool {
        self.kv.is_some_and(|k| k.window.is_none())
    }

    /// A window group's window.
    fn window(&self) -> Option<u64> {
        self.kv.and_then(|k| k.window)
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
        let state = (geometry.state_bytes_per_seq > 0).then_some(Group {
            kv: None,
            block_bytes: geometry.state_bytes_per_seq,
            most: 1,
            typical: 1,
        });
        let groups = geometry
            .kv_groups()
            .into_iter()
            .map(|kv| Group {
                kv: Some(kv),
                block_bytes: bs
                    .saturating_mul(kv.layers)
                    .saturating_mul(geometry.layer_kv_bytes_per_token()),
                most: kv.seq_blocks(max_model_len, chunk, bs),
                typical: kv.seq_blocks(typical, chunk, bs),
            })
            .chain(state)
            .collect();
        Layout {
            groups,
            cap: config.max_seqs_cap(),
        }
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

    /// KV bytes one `max_model_len` sequence reserves over every group.
    pub fn most_bytes(&self) -> u64 {
        let most: Vec<u64> = self.groups.iter().map(|g| g.most).collect();
        self.bytes(&most)
    }

    /// `budget` bytes split between the pools (see the module note).
    pub fn split(&self, budget: u64) -> Vec<u64> {
        let typical: Vec<u64> = self.groups.iter().map(|g| g.typical).collect();
        let per_seq = self.bytes(&typical).max(1);
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
        pools[full] = left / self.groups[full].block_bytes.max(1);
        let most = self.groups[full].most;
        if pools[full] < most {
            // The KV pool first holds one whole sequence; the windows share
            // what is left, in the same proportion.
            let left = budget.saturating_sub(most.saturating_mul(self.groups[full].block_bytes));
            let windows = per_seq.saturating_sub(typical[full] * self.groups[full].block_bytes);
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
        let windows = self.groups.iter().filter(|g| g.window().is_some()).count();
        let mut pools: Vec<Option<u64>> = vec![None; self.groups.len()];
        if let Some(n) = given.kv_blocks {
            let full = self.full().ok_or_else(|| {
                PlanError::Invalid(
                    "a KV pool size was given, but every layer of this model has a sliding \
                     window: size its window pool instead"
                        .into(),
                )
            })?;
            pools[full] = Some(n);
        }
        if let Some(sizes) = &given.window_blocks {
            if sizes.len() != windows {
                return Err(PlanError::Invalid(format!(
                    "{} window pool sizes given for a model with {windows} window sizes",
                    sizes.len()
                )));
            }
            let at = self
                .groups
                .iter()
                .enumerate()
                .filter(|(_, g)| g.window().is_some());
            for ((i, _), &n) in at.zip(sizes) {
                pools[i] = Some(n);
            }
        }
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
        let mut plan = Plan {
            kv_blocks: 0,
            block_size: config.block_size,
            max_seqs: 0,
            kv_bytes_per_token: 0,
            block_bytes: 0,
            weight_bytes: geometry.weight_bytes,
            kv_budget_bytes: self.bytes(pools),
            activation_reserve_bytes: config.activation_reserve(geometry),
            overhead_bytes: config.overhead(geometry),
            adapter_bytes: config.adapter_bytes,
            max_model_len,
            windows: Vec::new(),
            params: geometry.params,
            active_params: geometry.active_params,
            state_slots: 0,
            state_bytes_per_seq: 0,
        };
        for (g, &n) in self.groups.iter().zip(pools) {
            let per_token = g.block_bytes / config.block_size.max(1);
            let Some(kv) = g.kv else {
                if n == 0 {
                    return Err(PlanError::PoolTooSmall {
                        kv_blocks: 0,
                        block_size: config.block_size,
                        pool_tokens: 0,
                        max_model_len,
                    });
                }
                (plan.state_slots, plan.state_bytes_per_seq) = (n, g.block_bytes);
                continue;
            };
            match kv.window {
                None if n < g.most => {
                    return Err(PlanError::PoolTooSmall {
                        kv_blocks: n,
                        block_size: config.block_size,
                        pool_tokens: n.saturating_mul(config.block_size),
                        max_model_len,
                    });
                }
                None => {
                    (plan.kv_blocks, plan.block_bytes) = (n, g.block_bytes);
                    plan.kv_bytes_per_token = per_token;
                }
                Some(window) if n < g.most => {
                    return Err(PlanError::WindowPoolTooSmall {
                        window,
                        kv_blocks: n,
                        blocks_per_seq: g.most,
                        max_model_len,
                    });
                }
                Some(window) => plan.windows.push(WindowPlan {
                    window,
                    layers: kv.layers,
                    kv_bytes_per_token: per_token,
                    block_bytes: g.block_bytes,
                    blocks_per_seq: g.most,
                    kv_blocks: n,
                }),
            }
        }
        plan.max_seqs = self
            .groups
            .iter()
            .zip(pools)
            .map(|(g, &n)| n / g.typical.max(1))
            .min()
            .unwrap_or(0)
            .clamp(1, self.cap);
        Ok(plan)
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod experts_tests;

#[cfg(test)]
mod recurrent_tests;
