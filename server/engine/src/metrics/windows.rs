//! The window pools' gauges (models with sliding-window layers): a series
//! per window pool, by `window`.

use ferrox_core::PoolStats;
use ferrox_plan::contract::metric;
use prometheus::{GaugeVec, IntGaugeVec, Opts, Registry};

use super::{int_gauges, reg};

/// The window pools' gauges, in blocks, by `window`: a series per window
/// pool, none for a model without sliding-window layers.
pub(super) struct WindowGauges {
    used: IntGaugeVec,
    total: IntGaugeVec,
    held: IntGaugeVec,
    ratio: GaugeVec,
}

impl WindowGauges {
    pub(super) fn new(r: &Registry) -> prometheus::Result<Self> {
        let by_window = [metric::WINDOW_LABEL];
        Ok(WindowGauges {
            used: int_gauges(
                r,
                metric::WINDOW_BLOCKS_USED,
                "Window pool blocks reserved by running requests (what admission counts), by window.",
                &by_window,
            )?,
            total: int_gauges(
                r,
                metric::WINDOW_BLOCKS_TOTAL,
                "Window pool blocks, by window.",
                &by_window,
            )?,
            held: int_gauges(
                r,
                metric::WINDOW_BLOCKS_HELD,
                "Window pool blocks holding a window now; the rest of the reserved ones \
                 were given back as windows moved, or are not drawn yet. By window.",
                &by_window,
            )?,
            ratio: reg(
                r,
                GaugeVec::new(
                    Opts::new(
                        metric::WINDOW_USAGE,
                        "Fraction of the window pool's blocks reserved, by window.",
                    ),
                    &by_window,
                )?,
            )?,
        })
    }

    pub(super) fn set(&self, window: usize, s: &PoolStats) {
        let w = window.to_string();
        let int = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let label = [w.as_str()];
        for (g, v) in [
            (&self.used, s.reserved),
            (&self.total, s.total),
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
