//! The operator's own metrics, exposed on `/metrics`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Counters the shells bump.
#[derive(Debug, Default)]
pub struct Metrics {
    reconciles: AtomicU64,
    reconcile_errors: AtomicU64,
    scale_writes: AtomicU64,
    scrape_errors: AtomicU64,
    leader: AtomicBool,
}

impl Metrics {
    /// One reconcile started.
    pub fn reconciled(&self) {
        self.reconciles.fetch_add(1, Ordering::Relaxed);
    }

    /// One reconcile failed.
    pub fn failed(&self) {
        self.reconcile_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// The autoscaler wrote the scale subresource.
    pub fn scaled(&self) {
        self.scale_writes.fetch_add(1, Ordering::Relaxed);
    }

    /// A pod's `/metrics` could not be read.
    pub fn scrape_failed(&self) {
        self.scrape_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// This replica holds (or lost) the lease.
    pub fn set_leader(&self, leader: bool) {
        self.leader.store(leader, Ordering::Relaxed);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let counter = |name: &str, help: &str, v: &AtomicU64| {
            format!(
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n",
                v.load(Ordering::Relaxed)
            )
        };
        [
            counter("ferrox_operator_reconciles_total", "Reconciles started.", &self.reconciles),
            counter("ferrox_operator_reconcile_errors_total", "Reconciles failed.", &self.reconcile_errors),
            counter("ferrox_operator_scale_writes_total", "Scale subresource writes.", &self.scale_writes),
            counter("ferrox_operator_scrape_errors_total", "Failed pod scrapes.", &self.scrape_errors),
            format!(
                "# HELP ferrox_operator_leader Whether this replica holds the lease.\n# TYPE ferrox_operator_leader gauge\nferrox_operator_leader {}\n",
                u8::from(self.leader.load(Ordering::Relaxed))
            ),
        ]
        .concat()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_counts() {
        let m = Metrics::default();
        m.reconciled();
        m.reconciled();
        m.failed();
        m.set_leader(true);
        let text = m.render();
        assert!(text.contains("ferrox_operator_reconciles_total 2\n"));
        assert!(text.contains("ferrox_operator_reconcile_errors_total 1\n"));
        assert!(text.contains("ferrox_operator_leader 1\n"));
    }
}
