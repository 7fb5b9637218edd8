//! Every pool's gauges, by `pool` (its cache kind: `full`, `window:1024`,
//! `state`): a series per pool the model has, none for one it lacks.

use ferrox_core::PoolStats;
use ferrox_plan::CacheKind;
use ferrox_plan::contract::metric;
use prometheus::{GaugeVec, IntGaugeVec, Opts, Registry};

use super::{int_gauges, reg};

/// The pools' gauges, in blocks (a state pool's block is a slot).
pub(super) struct PoolGauges {
    used: IntGaugeVec,
    capacity: IntGaugeVec,
    held: IntGaugeVec,
    ratio: GaugeVec,
}

impl PoolGauges {
    pub(super) fn new(r: &Registry) -> prometheus::Result<Self> {
        let by_pool = [metric::POOL_LABEL];
        Ok(PoolGauges {
            used: int_gauges(
                r,
                metric::POOL_BLOCKS_USED,
                "Blocks reserved by running requests (what admission counts), by pool; \
                 a state pool's blocks are its slots, one a sequence.",
                &by_pool,
            )?,
            capacity: int_gauges(
                r,
                metric::POOL_BLOCKS_CAPACITY,
                "Blocks of each pool, by pool.",
                &by_pool,
            )?,
            held: int_gauges(
                r,
                metric::POOL_BLOCKS_HELD,
                "Blocks holding something now, by pool; a window pool's other reserved \
                 blocks were given back as windows moved, or are not drawn yet.",
                &by_pool,
            )?,
            ratio: reg(
                r,
                GaugeVec::new(
                    Opts::new(
                        metric::POOL_USAGE,
                        "Fraction of each pool's blocks reserved, by pool.",
                    ),
                    &by_pool,
                )?,
            )?,
        })
    }

    /// Sets the series of the pool of `kind`.
    pub(super) fn set(&self, kind: CacheKind, s: &PoolStats) {
        let name = kind.to_string();
        let label = [name.as_str()];
        let int = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        for (g, v) in [
            (&self.used, s.reserved),
            (&self.capacity, s.total),
            (&self.held, s.held),
        ] {
            if let Ok(g) = g.get_metric_with_label_values(&label) {
                g.set(int(v));
            }
        }
        if let Ok(g) = self.ratio.get_metric_with_label_values(&label) {
            g.set(ratio(s));
        }
    }
}

/// Fraction of a pool reserved; 0 for an empty pool.
pub(super) fn ratio(s: &PoolStats) -> f64 {
    if s.total == 0 {
        0.0
    } else {
        s.reserved as f64 / s.total as f64
    }
}
