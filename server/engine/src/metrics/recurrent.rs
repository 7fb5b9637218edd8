//! The recurrent state slots' gauges (models with recurrent layers): slots
//! held by running requests and the slots there are, one a sequence.

use ferrox_core::PoolStats;
use ferrox_plan::contract::metric;
use prometheus::{IntGauge, Registry};

use super::int_gauge;

/// Slots held and total.
pub(super) struct RecurrentGauges {
    used: IntGauge,
    total: IntGauge,
}

impl RecurrentGauges {
    pub(super) fn new(r: &Registry) -> prometheus::Result<Self> {
        Ok(RecurrentGauges {
            used: int_gauge(
                r,
                metric::RECURRENT_SLOTS_USED,
                "Recurrent state slots held by running requests, one a sequence.",
            )?,
            total: int_gauge(
                r,
                metric::RECURRENT_SLOTS_CAPACITY,
                "Recurrent state slots (0 for a model without recurrent layers).",
            )?,
        })
    }

    pub(super) fn set(&self, s: PoolStats) {
        let int = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.used.set(int(s.reserved));
        self.total.set(int(s.total));
    }
}
