//! What one look at a model's servers saw: the input of both the scaling
//! decision and the idle clock, so neither has to reach into the other.

/// One scrape of every ready pod, aggregated.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Observation {
    /// Pods that answered.
    pub pods: u32,
    /// Waiting requests, summed.
    pub waiting: f64,
    /// Running requests, summed.
    pub running: f64,
    /// KV usage ratio, averaged over pods.
    pub kv_usage: f64,
    /// Requests finished, summed over pods (a counter).
    pub finished: f64,
    /// Requests waiting in ferrox-router for a ready replica.
    pub pending: f64,
}
