//! The router's Prometheus series: decisions by reason, predicted hit
//! blocks, in flight per endpoint, waiting per model.

use ferrox_plan::KvTier;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Decisions, by model and reason.
pub const DECISIONS: &str = "ferrox_router_decisions_total";
/// Blocks the chosen endpoint was predicted to hold, per decision.
pub const PREDICTED_HIT_BLOCKS: &str = "ferrox_router_predicted_hit_blocks";
/// Blocks the chosen endpoint was predicted to hold, by the best KV tier
/// holding each (`device`, `host`, `disk`).
pub const PREDICTED_TIER_BLOCKS: &str = "ferrox_router_predicted_tier_blocks_total";
/// Requests in flight, per endpoint.
pub const IN_FLIGHT: &str = "ferrox_router_endpoint_in_flight";
/// Requests waiting for a ready endpoint, per model: the scale-from-zero
/// trigger (KEDA's query names it: the contract's).
pub const PENDING: &str = ferrox_plan::contract::router::PENDING_METRIC;
/// Requests refused while waiting (queue full, timed out), per model.
pub const REFUSED: &str = "ferrox_router_pending_refused_total";

/// The registered series.
pub struct Metrics {
    registry: Registry,
    decisions: IntCounterVec,
    hit_blocks: HistogramVec,
    tier_blocks: IntCounterVec,
    in_flight: IntGaugeVec,
    pending: IntGaugeVec,
    refused: IntCounterVec,
}

impl Metrics {
    /// Registers every series.
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let decisions = IntCounterVec::new(
            Opts::new(DECISIONS, "Routing decisions by reason"),
            &["model", "reason"],
        )?;
        let buckets = vec![
            0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0,
        ];
        let hit_blocks = HistogramVec::new(
            HistogramOpts::new(
                PREDICTED_HIT_BLOCKS,
                "KV blocks of the prompt the chosen endpoint was predicted to hold",
            )
            .buckets(buckets),
            &["model"],
        )?;
        let tier_blocks = IntCounterVec::new(
            Opts::new(
                PREDICTED_TIER_BLOCKS,
                "Prompt blocks the chosen endpoints were predicted to hold, by the best KV tier holding each",
            ),
            &["model", "tier"],
        )?;
        let in_flight = IntGaugeVec::new(
            Opts::new(
                IN_FLIGHT,
                "Requests in flight from this router, per endpoint",
            ),
            &["model", "endpoint"],
        )?;
        let pending = IntGaugeVec::new(
            Opts::new(
                PENDING,
                "Requests waiting for a ready endpoint of their model",
            ),
            &["model"],
        )?;
        let refused = IntCounterVec::new(
            Opts::new(REFUSED, "Waiting requests refused: queue full or timed out"),
            &["model", "why"],
        )?;
        registry.register(Box::new(decisions.clone()))?;
        registry.register(Box::new(hit_blocks.clone()))?;
        registry.register(Box::new(tier_blocks.clone()))?;
        registry.register(Box::new(in_flight.clone()))?;
        registry.register(Box::new(pending.clone()))?;
        registry.register(Box::new(refused.clone()))?;
        Ok(Metrics {
            registry,
            decisions,
            hit_blocks,
            tier_blocks,
            in_flight,
            pending,
            refused,
        })
    }

    /// Counts one decision.
    pub fn decided(&self, model: &str, reason: &str, hit_blocks: usize) {
        self.decisions.with_label_values(&[model, reason]).inc();
        self.hit_blocks
            .with_label_values(&[model])
            .observe(hit_blocks as f64);
    }

    /// Counts a decision's predicted blocks by the tier holding them
    /// (device, host, disk); a tier with none is not touched.
    pub fn tier_blocks(&self, model: &str, by_tier: [usize; 3]) {
        let tiers = [KvTier::Device, KvTier::Host, KvTier::Disk];
        for (tier, n) in tiers.into_iter().zip(by_tier).filter(|(_, n)| *n > 0) {
            let counter = self.tier_blocks.with_label_values(&[model, tier.name()]);
            counter.inc_by(n as u64);
        }
    }

    /// Sets an endpoint's in-flight gauge.
    pub fn set_in_flight(&self, model: &str, endpoint: &str, n: usize) {
        self.in_flight
            .with_label_values(&[model, endpoint])
            .set(n as i64);
    }

    /// Drops a gone endpoint's gauge.
    pub fn forget_endpoint(&self, model: &str, endpoint: &str) {
        let _ = self.in_flight.remove_label_values(&[model, endpoint]);
    }

    /// Sets a model's waiting gauge.
    pub fn set_pending(&self, model: &str, n: usize) {
        self.pending.with_label_values(&[model]).set(n as i64);
    }

    /// Counts a refused waiter (`why`: queue-full or timeout).
    pub fn refused(&self, model: &str, why: &str) {
        self.refused.with_label_values(&[model, why]).inc();
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding registered, well-formed families cannot fail.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_series_appears_with_its_labels() {
        let m = Metrics::new().unwrap();
        m.decided("smol", "prefix-hit", 3);
        m.set_in_flight("smol", "http://a:8000", 2);
        m.set_pending("smol", 1);
        m.refused("smol", "timeout");
        m.tier_blocks("smol", [0, 4, 0]);
        let text = m.render();
        for want in [
            r#"ferrox_router_decisions_total{model="smol",reason="prefix-hit"} 1"#,
            r#"ferrox_router_predicted_hit_blocks_sum{model="smol"} 3"#,
            r#"ferrox_router_endpoint_in_flight{endpoint="http://a:8000",model="smol"} 2"#,
            r#"ferrox_router_pending_requests{model="smol"} 1"#,
            r#"ferrox_router_pending_refused_total{model="smol",why="timeout"} 1"#,
            r#"ferrox_router_predicted_tier_blocks_total{model="smol",tier="host"} 4"#,
        ] {
            assert!(text.contains(want), "{want} not in\n{text}");
        }
        m.forget_endpoint("smol", "http://a:8000");
        assert!(!m.render().contains("http://a:8000"));
    }
}
