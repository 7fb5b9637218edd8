//! Reading ferrox-server's `/metrics`: the parse is pure, the fetch is a thin shell.

use std::time::Duration;

use prometheus_parse::{Sample, Scrape, Value};

use super::decision::{Decision, History, Policy, decide};
use super::observation::Observation;
use crate::Error;

use ferrox_plan::{CacheKind, KvTier};

// The series names are the contract's, shared with the server's exporter.
pub use ferrox_plan::contract::metric::{
    CACHE_CONFIG_INFO, FINISHED, KV_USAGE, LORA_ADAPTER_LOADED, PLAN_KV_BLOCK_BYTES,
    PLAN_MAX_MODEL_LEN, PLAN_MAX_SEQS, PLAN_MEMORY_BYTES, PLAN_POOL_BLOCKS, PLAN_WEIGHT_BYTES,
    POOL_LABEL, RUNNING, SPEC_ACCEPTED_TOKENS, SPEC_DRAFT_TOKENS, TIER_BLOCKS,
    TIER_CAPACITY_BLOCKS, TIER_HITS, TIER_LABEL, TIER_MISSES, WAITING,
};

/// One pod's numbers.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodSample {
    /// Waiting requests.
    pub waiting: f64,
    /// Running requests.
    pub running: f64,
    /// KV usage ratio in [0, 1].
    pub kv_usage: f64,
    /// Requests finished, all reasons (a counter).
    pub finished: f64,
    /// The plan it runs with, when it exports `vllm:cache_config_info`.
    pub plan: Option<ServerPlan>,
    /// The LoRA adapters it serves (`ferrox_lora_adapter_loaded`'s labels).
    pub adapters: Vec<String>,
    /// Its lower KV tiers' numbers, in tier order (empty without any).
    pub tiers: Vec<TierSample>,
}

/// One lower KV tier of one server (the `ferrox_kv_tier_*` series).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierSample {
    /// `host` or `disk`.
    pub tier: KvTier,
    /// Blocks it holds.
    pub blocks: u64,
    /// Blocks it can hold.
    pub capacity_blocks: u64,
    /// Lookups found whole (a counter).
    pub hits: u64,
    /// Lookups not found or refused (a counter).
    pub misses: u64,
}

/// The plan a server reports it runs with.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServerPlan {
    /// `num_gpu_blocks`.
    pub kv_blocks: u64,
    /// `block_size`.
    pub block_size: u64,
    /// `cache_dtype`.
    pub kv_dtype: String,
    /// `ferrox_plan_max_seqs`.
    pub max_seqs: Option<u64>,
    /// `ferrox_plan_weight_bytes`.
    pub weight_bytes: Option<u64>,
    /// `ferrox_plan_kv_block_bytes`.
    pub kv_block_bytes: Option<u64>,
    /// `ferrox_plan_max_model_len`.
    pub max_model_len: Option<u64>,
    /// `ferrox_plan_memory_bytes`.
    pub memory_bytes: Option<u64>,
    /// Its `source` label.
    pub memory_source: Option<String>,
    /// `ferrox_plan_pool_blocks`: every pool's blocks, by kind, in kind
    /// order (empty from a server that does not report them).
    pub pools: Vec<(CacheKind, u64)>,
    /// Draft tokens verified and, of them, accepted since it started
    /// (`vllm:spec_decode_num_draft_tokens_total` and
    /// `..._accepted_tokens_total`), when it speculates.
    pub spec_tokens: Option<(u64, u64)>,
}

/// What prometheus-parse reads for a name with colons (its names are `\w+`).
const COLON: &str = "__colon__";

/// `line` with the colons of its metric name spelled [`COLON`] (recording-rule
/// style names such as `vllm:cache_config_info` are valid Prometheus).
fn colonless(line: &str) -> String {
    let (prefix, rest) = ["# HELP ", "# TYPE "]
        .iter()
        .find_map(|p| line.strip_prefix(p).map(|r| (*p, r)))
        .unwrap_or(("", line));
    let end = rest.find(['{', ' ', '\t']).unwrap_or(rest.len());
    let (name, tail) = rest.split_at(end);
    format!("{prefix}{}{tail}", name.replace(':', COLON))
}

/// A metric name as it reads after [`colonless`].
fn parsed_name(name: &str) -> String {
    name.replace(':', COLON)
}

fn number(s: &Sample) -> f64 {
    match s.value {
        Value::Gauge(v) | Value::Untyped(v) | Value::Counter(v) => v,
        _ => 0.0,
    }
}

/// A gauge as a whole non-negative count (NaN, negatives and fractions refused).
fn whole(v: f64) -> Option<u64> {
    (v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < 1.8e19).then_some(v as u64)
}

/// The server's plan from its exposition, if it exports one.
pub fn server_plan(scrape: &Scrape) -> Option<ServerPlan> {
    let info_name = parsed_name(CACHE_CONFIG_INFO);
    let info = scrape.samples.iter().find(|s| s.metric == info_name)?;
    let label = |k: &str| info.labels.get(k).map(str::to_string);
    let gauge = |name: &str| {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == name)
            .and_then(|s| whole(number(s)))
    };
    let memory = scrape
        .samples
        .iter()
        .find(|s| s.metric == PLAN_MEMORY_BYTES);
    let mut pools: Vec<(CacheKind, u64)> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == PLAN_POOL_BLOCKS)
        .filter_map(|s| {
            let kind = s.labels.get(POOL_LABEL)?.parse().ok()?;
            Some((kind, whole(number(s))?))
        })
        .collect();
    pools.sort_unstable();
    let counter = |name: &str| gauge(&parsed_name(name));
    Some(ServerPlan {
        spec_tokens: counter(SPEC_DRAFT_TOKENS).zip(counter(SPEC_ACCEPTED_TOKENS)),
        pools,
        kv_blocks: label("num_gpu_blocks")?.parse().ok()?,
        block_size: label("block_size")?.parse().ok()?,
        kv_dtype: label("cache_dtype")?,
        max_seqs: gauge(PLAN_MAX_SEQS),
        weight_bytes: gauge(PLAN_WEIGHT_BYTES),
        kv_block_bytes: gauge(PLAN_KV_BLOCK_BYTES),
        max_model_len: gauge(PLAN_MAX_MODEL_LEN),
        memory_bytes: memory.and_then(|s| whole(number(s))),
        memory_source: memory.and_then(|s| s.labels.get("source").map(str::to_string)),
    })
}

/// The lower tiers a server reports: each `tier` label seen on a
/// `ferrox_kv_tier_*` series, its series read (0 where absent).
pub fn tier_samples(scrape: &Scrape) -> Vec<TierSample> {
    let of = |s: &Sample| s.labels.get(TIER_LABEL)?.parse::<KvTier>().ok();
    let names = [TIER_BLOCKS, TIER_CAPACITY_BLOCKS, TIER_HITS, TIER_MISSES];
    let mut tiers: Vec<KvTier> = (scrape.samples.iter())
        .filter(|s| names.contains(&s.metric.as_str()))
        .filter_map(of)
        .collect();
    tiers.sort_unstable();
    tiers.dedup();
    let read = |tier: KvTier, name: &str| {
        let found = scrape
            .samples
            .iter()
            .find(|s| s.metric == name && of(s) == Some(tier));
        found.and_then(|s| whole(number(s))).unwrap_or(0)
    };
    (tiers.into_iter())
        .map(|tier| TierSample {
            tier,
            blocks: read(tier, TIER_BLOCKS),
            capacity_blocks: read(tier, TIER_CAPACITY_BLOCKS),
            hits: read(tier, TIER_HITS),
            misses: read(tier, TIER_MISSES),
        })
        .collect()
}

/// Parses one Prometheus text exposition into the numbers the autoscaler uses.
pub fn parse_metrics(text: &str) -> Result<PodSample, Error> {
    let lines = text.lines().map(|l| Ok(colonless(l)));
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
            .map(number)
            .reduce(|a, b| a + b)
    };
    let waiting = value(WAITING).ok_or(Error::Missing("ferrox_requests_waiting in /metrics"))?;
    Ok(PodSample {
        waiting,
        running: value(RUNNING).unwrap_or(0.0),
        kv_usage: value(KV_USAGE).unwrap_or(0.0).clamp(0.0, 1.0),
        finished: value(FINISHED).unwrap_or(0.0),
        plan: server_plan(&scrape),
        adapters: (scrape.samples.iter())
            .filter(|s| s.metric == LORA_ADAPTER_LOADED)
            .filter_map(|s| s.labels.get("adapter").map(str::to_string))
            .collect(),
        tiers: tier_samples(&scrape),
    })
}

/// Aggregates pod samples: queues, running and finished summed, KV usage
/// averaged (the router's pending count is the caller's to add).
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
        finished: sum(|s| s.finished),
        pending: 0.0,
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

/// Scrapes every URL, and returns what answered and what failed.
pub async fn scrape_all(client: &reqwest::Client, urls: &[String]) -> (Vec<PodSample>, Vec<Error>) {
    let results = futures::future::join_all(urls.iter().map(|u| scrape(client, u))).await;
    let mut samples = Vec::new();
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(s) => samples.push(s),
            Err(e) => errors.push(e),
        }
    }
    (samples, errors)
}

/// Scrapes every URL, skipping those that fail, and aggregates what answered.
pub async fn observe(client: &reqwest::Client, urls: &[String]) -> (Observation, Vec<Error>) {
    let (samples, errors) = scrape_all(client, urls).await;
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
# TYPE ferrox_requests_finished_total counter
ferrox_requests_finished_total{reason=\"stop\"} 10
ferrox_requests_finished_total{reason=\"length\"} 2
";

    /// The plan gauges the server exports (the contract with its metrics).
    const PLAN_EXPOSITION: &str = "\
# TYPE ferrox_requests_waiting gauge
ferrox_requests_waiting 0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size=\"16\",cache_dtype=\"f16\",num_gpu_blocks=\"1024\",gpu_memory_utilization=\"0.9\",enable_prefix_caching=\"True\"} 1
# TYPE ferrox_plan_weight_bytes gauge
ferrox_plan_weight_bytes 98362432
# TYPE ferrox_plan_kv_block_bytes gauge
ferrox_plan_kv_block_bytes 368640
# TYPE ferrox_plan_max_seqs gauge
ferrox_plan_max_seqs 8
# TYPE ferrox_plan_max_model_len gauge
ferrox_plan_max_model_len 8192
# TYPE ferrox_plan_memory_bytes gauge
ferrox_plan_memory_bytes{source=\"cgroup-v2\"} 2147483648
";

    #[test]
    fn reads_the_plan_the_server_runs_with() {
        let s = parse_metrics(PLAN_EXPOSITION).unwrap();
        assert_eq!(
            s.plan,
            Some(ServerPlan {
                kv_blocks: 1024,
                block_size: 16,
                kv_dtype: "f16".into(),
                max_seqs: Some(8),
                weight_bytes: Some(98_362_432),
                kv_block_bytes: Some(368_640),
                max_model_len: Some(8192),
                memory_bytes: Some(2_147_483_648),
                memory_source: Some("cgroup-v2".into()),
                pools: Vec::new(),
                spec_tokens: None,
            })
        );
        // A speculating server's draft tokens, verified and accepted.
        let spec = format!(
            "{PLAN_EXPOSITION}# TYPE vllm:spec_decode_num_draft_tokens_total counter\n\
             vllm:spec_decode_num_draft_tokens_total{{model_name=\"m\"}} 400\n\
             # TYPE vllm:spec_decode_num_accepted_tokens_total counter\n\
             vllm:spec_decode_num_accepted_tokens_total{{model_name=\"m\"}} 250\n"
        );
        let plan = parse_metrics(&spec).unwrap().plan.unwrap();
        assert_eq!(plan.spec_tokens, Some((400, 250)));
        // A server names each pool by kind; they are read in kind order.
        let pooled = format!(
            "{PLAN_EXPOSITION}# TYPE ferrox_plan_pool_blocks gauge\n\
             ferrox_plan_pool_blocks{{pool=\"state\"}} 16\n\
             ferrox_plan_pool_blocks{{pool=\"window:4096\"}} 12\n\
             ferrox_plan_pool_blocks{{pool=\"window:1024\"}} 5719\n\
             ferrox_plan_pool_blocks{{pool=\"full\"}} 1024\n\
             ferrox_plan_pool_blocks{{pool=\"latent\"}} 7\n"
        );
        let plan = parse_metrics(&pooled).unwrap().plan.unwrap();
        let want = [
            (CacheKind::Full, 1024),
            (CacheKind::Window(1024), 5719),
            (CacheKind::Window(4096), 12),
            (CacheKind::State, 16),
        ];
        assert_eq!(plan.pools, want, "a kind it does not know is left out");
        // A server without the info gauge reports no plan; a bad label is no plan.
        assert_eq!(parse_metrics(EXPOSITION).unwrap().plan, None);
        let bad = PLAN_EXPOSITION.replace("num_gpu_blocks=\"1024\"", "num_gpu_blocks=\"-1\"");
        assert_eq!(parse_metrics(&bad).unwrap().plan, None);
        assert_eq!(whole(f64::NAN), None);
        assert_eq!(whole(-1.0), None);
        assert_eq!(whole(2.5), None);
    }

    #[test]
    fn parses_the_servers_exposition() {
        let s = parse_metrics(EXPOSITION).unwrap();
        assert_eq!(
            s,
            PodSample {
                waiting: 7.0,
                running: 3.0,
                kv_usage: 0.6,
                finished: 12.0,
                plan: None,
                adapters: Vec::new(),
                tiers: Vec::new(),
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
            finished: 1.0,
            plan: None,
            adapters: Vec::new(),
            tiers: Vec::new(),
        };
        let b = PodSample {
            waiting: 6.0,
            running: 4.0,
            kv_usage: 0.6,
            finished: 2.0,
            plan: None,
            adapters: Vec::new(),
            tiers: Vec::new(),
        };
        let o = aggregate(&[a, b]);
        assert_eq!(
            (o.pods, o.waiting, o.running, o.finished),
            (2, 8.0, 8.0, 3.0)
        );
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
            scale_to_zero_after: 600,
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
