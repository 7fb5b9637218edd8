//! A download progress reporter: one `tracing::info!` line every ~5%.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Report every this many percent.
const STEP_PERCENT: u64 = 5;

/// Shared progress for one file; clones report into the same counters.
#[derive(Clone, Debug)]
pub(crate) struct Progress {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    label: String,
    total: AtomicU64,
    done: AtomicU64,
    /// The last reported step (0..=100/STEP_PERCENT).
    reported: AtomicU64,
}

impl Progress {
    /// A reporter for `label` (the repo file or URL).
    pub(crate) fn new(label: &str) -> Self {
        Self {
            inner: Arc::new(Inner {
                label: label.to_string(),
                total: AtomicU64::new(0),
                done: AtomicU64::new(0),
                reported: AtomicU64::new(0),
            }),
        }
    }

    /// Sets the expected size (0 when unknown) and logs the start.
    pub(crate) fn start(&self, total: u64) {
        self.inner.total.store(total, Ordering::Relaxed);
        tracing::info!("downloading {} ({total} bytes)", self.inner.label);
    }

    /// Adds `n` bytes; logs (and returns the percent) when a new 5% step is crossed.
    pub(crate) fn add(&self, n: u64) -> Option<u64> {
        let done = self.inner.done.fetch_add(n, Ordering::Relaxed) + n;
        let total = self.inner.total.load(Ordering::Relaxed);
        let step = step_of(done, total)?;
        let prev = self.inner.reported.fetch_max(step, Ordering::Relaxed);
        if step <= prev {
            return None;
        }
        let pct = step * STEP_PERCENT;
        tracing::info!("{}: {done}/{total} bytes ({pct}%)", self.inner.label);
        Some(pct)
    }

    /// Logs completion.
    pub(crate) fn finish(&self) {
        let done = self.inner.done.load(Ordering::Relaxed);
        tracing::info!("downloaded {} ({done} bytes)", self.inner.label);
    }

    /// Bytes counted so far.
    #[cfg(test)]
    pub(crate) fn done(&self) -> u64 {
        self.inner.done.load(Ordering::Relaxed)
    }
}

/// Which 5% step `done` of `total` has reached (`None` if total unknown).
fn step_of(done: u64, total: u64) -> Option<u64> {
    if total == 0 {
        return None;
    }
    let pct = (u128::from(done.min(total)) * 100 / u128::from(total)) as u64;
    Some(pct / STEP_PERCENT)
}

impl hf_hub::api::tokio::Progress for Progress {
    async fn init(&mut self, size: usize, _filename: &str) {
        self.start(size as u64);
    }

    async fn update(&mut self, size: usize) {
        let _ = self.add(size as u64);
    }

    async fn finish(&mut self) {
        Progress::finish(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_five_percent() {
        assert_eq!(step_of(0, 100), Some(0));
        assert_eq!(step_of(4, 100), Some(0));
        assert_eq!(step_of(5, 100), Some(1));
        assert_eq!(step_of(100, 100), Some(20));
        assert_eq!(step_of(200, 100), Some(20));
        assert_eq!(step_of(10, 0), None);
    }

    #[test]
    fn logs_once_per_five_percent() {
        let p = Progress::new("x");
        p.start(1000);
        let logged: Vec<u64> = (0..1000).filter_map(|_| p.add(1)).collect();
        assert_eq!(logged, (1..=20).map(|s| s * 5).collect::<Vec<_>>());
        let unknown = Progress::new("y");
        unknown.start(0);
        assert_eq!(unknown.add(10), None, "no percent without a total");
    }

    #[test]
    fn clones_share_counters() {
        let p = Progress::new("x");
        p.start(10);
        let q = p.clone();
        assert_eq!(q.add(3), Some(30));
        assert_eq!(p.add(4), Some(70));
        assert_eq!(p.done(), 7);
    }
}
