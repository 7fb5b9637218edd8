//! Pool sizes given by hand: the server's `--pool KIND=N` flags and their
//! aliases `--kv-blocks` and `--window-blocks`, resolved against the pools a
//! model really has, by kind.

use std::collections::BTreeMap;

use crate::contract::flag;
use crate::{CacheKind, PlanError};

/// Pool sizes given by hand; a pool not given is derived from the given
/// ones (see `crate::plan_for_pools`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolSizes {
    /// `--pool KIND=N`, by kind.
    pub by_kind: Vec<(CacheKind, u64)>,
    /// `--kv-blocks N`: the model's attention pool: its full-attention pool,
    /// or, when every attention layer slides over one window, that window's.
    pub kv_blocks: Option<u64>,
    /// `--window-blocks N[,N]`: the window pools, smallest window first.
    pub window_blocks: Option<Vec<u64>>,
}

/// `full, window:1024, state`: the pools of a model, as errors name them.
pub fn spell_kinds(kinds: &[CacheKind]) -> String {
    if kinds.is_empty() {
        return "none".into();
    }
    let names: Vec<String> = kinds.iter().map(CacheKind::to_string).collect();
    names.join(", ")
}

impl PoolSizes {
    /// Pools of these sizes, by kind.
    pub fn of(sizes: &[(CacheKind, u64)]) -> Self {
        PoolSizes {
            by_kind: sizes.to_vec(),
            ..PoolSizes::default()
        }
    }

    /// Whether no size is given.
    pub fn is_empty(&self) -> bool {
        self.by_kind.is_empty() && self.kv_blocks.is_none() && self.window_blocks.is_none()
    }

    /// The sizes by kind for a model whose pools are `kinds`; refuses a size
    /// for a pool the model lacks (naming the pools it has), a pool sized
    /// twice, and an alias that names no single pool.
    pub fn resolve(&self, kinds: &[CacheKind]) -> Result<BTreeMap<CacheKind, u64>, PlanError> {
        let missing = |asked: String| PlanError::NoSuchPool {
            asked,
            pools: spell_kinds(kinds),
        };
        let windows: Vec<CacheKind> = kinds
            .iter()
            .copied()
            .filter(|k| k.window().is_some())
            .collect();
        let mut given: Vec<(CacheKind, u64)> = self.by_kind.clone();
        if let Some(n) = self.kv_blocks {
            let pool = match (kinds.contains(&CacheKind::Full), windows.as_slice()) {
                (true, _) => CacheKind::Full,
                (false, [only]) => *only,
                _ => {
                    return Err(missing(format!(
                        "--{} (an attention KV pool)",
                        flag::KV_BLOCKS
                    )));
                }
            };
            given.push((pool, n));
        }
        if let Some(sizes) = &self.window_blocks {
            if sizes.len() != windows.len() {
                return Err(missing(format!(
                    "--{} with {} window pool sizes",
                    flag::WINDOW_BLOCKS,
                    sizes.len()
                )));
            }
            given.extend(windows.iter().copied().zip(sizes.iter().copied()));
        }
        let mut out = BTreeMap::new();
        for (kind, n) in given {
            if !kinds.contains(&kind) {
                return Err(missing(format!("the {kind} pool")));
            }
            if out.insert(kind, n).is_some() {
                return Err(PlanError::Invalid(format!(
                    "the {kind} pool's size is given twice (--{}, --{} and --{} name pools too)",
                    flag::POOL,
                    flag::KV_BLOCKS,
                    flag::WINDOW_BLOCKS
                )));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: CacheKind = CacheKind::Full;
    const STATE: CacheKind = CacheKind::State;
    const W1024: CacheKind = CacheKind::Window(1024);
    const W4096: CacheKind = CacheKind::Window(4096);

    #[test]
    fn every_alias_names_the_same_pools_as_the_kind_form() {
        let gemma = [FULL, W1024];
        let by_kind = PoolSizes::of(&[(FULL, 64), (W1024, 5)]);
        let aliases = PoolSizes {
            kv_blocks: Some(64),
            window_blocks: Some(vec![5]),
            ..PoolSizes::default()
        };
        let mixed = PoolSizes {
            by_kind: vec![(W1024, 5)],
            kv_blocks: Some(64),
            ..PoolSizes::default()
        };
        let want = BTreeMap::from([(FULL, 64), (W1024, 5)]);
        for sizes in [by_kind, aliases, mixed] {
            assert_eq!(sizes.resolve(&gemma), Ok(want.clone()), "{sizes:?}");
        }
        // Every layer slides over one window: --kv-blocks sizes that pool.
        let mistral = [W4096];
        let kv = PoolSizes {
            kv_blocks: Some(300),
            ..PoolSizes::default()
        };
        assert_eq!(kv.resolve(&mistral), Ok(BTreeMap::from([(W4096, 300)])));
        assert_eq!(
            PoolSizes::of(&[(W4096, 300)]).resolve(&mistral),
            kv.resolve(&mistral)
        );
        // A hybrid: --kv-blocks is its full pool; the slots by kind.
        let hybrid = [FULL, STATE];
        let both = PoolSizes {
            by_kind: vec![(STATE, 8)],
            kv_blocks: Some(100),
            ..PoolSizes::default()
        };
        assert_eq!(
            both.resolve(&hybrid),
            Ok(BTreeMap::from([(FULL, 100), (STATE, 8)]))
        );
        assert_eq!(PoolSizes::default().resolve(&hybrid), Ok(BTreeMap::new()));
    }

    #[test]
    fn a_size_for_a_pool_the_model_lacks_names_the_pools_it_has() {
        let kv = |n| PoolSizes {
            kv_blocks: Some(n),
            ..PoolSizes::default()
        };
        let windows = |v: Vec<u64>| PoolSizes {
            window_blocks: Some(v),
            ..PoolSizes::default()
        };
        // (pools, sizes, what the error says)
        let cases: [(&[CacheKind], PoolSizes, &str); 6] = [
            // Mamba-2: no attention at all.
            (
                &[STATE],
                kv(256),
                "--kv-blocks (an attention KV pool), but this model's pools are: state",
            ),
            (
                &[FULL],
                PoolSizes::of(&[(STATE, 4)]),
                "the state pool, but this model's pools are: full",
            ),
            (
                &[FULL, W1024],
                PoolSizes::of(&[(W4096, 4)]),
                "the window:4096 pool, but this model's pools are: full, window:1024",
            ),
            (
                &[FULL, W1024],
                windows(vec![1, 2]),
                "--window-blocks with 2 window pool sizes",
            ),
            // Two window sizes and no full pool: --kv-blocks names neither.
            (
                &[W1024, W4096],
                kv(8),
                "pools are: window:1024, window:4096",
            ),
            (
                &[FULL],
                PoolSizes {
                    kv_blocks: Some(1),
                    by_kind: vec![(FULL, 2)],
                    ..PoolSizes::default()
                },
                "given twice",
            ),
        ];
        for (kinds, sizes, want) in cases {
            let err = sizes.resolve(kinds).unwrap_err().to_string();
            assert!(err.contains(want), "{kinds:?} {sizes:?}: {err}");
        }
        assert_eq!(spell_kinds(&[]), "none");
    }
}
