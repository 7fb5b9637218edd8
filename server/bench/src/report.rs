//! Aggregates per-request timings into the benchmark's report. Pure.

use std::time::Duration;

/// What one request measured.
#[derive(Debug, Clone, PartialEq)]
pub enum Sample {
    /// Seconds from sending to each text chunk.
    Ok {
        /// Arrival times, ascending.
        token_times: Vec<f64>,
    },
    /// Why it failed.
    Failed(String),
}

/// The benchmark's numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Requests that completed.
    pub ok: usize,
    /// Requests that failed, with the first few reasons.
    pub errors: Vec<String>,
    /// Text chunks received in total (≈ tokens).
    pub tokens: usize,
    /// Wall time of the whole run.
    pub wall: Duration,
    /// Time to first token, seconds: p50 and p99.
    pub ttft: (f64, f64),
    /// Inter-token latency, seconds: p50 and p99.
    pub itl: (f64, f64),
}

/// The `q` quantile (0..=1) of sorted `v`, nearest rank; 0 when empty.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn p50_p99(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (percentile(&v, 0.5), percentile(&v, 0.99))
}

impl Report {
    /// Aggregates `samples` from a run that took `wall`.
    pub fn from_samples(samples: &[Sample], wall: Duration) -> Self {
        let mut ttft = Vec::new();
        let mut itl = Vec::new();
        let mut errors = Vec::new();
        let mut tokens = 0;
        for s in samples {
            match s {
                Sample::Ok { token_times } => {
                    tokens += token_times.len();
                    if let Some(first) = token_times.first() {
                        ttft.push(*first);
                    }
                    itl.extend(token_times.windows(2).map(|w| w[1] - w[0]));
                }
                Sample::Failed(e) => errors.push(e.clone()),
            }
        }
        Report {
            ok: samples.len() - errors.len(),
            errors,
            tokens,
            wall,
            ttft: p50_p99(ttft),
            itl: p50_p99(itl),
        }
    }

    /// Output tokens per second over the whole run.
    pub fn throughput(&self) -> f64 {
        let secs = self.wall.as_secs_f64();
        if secs > 0.0 {
            self.tokens as f64 / secs
        } else {
            0.0
        }
    }

    /// The human-readable report.
    pub fn render(&self, concurrency: usize) -> String {
        let mut out = format!(
            "concurrency: {concurrency}\nrequests: {} ok, {} failed\noutput tokens: {}\n\
             wall: {:.2} s\nthroughput: {:.1} tokens/s\n\
             TTFT: p50 {:.1} ms, p99 {:.1} ms\nITL: p50 {:.1} ms, p99 {:.1} ms",
            self.ok,
            self.errors.len(),
            self.tokens,
            self.wall.as_secs_f64(),
            self.throughput(),
            self.ttft.0 * 1e3,
            self.ttft.1 * 1e3,
            self.itl.0 * 1e3,
            self.itl.1 * 1e3,
        );
        for e in self.errors.iter().take(5) {
            out.push_str(&format!("\nerror: {e}"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let cases = [(0.5, 50.0), (0.99, 99.0), (1.0, 100.0), (0.0, 1.0)];
        for (q, want) in cases {
            assert_eq!(percentile(&v, q), want);
        }
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    #[test]
    fn aggregates_tokens_ttft_itl_and_errors() {
        let samples = vec![
            Sample::Ok {
                token_times: vec![0.1, 0.2, 0.4],
            },
            Sample::Ok {
                token_times: vec![0.3, 0.35],
            },
            Sample::Failed("HTTP 429".into()),
        ];
        let r = Report::from_samples(&samples, Duration::from_secs(1));
        assert_eq!((r.ok, r.tokens, r.errors.len()), (2, 5, 1));
        assert_eq!(r.ttft.0, 0.1);
        assert_eq!(r.ttft.1, 0.3);
        assert!((r.itl.1 - 0.2).abs() < 1e-9);
        assert_eq!(r.throughput(), 5.0);
        assert!(r.render(4).contains("error: HTTP 429"));
    }
}
