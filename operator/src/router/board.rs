//! What every router replica last said is waiting, summed by model.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use ferrox_plan::contract::router::PendingReport;
use tokio::sync::watch;

/// The routers' waiting lines, by router pod; cloned handles share it.
#[derive(Debug, Clone)]
pub struct PendingBoard {
    reports: Arc<Mutex<BTreeMap<String, PendingReport>>>,
    changed: Arc<watch::Sender<u64>>,
}

impl Default for PendingBoard {
    fn default() -> Self {
        PendingBoard {
            reports: Arc::default(),
            changed: Arc::new(watch::channel(0).0),
        }
    }
}

impl PendingBoard {
    /// The reports, locked. Every step under the lock leaves the map
    /// whole, so a panic elsewhere never makes it unusable.
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, PendingReport>> {
        self.reports.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records what router `pod` reported; wakes the waker when a sum moved.
    pub fn report(&self, pod: &str, report: PendingReport) {
        let moved = {
            let mut reports = self.lock();
            let before = sums(&reports);
            reports.insert(pod.to_string(), report);
            sums(&reports) != before
        };
        if moved {
            self.changed.send_modify(|v| *v += 1);
        }
    }

    /// Forgets router `pod` (gone, or not answering).
    pub fn forget(&self, pod: &str) {
        let moved = {
            let mut reports = self.lock();
            reports
                .remove(pod)
                .is_some_and(|r| r.models.values().any(|n| *n > 0))
        };
        if moved {
            self.changed.send_modify(|v| *v += 1);
        }
    }

    /// Requests waiting for `model`, summed over the router pods.
    pub fn pending(&self, model: &str) -> u64 {
        let reports = self.lock();
        reports.values().filter_map(|r| r.models.get(model)).sum()
    }

    /// Every model's sum (models with nothing waiting left out).
    pub fn totals(&self) -> BTreeMap<String, u64> {
        sums(&self.lock())
    }

    /// A receiver that sees every change of the sums.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

fn sums(reports: &BTreeMap<String, PendingReport>) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (model, n) in reports.values().flat_map(|r| &r.models) {
        if *n > 0 {
            *out.entry(model.clone()).or_default() += n;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(version: u64, models: &[(&str, u64)]) -> PendingReport {
        PendingReport {
            version,
            models: models.iter().map(|(m, n)| (m.to_string(), *n)).collect(),
        }
    }

    #[test]
    fn sums_over_router_pods_and_signals_only_when_a_sum_moves() {
        let board = PendingBoard::default();
        let mut rx = board.subscribe();
        board.report("a", report(1, &[("smol", 0)]));
        assert!(!rx.has_changed().unwrap(), "0 waiting is no change");
        board.report("a", report(2, &[("smol", 2)]));
        board.report("b", report(7, &[("smol", 1), ("big", 3)]));
        assert!(rx.has_changed().unwrap());
        rx.mark_unchanged();
        assert_eq!((board.pending("smol"), board.pending("big")), (3, 3));
        assert_eq!(board.pending("other"), 0);
        // A new version with the same counts is not a change.
        board.report("b", report(8, &[("smol", 1), ("big", 3)]));
        assert!(!rx.has_changed().unwrap());
        board.forget("b");
        assert!(rx.has_changed().unwrap());
        assert_eq!(board.totals(), BTreeMap::from([("smol".to_string(), 2)]));
    }
}
