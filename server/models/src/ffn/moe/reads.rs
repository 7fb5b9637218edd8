//! How often each expert of a layer was read.

use std::sync::atomic::{AtomicU64, Ordering};

/// A count of each expert's reads (one per step it ran in), so tests can
/// see that an expert no token chose was not touched.
#[derive(Debug, Default)]
pub struct ExpertReads(Vec<AtomicU64>);

impl ExpertReads {
    /// Zero reads of `experts` experts.
    pub fn new(experts: usize) -> Self {
        ExpertReads((0..experts).map(|_| AtomicU64::new(0)).collect())
    }

    /// Expert `e` was read once more.
    pub fn record(&self, e: usize) {
        if let Some(n) = self.0.get(e) {
            n.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The counts so far.
    pub fn counts(&self) -> Vec<u64> {
        self.0.iter().map(|n| n.load(Ordering::Relaxed)).collect()
    }
}
