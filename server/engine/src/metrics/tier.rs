//! The lower KV tiers' series, by `tier` (`host`, `disk`), and vLLM's
//! external prefix cache counters (its KV connector's; here the tiers').
//! Tier series appear once a tier is configured.

use ferrox_plan::KvTier;
use ferrox_plan::contract::metric;
use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
};

use super::{Metrics, int_counter, int_gauges, reg};

pub(super) struct TierSeries {
    blocks: IntGaugeVec,
    capacity: IntGaugeVec,
    hits: IntCounterVec,
    misses: IntCounterVec,
    corrupt: IntCounterVec,
    written: IntCounterVec,
    read: IntCounterVec,
    read_seconds: HistogramVec,
    queries: IntCounter,
    found: IntCounter,
    vllm_queries: IntCounterVec,
    vllm_hits: IntCounterVec,
}

fn by_tier(r: &Registry, name: &str, help: &str) -> prometheus::Result<IntCounterVec> {
    reg(
        r,
        IntCounterVec::new(Opts::new(name, help), &[metric::TIER_LABEL])?,
    )
}

fn by_model(r: &Registry, name: &str, help: &str) -> prometheus::Result<IntCounterVec> {
    reg(
        r,
        IntCounterVec::new(Opts::new(name, help), &["model_name"])?,
    )
}

impl TierSeries {
    pub(super) fn new(r: &Registry) -> prometheus::Result<Self> {
        let label = [metric::TIER_LABEL];
        let read_opts = HistogramOpts::new(
            metric::TIER_READ_SECONDS,
            "Seconds one request's blocks took to read back from a lower tier.",
        )
        .buckets(vec![
            0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        ]);
        Ok(TierSeries {
            blocks: int_gauges(
                r,
                metric::TIER_BLOCKS,
                "Blocks a lower KV tier holds.",
                &label,
            )?,
            capacity: int_gauges(
                r,
                metric::TIER_CAPACITY_BLOCKS,
                "Blocks a lower KV tier can hold.",
                &label,
            )?,
            hits: by_tier(
                r,
                metric::TIER_HITS,
                "Blocks read back whole from a lower tier.",
            )?,
            misses: by_tier(
                r,
                metric::TIER_MISSES,
                "Blocks looked up in a lower tier and not found, or refused.",
            )?,
            corrupt: by_tier(
                r,
                metric::TIER_CORRUPT,
                "Blocks a lower tier read back and refused (torn, truncated, corrupt, gone).",
            )?,
            written: by_tier(
                r,
                metric::TIER_WRITTEN_BYTES,
                "Bytes written to a lower tier.",
            )?,
            read: by_tier(
                r,
                metric::TIER_READ_BYTES,
                "Bytes read back from a lower tier.",
            )?,
            read_seconds: reg(r, HistogramVec::new(read_opts, &label)?)?,
            queries: int_counter(
                r,
                "ferrox_external_prefix_cache_queries_total",
                "Prompt tokens looked up in the lower KV tiers.",
            )?,
            found: int_counter(
                r,
                "ferrox_external_prefix_cache_hits_total",
                "Prompt tokens read back from the lower KV tiers.",
            )?,
            vllm_queries: by_model(
                r,
                metric::EXTERNAL_PREFIX_QUERIES,
                "Prompt tokens looked up outside the device pool (vLLM name).",
            )?,
            vllm_hits: by_model(
                r,
                metric::EXTERNAL_PREFIX_HITS,
                "Prompt tokens found outside the device pool (vLLM name).",
            )?,
        })
    }

    pub(super) fn refresh(&self, model_name: &str) {
        for (vec, value) in [
            (&self.vllm_queries, self.queries.get()),
            (&self.vllm_hits, self.found.get()),
        ] {
            vec.reset();
            if let Ok(c) = vec.get_metric_with_label_values(&[model_name]) {
                c.inc_by(value);
            }
        }
    }
}

impl Metrics {
    /// Sets a lower tier's size gauges.
    pub fn set_tier_blocks(&self, tier: KvTier, blocks: usize, capacity: usize) {
        let t = &self.tier;
        let int = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        t.blocks.with_label_values(&[tier.name()]).set(int(blocks));
        t.capacity
            .with_label_values(&[tier.name()])
            .set(int(capacity));
    }

    /// Counts blocks read back whole from `tier` and their bytes.
    pub fn tier_hits(&self, tier: KvTier, blocks: u64, bytes: u64) {
        self.tier
            .hits
            .with_label_values(&[tier.name()])
            .inc_by(blocks);
        self.tier
            .read
            .with_label_values(&[tier.name()])
            .inc_by(bytes);
    }

    /// Counts a block `tier` did not give back; `corrupt` when it had a copy
    /// and refused it.
    pub fn tier_miss(&self, tier: KvTier, corrupt: bool) {
        self.tier.misses.with_label_values(&[tier.name()]).inc();
        if corrupt {
            self.tier.corrupt.with_label_values(&[tier.name()]).inc();
        }
    }

    /// Counts bytes written to `tier`.
    pub fn tier_written(&self, tier: KvTier, bytes: u64) {
        self.tier
            .written
            .with_label_values(&[tier.name()])
            .inc_by(bytes);
    }

    /// Records one request's read back from `tier`.
    pub fn tier_read_time(&self, tier: KvTier, secs: f64) {
        let h = self.tier.read_seconds.with_label_values(&[tier.name()]);
        h.observe(secs);
    }

    /// Counts prompt tokens looked up in the lower tiers, and those found.
    pub fn add_external_prefix(&self, queried: usize, found: usize) {
        self.tier.queries.inc_by(queried as u64);
        self.tier.found.inc_by(found as u64);
    }
}
