//! The pause after a watch error, shared by all of the controller's watches.
//!
//! kube-runtime backs off the controller's whole trigger stream (every watch
//! together) after any one watch errs, with client-go's 0.8 s doubling to
//! 30 s. After an API server restart each watch still yields one error as it
//! is polled, so the pauses add up: measured in tests/operator/faults.sh, a
//! new ModelDeployment waited 180 s for its first reconcile. A short cap keeps
//! the retries gentle and the recovery within seconds.

use std::time::Duration;

/// First pause.
const FIRST: Duration = Duration::from_millis(250);
/// Longest pause.
const CAP: Duration = Duration::from_secs(2);

/// Doubling from 250 ms to a 2 s cap; back to the start on any event.
#[derive(Debug, Clone, Default)]
pub struct TriggerBackoff {
    next: Option<Duration>,
}

impl Iterator for TriggerBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let now = self.next.unwrap_or(FIRST);
        self.next = Some(now.saturating_mul(2).min(CAP));
        Some(now)
    }
}

impl kube::runtime::utils::Backoff for TriggerBackoff {
    fn reset(&mut self) {
        self.next = None;
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::utils::Backoff;

    use super::*;

    #[test]
    fn doubles_to_the_cap_and_restarts_on_reset() {
        let mut b = TriggerBackoff::default();
        let ms: Vec<u128> = b.by_ref().take(6).map(|d| d.as_millis()).collect();
        assert_eq!(ms, [250, 500, 1000, 2000, 2000, 2000]);
        b.reset();
        assert_eq!(b.next(), Some(FIRST));
        // Six watches each erring once after an outage cost at most 12 s.
        let mut fresh = TriggerBackoff::default();
        let total: Duration = fresh.by_ref().take(6).sum();
        assert!(total <= Duration::from_secs(12), "{total:?}");
    }
}
