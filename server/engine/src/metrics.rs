//! Server metrics, written by the worker and the HTTP layer, rendered as
//! Prometheus text by the `prometheus` crate. Ferrox's own names plus the
//! vLLM names autoscalers and routers already read.

use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use ferrox_core::PoolStats;
use ferrox_plan::CacheKind;
use prometheus::core::Collector;
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use ferrox_plan::contract::metric;

use crate::PlanInfo;
use lora::LoraSeries;
use pools::{PoolGauges, ratio};
use speculative::SpecSeries;

/// Finish reasons always exported, even at zero.
const FINISH_REASONS: [&str; 4] = ["stop", "length", "abort", "error"];
/// Rejection reasons always exported, even at zero.
const REJECT_REASONS: [&str; 4] = ["invalid", "too_long", "queue_full", "draining"];

const LATENCY_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// Which latency histogram an observation goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Latency {
    /// Submission to first token.
    TimeToFirstToken,
    /// Between consecutive tokens of one request.
    InterToken,
    /// Submission to the end.
    EndToEnd,
    /// Submission to admission.
    Queue,
}

const LATENCIES: [(Latency, &str, &str); 4] = [
    (
        Latency::TimeToFirstToken,
        "ferrox_time_to_first_token_seconds",
        "Time from submission to the first generated token.",
    ),
    (
        Latency::InterToken,
        "ferrox_inter_token_latency_seconds",
        "Time between consecutive tokens of one request.",
    ),
    (
        Latency::EndToEnd,
        "ferrox_e2e_request_latency_seconds",
        "Time from submission to the end of a request.",
    ),
    (
        Latency::Queue,
        "ferrox_queue_time_seconds",
        "Time a request waited for admission.",
    ),
];

/// vLLM's names for the same latencies (inter-token latency under both the
/// current and the older name), so vLLM's dashboards and alerts read them.
const VLLM_LATENCIES: [(Latency, &str, &str); 5] = [
    (
        Latency::TimeToFirstToken,
        "vllm:time_to_first_token_seconds",
        "Time to first token (vLLM name).",
    ),
    (
        Latency::InterToken,
        "vllm:inter_token_latency_seconds",
        "Time between tokens (vLLM name).",
    ),
    (
        Latency::InterToken,
        "vllm:time_per_output_token_seconds",
        "Time between tokens (vLLM's older name).",
    ),
    (
        Latency::EndToEnd,
        "vllm:e2e_request_latency_seconds",
        "End-to-end request latency (vLLM name).",
    ),
    (
        Latency::Queue,
        "vllm:request_queue_time_seconds",
        "Time waiting for admission (vLLM name).",
    ),
];

/// Finish reasons vLLM's `request_success_total` counts.
const VLLM_FINISH_REASONS: [&str; 3] = ["stop", "length", "abort"];

/// The KV pool's gauges, in blocks.
struct KvGauges {
    reserved: IntGauge,
    total: IntGauge,
    pinned: IntGauge,
    cached: IntGauge,
    free: IntGauge,
    filled: IntGauge,
    ratio: Gauge,
}

/// The vLLM-named copies, labelled with the served model's name at render.
struct VllmSeries {
    waiting: GaugeVec,
    running: GaugeVec,
    kv_usage: GaugeVec,
    prefix_queries: IntCounterVec,
    prefix_hits: IntCounterVec,
    prompt_tokens: IntCounterVec,
    generation_tokens: IntCounterVec,
    success: IntCounterVec,
    /// As [`VLLM_LATENCIES`]; observed as they happen (a histogram cannot
    /// be copied at render), through [`Metrics::set_model_name`]'s children.
    latency: [HistogramVec; 5],
}

/// The plan the server runs with; absent until [`Metrics::set_plan`].
struct PlanSeries {
    cache_config: IntGaugeVec,
    weight_bytes: IntGaugeVec,
    kv_block_bytes: IntGaugeVec,
    max_seqs: IntGaugeVec,
    max_model_len: IntGaugeVec,
    memory_bytes: IntGaugeVec,
    pool_blocks: IntGaugeVec,
}

/// Every metric the server exports. Shared by the worker and the HTTP layer.
pub struct Metrics {
    registry: Registry,
    waiting: IntGauge,
    running: IntGauge,
    kv: KvGauges,
    pools: PoolGauges,
    prompt_tokens: IntCounter,
    generation_tokens: IntCounter,
    prefix_queries: IntCounter,
    prefix_hits: IntCounter,
    finished: IntCounterVec,
    rejected: IntCounterVec,
    latency: [Histogram; 4],
    vllm: VllmSeries,
    /// The served model's children of the vLLM latency histograms, once
    /// its name is known.
    vllm_latency: OnceLock<[Histogram; 5]>,
    plan: PlanSeries,
    lora: LoraSeries,
    spec: SpecSeries,
    tier: tier::TierSeries,
    /// Renders copy into the vLLM series; one at a time.
    rendering: Mutex<()>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// Registers `c` in `r` and hands it back.
fn reg<C: Collector + Clone + 'static>(r: &Registry, c: C) -> prometheus::Result<C> {
    r.register(Box::new(c.clone()))?;
    Ok(c)
}

fn int_gauge(r: &Registry, name: &str, help: &str) -> prometheus::Result<IntGauge> {
    reg(r, IntGauge::new(name, help)?)
}

fn int_counter(r: &Registry, name: &str, help: &str) -> prometheus::Result<IntCounter> {
    reg(r, IntCounter::new(name, help)?)
}

/// A gauge vector; with no labels it has no series until first set.
fn int_gauges(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntGaugeVec> {
    reg(r, IntGaugeVec::new(Opts::new(name, help), labels)?)
}

fn model_gauge(r: &Registry, name: &str, help: &str) -> prometheus::Result<GaugeVec> {
    reg(r, GaugeVec::new(Opts::new(name, help), &["model_name"])?)
}

fn model_counter(r: &Registry, name: &str, help: &str) -> prometheus::Result<IntCounterVec> {
    reg(
        r,
        IntCounterVec::new(Opts::new(name, help), &["model_name"])?,
    )
}

/// A counter by `reason`, every one of `always` exported from the start.
fn by_reason(
    r: &Registry,
    name: &str,
    help: &str,
    always: &[&str],
) -> prometheus::Result<IntCounterVec> {
    let v = reg(r, IntCounterVec::new(Opts::new(name, help), &["reason"])?)?;
    for reason in always {
        v.get_metric_with_label_values(&[reason])?;
    }
    Ok(v)
}

fn histogram(r: &Registry, name: &str, help: &str) -> prometheus::Result<Histogram> {
    let opts = HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec());
    reg(r, Histogram::with_opts(opts)?)
}

/// vLLM's spelling of a boolean label value.
fn python_bool(b: bool) -> &'static str {
    if b { "True" } else { "False" }
}

impl KvGauges {
    fn new(r: &Registry) -> prometheus::Result<Self> {
        Ok(KvGauges {
            reserved: int_gauge(
                r,
                "ferrox_kv_blocks_used",
                "KV cache blocks reserved by running requests (what admission counts).",
            )?,
            total: int_gauge(r, "ferrox_kv_blocks_total", "KV cache blocks in the pool.")?,
            pinned: int_gauge(
                r,
                "ferrox_kv_blocks_pinned",
                "Reserved KV blocks that are prefix-cached, shared by every request holding them.",
            )?,
            cached: int_gauge(
                r,
                "ferrox_kv_blocks_cached",
                "Prefix-cached KV blocks no request holds: free, evicted least recently used first.",
            )?,
            free: int_gauge(
                r,
                "ferrox_kv_blocks_free",
                "KV blocks neither reserved nor cached.",
            )?,
            filled: int_gauge(
                r,
                "ferrox_kv_blocks_filled",
                "Reserved KV blocks that hold tokens.",
            )?,
            ratio: reg(
                r,
                Gauge::new(
                    metric::KV_USAGE,
                    "Fraction of KV cache blocks reserved by running requests.",
                )?,
            )?,
        })
    }
}

impl VllmSeries {
    fn new(r: &Registry) -> prometheus::Result<Self> {
        Ok(VllmSeries {
            waiting: model_gauge(
                r,
                "vllm:num_requests_waiting",
                "Requests waiting (vLLM name).",
            )?,
            running: model_gauge(
                r,
                "vllm:num_requests_running",
                "Requests running (vLLM name).",
            )?,
            kv_usage: model_gauge(
                r,
                "vllm:kv_cache_usage_perc",
                "KV cache usage, 1 means 100 percent (vLLM name).",
            )?,
            prefix_queries: model_counter(
                r,
                "vllm:prefix_cache_queries_total",
                "Prompt tokens looked up in the prefix cache (vLLM name).",
            )?,
            prefix_hits: model_counter(
                r,
                "vllm:prefix_cache_hits_total",
                "Prompt tokens found in the prefix cache (vLLM name).",
            )?,
            prompt_tokens: model_counter(
                r,
                "vllm:prompt_tokens_total",
                "Prompt tokens admitted (vLLM name).",
            )?,
            generation_tokens: model_counter(
                r,
                "vllm:generation_tokens_total",
                "Tokens generated (vLLM name).",
            )?,
            success: reg(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "vllm:request_success_total",
                        "Requests finished, by finish reason (vLLM name).",
                    ),
                    &["model_name", "finished_reason"],
                )?,
            )?,
            latency: {
                let [a, b, c, d, e] = VLLM_LATENCIES.map(|(_, name, help)| {
                    let opts = HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec());
                    HistogramVec::new(opts, &["model_name"]).and_then(|h| reg(r, h))
                });
                [a?, b?, c?, d?, e?]
            },
        })
    }
}

impl PlanSeries {
    fn new(r: &Registry) -> prometheus::Result<Self> {
        let cache_labels = [
            "block_size",
            "cache_dtype",
            "num_gpu_blocks",
            "gpu_memory_utilization",
            "enable_prefix_caching",
            "sliding_window",
        ];
        Ok(PlanSeries {
            cache_config: int_gauges(
                r,
                metric::CACHE_CONFIG_INFO,
                "The KV cache the server planned (vLLM's info gauge).",
                &cache_labels,
            )?,
            weight_bytes: int_gauges(
                r,
                metric::PLAN_WEIGHT_BYTES,
                "Bytes of the weights as held on the device, as planned.",
                &[],
            )?,
            kv_block_bytes: int_gauges(
                r,
                metric::PLAN_KV_BLOCK_BYTES,
                "Bytes of one KV block.",
                &[],
            )?,
            max_seqs: int_gauges(r, metric::PLAN_MAX_SEQS, "Most sequences at once.", &[])?,
            max_model_len: int_gauges(
                r,
                metric::PLAN_MAX_MODEL_LEN,
                "Longest sequence (prompt + output) in tokens.",
                &[],
            )?,
            memory_bytes: int_gauges(
                r,
                metric::PLAN_MEMORY_BYTES,
                "The memory figure the plan was made from, by where it came from.",
                &["source"],
            )?,
            pool_blocks: int_gauges(
                r,
                metric::PLAN_POOL_BLOCKS,
                "Blocks of each pool the server runs with, by pool.",
                &[metric::POOL_LABEL],
            )?,
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sets the one series of a vector, whatever its labels.
fn set_only(v: &IntGaugeVec, labels: &[&str], value: u64) {
    v.reset();
    if let Ok(g) = v.get_metric_with_label_values(labels) {
        g.set(i64::try_from(value).unwrap_or(i64::MAX));
    }
}

impl Metrics {
    /// Every series registered, at zero.
    pub fn new() -> prometheus::Result<Self> {
        let r = Registry::new();
        let latency = [0, 1, 2, 3].map(|i| histogram(&r, LATENCIES[i].1, LATENCIES[i].2));
        let [a, b, c, d] = latency;
        Ok(Metrics {
            waiting: int_gauge(&r, metric::WAITING, "Requests waiting for admission.")?,
            running: int_gauge(&r, metric::RUNNING, "Requests prefilling or decoding.")?,
            kv: KvGauges::new(&r)?,
            pools: PoolGauges::new(&r)?,
            prompt_tokens: int_counter(
                &r,
                "ferrox_prompt_tokens_total",
                "Prompt tokens admitted.",
            )?,
            generation_tokens: int_counter(
                &r,
                "ferrox_generation_tokens_total",
                "Tokens generated.",
            )?,
            prefix_queries: int_counter(
                &r,
                "ferrox_prefix_cache_queries_total",
                "Prompt tokens looked up in the prefix cache at admission.",
            )?,
            prefix_hits: int_counter(
                &r,
                "ferrox_prefix_cache_hits_total",
                "Prompt tokens taken from the prefix cache at admission.",
            )?,
            finished: by_reason(
                &r,
                metric::FINISHED,
                "Requests ended, by reason.",
                &FINISH_REASONS,
            )?,
            rejected: by_reason(
                &r,
                "ferrox_requests_rejected_total",
                "Requests refused at submission, by reason.",
                &REJECT_REASONS,
            )?,
            latency: [a?, b?, c?, d?],
            vllm: VllmSeries::new(&r)?,
            vllm_latency: OnceLock::new(),
            plan: PlanSeries::new(&r)?,
            lora: LoraSeries::new(&r)?,
            spec: SpecSeries::new(&r)?,
            tier: tier::TierSeries::new(&r)?,
            registry: r,
            rendering: Mutex::new(()),
        })
    }

    /// Sets the gauges the worker owns, from every pool, by kind: the KV
    /// pool's (zeros for a model without full-attention layers), each
    /// pool's series, and the usage ratio of the fullest pool that holds
    /// tokens.
    pub fn set_gauges(&self, waiting: usize, running: usize, pools: &[(CacheKind, PoolStats)]) {
        let int = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.waiting.set(int(waiting));
        self.running.set(int(running));
        let kv = pools
            .iter()
            .find(|(k, _)| *k == CacheKind::Full)
            .map(|(_, s)| *s)
            .unwrap_or_default();
        let g = &self.kv;
        g.reserved.set(int(kv.reserved));
        g.total.set(int(kv.total));
        g.pinned.set(int(kv.pinned));
        g.cached.set(int(kv.cached));
        g.free.set(int(kv.free));
        g.filled.set(int(kv.filled));
        let tokens = pools.iter().filter(|(k, _)| k.holds_tokens());
        g.ratio
            .set(tokens.map(|(_, s)| ratio(s)).fold(0.0, f64::max));
        for (kind, s) in pools {
            self.pools.set(*kind, s);
        }
    }

    /// Exports the plan the server runs with; call once at start (a later
    /// call replaces it).
    pub fn set_plan(&self, p: &PlanInfo) {
        let s = &self.plan;
        let labels = [
            p.block_size.to_string(),
            p.kv_dtype.clone(),
            p.blocks(CacheKind::Full).to_string(),
            p.memory_utilization.to_string(),
            python_bool(p.prefix_caching).to_string(),
            // vLLM's spelling: the model's window, or Python's `None`.
            p.pools
                .iter()
                .find_map(|p| p.kind.window())
                .map_or_else(|| "None".to_string(), |w| w.to_string()),
        ];
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        set_only(&s.cache_config, &labels, 1);
        set_only(&s.weight_bytes, &[], p.weight_bytes);
        set_only(&s.kv_block_bytes, &[], p.kv_block_bytes);
        set_only(&s.max_seqs, &[], p.max_seqs as u64);
        set_only(&s.max_model_len, &[], p.max_model_len as u64);
        set_only(&s.memory_bytes, &[&p.memory_source], p.memory_bytes);
        s.pool_blocks.reset();
        for pool in &p.pools {
            let name = pool.kind.to_string();
            if let Ok(g) = s.pool_blocks.get_metric_with_label_values(&[&name]) {
                g.set(i64::try_from(pool.blocks).unwrap_or(i64::MAX));
            }
        }
    }

    /// Exports the LoRA series from now on, with `--max-loras`.
    pub fn enable_lora(&self, max_loras: usize) {
        self.lora.enable(max_loras);
    }

    /// The adapters of the running rows and of the waiting line (names,
    /// repeats allowed); a no-op until [`Metrics::enable_lora`].
    pub fn set_lora_info(&self, running: Vec<String>, waiting: Vec<String>) {
        self.lora.set_info(running, waiting);
    }

    /// The LoRA adapters served now: name, and whether held in memory.
    pub fn set_lora_adapters(&self, adapters: &[(String, bool)]) {
        self.lora.set_adapters(adapters);
    }

    /// Exports the speculative decoding series from now on, for drafts of
    /// up to `k` tokens.
    pub fn enable_spec(&self, k: usize) {
        self.spec.enable(k);
    }

    /// Counts a speculating server's step by what the pay-off rule decided.
    pub fn spec_step(&self, decision: &str) {
        self.spec.step(decision);
    }

    /// Counts one row's verification: `accepted` of `drafted` draft tokens.
    pub fn spec_verified(&self, drafted: usize, accepted: usize) {
        self.spec.verified(drafted, accepted);
    }

    /// Counts a request submitted for `adapter`.
    pub fn lora_request(&self, adapter: &str) {
        self.lora.request(adapter);
    }

    /// Requests waiting for admission, as last published.
    pub fn waiting(&self) -> usize {
        self.waiting.get().max(0) as usize
    }

    /// Requests prefilling or decoding, as last published.
    pub fn running(&self) -> usize {
        self.running.get().max(0) as usize
    }

    /// KV blocks reserved, as last published.
    pub fn kv_used(&self) -> usize {
        self.kv.reserved.get().max(0) as usize
    }

    /// Counts prompt tokens admitted.
    pub fn add_prompt_tokens(&self, n: usize) {
        self.prompt_tokens.inc_by(n as u64);
    }

    /// Counts one admission's prefix-cache lookup: `queried` prompt tokens,
    /// `hit` of them found cached.
    pub fn add_prefix_cache(&self, queried: usize, hit: usize) {
        self.prefix_queries.inc_by(queried as u64);
        self.prefix_hits.inc_by(hit as u64);
    }

    /// Counts generated tokens.
    pub fn add_generation_tokens(&self, n: usize) {
        self.generation_tokens.inc_by(n as u64);
    }

    /// Counts a request that ended (`stop`, `length`, `abort`, `error`).
    pub fn finished(&self, reason: &str) {
        if let Ok(c) = self.finished.get_metric_with_label_values(&[reason]) {
            c.inc();
        }
    }

    /// Counts a request refused at the door.
    pub fn rejected(&self, reason: &str) {
        if let Ok(c) = self.rejected.get_metric_with_label_values(&[reason]) {
            c.inc();
        }
    }

    /// Names the served model in the vLLM series' `model_name` label; the
    /// latency histograms under vLLM's names count from here (call once,
    /// before the first request; a later call changes nothing).
    pub fn set_model_name(&self, name: &str) {
        let children = self
            .vllm
            .latency
            .each_ref()
            .map(|h| h.with_label_values(&[name]));
        let _ = self.vllm_latency.set(children);
    }

    /// Records one latency, under Ferrox's name and vLLM's.
    pub fn observe(&self, which: Latency, d: Duration) {
        let secs = d.as_secs_f64();
        let i = LATENCIES.iter().position(|l| l.0 == which).unwrap_or(0);
        self.latency[i].observe(secs);
        if let Some(children) = self.vllm_latency.get() {
            for (h, (l, ..)) in children.iter().zip(&VLLM_LATENCIES) {
                if *l == which {
                    h.observe(secs);
                }
            }
        }
    }

    /// Copies the current values into the vLLM series of `model_name`.
    fn refresh_vllm(&self, model_name: &str) {
        let v = &self.vllm;
        let label = [model_name];
        let gauges = [
            (&v.waiting, self.waiting.get() as f64),
            (&v.running, self.running.get() as f64),
            (&v.kv_usage, self.kv.ratio.get()),
        ];
        for (vec, value) in gauges {
            vec.reset();
            if let Ok(g) = vec.get_metric_with_label_values(&label) {
                g.set(value);
            }
        }
        let counters = [
            (&v.prefix_queries, self.prefix_queries.get()),
            (&v.prefix_hits, self.prefix_hits.get()),
            (&v.prompt_tokens, self.prompt_tokens.get()),
            (&v.generation_tokens, self.generation_tokens.get()),
        ];
        for (vec, value) in counters {
            vec.reset();
            if let Ok(c) = vec.get_metric_with_label_values(&label) {
                c.inc_by(value);
            }
        }
        self.spec.refresh(model_name);
        self.tier.refresh(model_name);
        v.success.reset();
        for reason in VLLM_FINISH_REASONS {
            let done = self.finished.get_metric_with_label_values(&[reason]);
            let into = v
                .success
                .get_metric_with_label_values(&[model_name, reason]);
            if let (Ok(done), Ok(into)) = (done, into) {
                into.inc_by(done.get());
            }
        }
    }

    /// The Prometheus text exposition; `model_name` labels the vLLM series.
    pub fn render(&self, model_name: &str) -> String {
        let _one = lock(&self.rendering);
        self.refresh_vllm(model_name);
        let mut out = Vec::new();
        match TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            Ok(()) => String::from_utf8_lossy(&out).into_owned(),
            // Still valid exposition text: a comment, and no series.
            Err(e) => format!("# ferrox: the metrics could not be encoded: {e}\n"),
        }
    }
}

mod lora;
mod pools;
mod speculative;
mod tier;

#[cfg(test)]
mod tests;
