//! Server metrics, written by the worker and the HTTP layer, rendered as
//! Prometheus text. Ferrox's own names plus the vLLM names autoscalers and
//! routers already read.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// Finish reasons always exported, even at zero.
const FINISH_REASONS: [&str; 4] = ["stop", "length", "abort", "error"];
/// Rejection reasons always exported, even at zero.
const REJECT_REASONS: [&str; 4] = ["invalid", "too_long", "queue_full", "draining"];

const LATENCY_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// A fixed-bucket histogram of seconds.
#[derive(Debug, Default)]
struct Histogram {
    counts: [u64; LATENCY_BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, secs: f64) {
        for (i, le) in LATENCY_BUCKETS.iter().enumerate() {
            if secs <= *le {
                self.counts[i] += 1;
            }
        }
        self.count += 1;
        self.sum += secs;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        header(out, name, help, "histogram");
        for (le, n) in LATENCY_BUCKETS.iter().zip(self.counts) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {n}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

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

/// Every metric the server exports. Shared by the worker and the HTTP layer.
#[derive(Debug, Default)]
pub struct Metrics {
    waiting: AtomicUsize,
    running: AtomicUsize,
    kv_used: AtomicUsize,
    kv_total: AtomicUsize,
    prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    finished: Mutex<BTreeMap<&'static str, u64>>,
    rejected: Mutex<BTreeMap<&'static str, u64>>,
    histograms: Mutex<[Histogram; 4]>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Counters stay meaningful after a panic elsewhere; keep serving them.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

impl Metrics {
    /// Sets the gauges the worker owns.
    pub fn set_gauges(&self, waiting: usize, running: usize, kv_used: usize, kv_total: usize) {
        self.waiting.store(waiting, Ordering::Relaxed);
        self.running.store(running, Ordering::Relaxed);
        self.kv_used.store(kv_used, Ordering::Relaxed);
        self.kv_total.store(kv_total, Ordering::Relaxed);
    }

    /// Requests waiting for admission, as last published.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Requests prefilling or decoding, as last published.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }

    /// KV blocks leased, as last published.
    pub fn kv_used(&self) -> usize {
        self.kv_used.load(Ordering::Relaxed)
    }

    /// Counts prompt tokens admitted.
    pub fn add_prompt_tokens(&self, n: usize) {
        self.prompt_tokens.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Counts generated tokens.
    pub fn add_generation_tokens(&self, n: usize) {
        self.generation_tokens
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Counts a request that ended (`stop`, `length`, `abort`, `error`).
    pub fn finished(&self, reason: &'static str) {
        *lock(&self.finished).entry(reason).or_insert(0) += 1;
    }

    /// Counts a request refused at the door.
    pub fn rejected(&self, reason: &'static str) {
        *lock(&self.rejected).entry(reason).or_insert(0) += 1;
    }

    /// Records one latency.
    pub fn observe(&self, which: Latency, d: Duration) {
        let i = LATENCIES.iter().position(|l| l.0 == which).unwrap_or(0);
        lock(&self.histograms)[i].observe(d.as_secs_f64());
    }

    /// The Prometheus text exposition; `model_name` labels the vLLM gauges.
    pub fn render(&self, model_name: &str) -> String {
        let mut out = String::new();
        let (waiting, running) = (self.waiting(), self.running());
        let (used, total) = (self.kv_used(), self.kv_total.load(Ordering::Relaxed));
        let ratio = if total == 0 {
            0.0
        } else {
            used as f64 / total as f64
        };
        let gauges: [(&str, &str, f64); 5] = [
            (
                "ferrox_requests_waiting",
                "Requests waiting for admission.",
                waiting as f64,
            ),
            (
                "ferrox_requests_running",
                "Requests prefilling or decoding.",
                running as f64,
            ),
            (
                "ferrox_kv_blocks_used",
                "KV cache blocks leased.",
                used as f64,
            ),
            (
                "ferrox_kv_blocks_total",
                "KV cache blocks in the pool.",
                total as f64,
            ),
            (
                "ferrox_kv_usage_ratio",
                "Fraction of KV cache blocks leased.",
                ratio,
            ),
        ];
        for (name, help, v) in gauges {
            header(&mut out, name, help, "gauge");
            let _ = writeln!(out, "{name} {v}");
        }
        let counters = [
            (
                "ferrox_prompt_tokens_total",
                "Prompt tokens admitted.",
                &self.prompt_tokens,
            ),
            (
                "ferrox_generation_tokens_total",
                "Tokens generated.",
                &self.generation_tokens,
            ),
        ];
        for (name, help, v) in counters {
            header(&mut out, name, help, "counter");
            let _ = writeln!(out, "{name} {}", v.load(Ordering::Relaxed));
        }
        labelled_counter(
            &mut out,
            "ferrox_requests_finished_total",
            "Requests ended, by reason.",
            &lock(&self.finished),
            &FINISH_REASONS,
        );
        labelled_counter(
            &mut out,
            "ferrox_requests_rejected_total",
            "Requests refused at submission, by reason.",
            &lock(&self.rejected),
            &REJECT_REASONS,
        );
        let hist = lock(&self.histograms);
        for (i, (_, name, help)) in LATENCIES.iter().enumerate() {
            hist[i].render(&mut out, name, help);
        }
        drop(hist);
        let label = escape_label(model_name);
        let vllm: [(&str, &str, f64); 3] = [
            (
                "vllm:num_requests_waiting",
                "Requests waiting (vLLM name).",
                waiting as f64,
            ),
            (
                "vllm:num_requests_running",
                "Requests running (vLLM name).",
                running as f64,
            ),
            (
                "vllm:kv_cache_usage_perc",
                "KV cache usage, 1 means 100 percent (vLLM name).",
                ratio,
            ),
        ];
        for (name, help, v) in vllm {
            header(&mut out, name, help, "gauge");
            let _ = writeln!(out, "{name}{{model_name=\"{label}\"}} {v}");
        }
        out
    }
}

fn labelled_counter(
    out: &mut String,
    name: &str,
    help: &str,
    values: &BTreeMap<&'static str, u64>,
    always: &[&'static str],
) {
    header(out, name, help, "counter");
    let mut all: BTreeMap<&str, u64> = always.iter().map(|r| (*r, 0)).collect();
    all.extend(values.iter().map(|(k, v)| (*k, *v)));
    for (reason, n) in all {
        let _ = writeln!(out, "{name}{{reason=\"{reason}\"}} {n}");
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn renders_every_series_with_its_value() {
        let m = Metrics::default();
        m.set_gauges(3, 2, 5, 20);
        m.add_prompt_tokens(7);
        m.add_generation_tokens(11);
        m.finished("length");
        m.rejected("queue_full");
        m.observe(Latency::TimeToFirstToken, Duration::from_millis(30));
        let t = m.render("smol\"m");
        let cases: &[(&str, f64)] = &[
            ("ferrox_requests_waiting", 3.0),
            ("ferrox_requests_running", 2.0),
            ("ferrox_kv_blocks_used", 5.0),
            ("ferrox_kv_blocks_total", 20.0),
            ("ferrox_kv_usage_ratio", 0.25),
            ("ferrox_prompt_tokens_total", 7.0),
            ("ferrox_generation_tokens_total", 11.0),
            ("ferrox_requests_finished_total{reason=\"length\"}", 1.0),
            ("ferrox_requests_finished_total{reason=\"abort\"}", 0.0),
            ("ferrox_requests_rejected_total{reason=\"queue_full\"}", 1.0),
            (
                "ferrox_time_to_first_token_seconds_bucket{le=\"0.025\"}",
                0.0,
            ),
            (
                "ferrox_time_to_first_token_seconds_bucket{le=\"0.05\"}",
                1.0,
            ),
            (
                "ferrox_time_to_first_token_seconds_bucket{le=\"+Inf\"}",
                1.0,
            ),
            ("ferrox_time_to_first_token_seconds_count", 1.0),
            ("ferrox_queue_time_seconds_count", 0.0),
            ("vllm:num_requests_waiting{model_name=\"smol\\\"m\"}", 3.0),
            ("vllm:num_requests_running{model_name=\"smol\\\"m\"}", 2.0),
            ("vllm:kv_cache_usage_perc{model_name=\"smol\\\"m\"}", 0.25),
        ];
        for (series, want) in cases {
            assert_eq!(value(&t, series), Some(*want), "{series}\n{t}");
        }
    }
}
