//! Reading ferrox-server's `/metrics`: the parse is pure, the fetch is a thin shell.

use std::time::Duration;

use prometheus_parse::{Scrape, Value};

use crate::Error;
use crate::autoscale::{Decision, History, Observation, Policy, decide};

/// Queue depth series.
pub const WAITING: &str = "ferrox_requests_waiting";
/// Running requests series.
pub const RUNNING: &str = "ferrox_requests_running";
/// KV usage ratio series.
pub const KV_USAGE: &str = "ferrox_kv_usage_ratio";

/// One pod's numbers.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PodSample {
    /// Waiting requests.
    pub waiting: f64,
    /// Running requests.
    pub running: f64,
    /// KV usage ratio in [0, 1].
    pub kv_usage: f64,
}

/// Parses one Prometheus text exposition into the numbers the autoscaler uses.
pub fn parse_metrics(text: &str) -> Result<PodSample, Error> {
    let lines = text.lines().map(|l| Ok(l.to_string()));
    // A fixed sample time: the parse must not read the clock.
    let scrape = Scrape::parse_at(lines, Default::default()).map_err(|e| Error::Scrape {
        url: String::new(),
        message: e.to_string(),
    })?;
    let value = |name: &str| -> Option<f64> {
        scrape
            .samples
            .iter()
            .filter(|s| s.metric == name)
            .map(|s| match s.value {
                Value::Gauge(v) | Value::Untyped(v) | Value::Counter(v) => v,
                _ => 0.0,
            })
            .reduce(|a, b| a + b)
    };
    let waiting = value(WAITING).ok_or(Error::Missing("ferrox_requests_waiting in /metrics"))?;
    Ok(PodSample {
        waiting,
        running: value(RUNNING).unwrap_or(0.0),
        kv_usage: value(KV_USAGE).unwrap_or(0.0).clamp(0.0, 1.0),
    })
}

/// Aggregates pod samples: queues and running summed, KV usage averaged.
pub fn aggregate(samples: &[PodSample]) -> Observation {
    let n = samples.len();
    let sum = |f: fn(&PodSample) -> f64| samples.iter().map(f).sum::<f64>();
    Observation {
        pods: n as u32,
        waiting: sum(|s| s.waiting),
        running: sum(|s| s.running),
        kv_usage: if n == 0 {
            0.0
        } else {
            sum(|s| s.kv_usage) / n as f64
        },
    }
}

/// Fetches and parses one `/metrics` URL.
pub async fn scrape(client: &reqwest::Client, url: &str) -> Result<PodSample, Error> {
    let fail = |e: String| Error::Scrape {
        url: url.to_string(),
        message: e,
    };
    let response = client
        .get(url)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .map_err(|e| fail(e.to_string()))?;
    let response = response
        .error_for_status()
        .map_err(|e| fail(e.to_string()))?;
    let text = response.text().await.map_err(|e| fail(e.to_string()))?;
    parse_metrics(&text).map_err(|e| fail(e.to_string()))
}

/// Scrapes every URL, skipping those that fail, and aggregates what answered.
pub async fn observe(client: &reqwest::Client, urls: &[String]) -> (Observation, Vec<Error>) {
    let results = futures::future::join_all(urls.iter().map(|u| scrape(client, u))).await;
    let mut samples = Vec::new();
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(s) => samples.push(s),
            Err(e) => errors.push(e),
        }
    }
    (aggregate(&samples), errors)
}

/// Scrape `urls` and decide: the autoscaler's step, drivable against any servers.
pub async fn scrape_and_decide(
    client: &reqwest::Client,
    urls: &[String],
    policy: &Policy,
    current: i32,
    history: &mut History,
    now: i64,
) -> (Decision, Observation, Vec<Error>) {
    let (obs, errors) = observe(client, urls).await;
    (decide(policy, current, &obs, history, now), obs, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPOSITION: &str = "\
# HELP ferrox_requests_waiting Requests waiting for admission.
# TYPE ferrox_requests_waiting gauge
ferrox_requests_waiting 7
# TYPE ferrox_requests_running gauge
ferrox_requests_running 3
# TYPE ferrox_kv_blocks_used gauge
ferrox_kv_blocks_used 120
# TYPE ferrox_kv_blocks_total gauge
ferrox_kv_blocks_total 200
# TYPE ferrox_kv_usage_ratio gauge
ferrox_kv_usage_ratio 0.6
# TYPE ferrox_prompt_tokens_total counter
ferrox_prompt_tokens_total 1234
";

    #[test]
    fn parses_the_servers_exposition() {
        let s = parse_metrics(EXPOSITION).unwrap();
        assert_eq!(
            s,
            PodSample {
                waiting: 7.0,
                running: 3.0,
                kv_usage: 0.6
            }
        );
    }

    #[test]
    fn a_server_without_the_queue_series_is_an_error() {
        assert!(parse_metrics("# TYPE x gauge\nx 1\n").is_err());
        assert!(parse_metrics("").is_err());
    }

    #[test]
    fn aggregate_sums_queues_and_averages_usage() {
        let a = PodSample {
            waiting: 2.0,
            running: 4.0,
            kv_usage: 0.2,
        };
        let b = PodSample {
            waiting: 6.0,
            running: 4.0,
            kv_usage: 0.6,
        };
        let o = aggregate(&[a, b]);
        assert_eq!((o.pods, o.waiting, o.running), (2, 8.0, 8.0));
        assert!((o.kv_usage - 0.4).abs() < 1e-9);
        assert_eq!(aggregate(&[]), Observation::default());
    }

    #[tokio::test]
    async fn unreachable_pods_are_reported_not_counted() {
        let client = reqwest::Client::new();
        // Port 9 (discard) on loopback: refused at once.
        let urls = vec!["http://127.0.0.1:9/metrics".to_string()];
        let (obs, errors) = observe(&client, &urls).await;
        assert_eq!(obs.pods, 0);
        assert_eq!(errors.len(), 1);
    }

    #[tokio::test]
    async fn scrape_and_decide_reads_real_http_endpoints() {
        // Two servers: 7 + 7 waiting at 2 replicas, target 4 per replica -> 4.
        let mut urls = Vec::new();
        for _ in 0..2 {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            urls.push(format!("http://{}/metrics", listener.local_addr().unwrap()));
            let app =
                axum::Router::new().route("/metrics", axum::routing::get(|| async { EXPOSITION }));
            tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        }
        let policy = Policy {
            min_replicas: 1,
            max_replicas: 8,
            target_queue_per_replica: 4.0,
            target_kv_usage: 0.8,
            scale_up_window: 0,
            scale_down_delay: 300,
        };
        let client = reqwest::Client::new();
        let mut history = History::default();
        let (decision, obs, errors) =
            scrape_and_decide(&client, &urls, &policy, 2, &mut history, 0).await;
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!((obs.pods, obs.waiting), (2, 14.0));
        assert_eq!(decision.desired, 4);
        assert!(
            decision.reason.starts_with("scale up 2 -> 4"),
            "{}",
            decision.reason
        );
    }
}
