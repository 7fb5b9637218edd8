//! The exposition: every series with its value, the plan, the vLLM copies.

use super::*;

fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn pool(reserved: usize, total: usize) -> PoolStats {
    PoolStats {
        total,
        reserved,
        held: reserved,
        pinned: 2,
        filled: 4,
        cached: 6,
        free: total - reserved - 6,
    }
}

/// The full-attention pool's kind (its size is in the stats).
fn kv() -> CacheKind {
    CacheKind::Full
}

#[test]
fn renders_every_series_with_its_value() {
    let m = Metrics::new().unwrap();
    m.set_gauges(3, 2, &[(kv(), pool(5, 20))]);
    m.add_prompt_tokens(7);
    m.add_generation_tokens(11);
    m.add_prefix_cache(40, 32);
    m.add_prefix_cache(8, 0);
    m.finished("length");
    m.rejected("queue_full");
    m.observe(Latency::TimeToFirstToken, Duration::from_millis(30));
    let t = m.render("smol\"m");
    let cases: &[(&str, f64)] = &[
        ("ferrox_requests_waiting", 3.0),
        ("ferrox_requests_running", 2.0),
        ("ferrox_kv_blocks_used", 5.0),
        ("ferrox_kv_blocks_total", 20.0),
        ("ferrox_kv_blocks_pinned", 2.0),
        ("ferrox_kv_blocks_filled", 4.0),
        ("ferrox_kv_blocks_cached", 6.0),
        ("ferrox_kv_blocks_free", 9.0),
        ("ferrox_kv_usage_ratio", 0.25),
        ("ferrox_prompt_tokens_total", 7.0),
        ("ferrox_generation_tokens_total", 11.0),
        ("ferrox_prefix_cache_queries_total", 48.0),
        ("ferrox_prefix_cache_hits_total", 32.0),
        ("ferrox_requests_finished_total{reason=\"length\"}", 1.0),
        ("ferrox_requests_finished_total{reason=\"abort\"}", 0.0),
        ("ferrox_requests_rejected_total{reason=\"queue_full\"}", 1.0),
        ("ferrox_requests_rejected_total{reason=\"draining\"}", 0.0),
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
        (
            "vllm:prefix_cache_queries_total{model_name=\"smol\\\"m\"}",
            48.0,
        ),
        (
            "vllm:prefix_cache_hits_total{model_name=\"smol\\\"m\"}",
            32.0,
        ),
    ];
    for (series, want) in cases {
        assert_eq!(value(&t, series), Some(*want), "{series}\n{t}");
    }
    assert!(
        t.contains("# TYPE ferrox_prefix_cache_hits_total counter"),
        "{t}"
    );
    assert!(
        t.contains("# TYPE vllm:prefix_cache_hits_total counter"),
        "{t}"
    );
    assert!(t.contains("# TYPE ferrox_time_to_first_token_seconds histogram"));
    // Rendering again does not add the counters up twice.
    let again = m.render("smol\"m");
    let hits = "vllm:prefix_cache_hits_total{model_name=\"smol\\\"m\"}";
    assert_eq!(value(&again, hits), Some(32.0));
}

#[test]
fn the_plan_is_absent_until_set_then_exported_once() {
    let m = Metrics::new().unwrap();
    let before = m.render("m");
    assert!(!before.contains("cache_config_info{"), "{before}");
    assert_eq!(value(&before, "ferrox_plan_max_seqs"), None);
    let mut plan = PlanInfo {
        block_size: 16,
        pools: vec![ferrox_core::Pool {
            kind: CacheKind::Full,
            blocks: 1024,
        }],
        kv_dtype: "f16".into(),
        memory_utilization: 0.9,
        prefix_caching: true,
        weight_bytes: 100_000_000,
        kv_block_bytes: 368_640,
        memory_bytes: 1 << 30,
        memory_source: "kv-cache-memory".into(),
        max_seqs: 16,
        max_model_len: 8192,
    };
    m.set_plan(&plan);
    let t = m.render("m");
    // The labels come sorted by name; values as vLLM prints them.
    let info = "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"f16\",\
                enable_prefix_caching=\"True\",gpu_memory_utilization=\"0.9\",\
                num_gpu_blocks=\"1024\",sliding_window=\"None\"}";
    assert_eq!(value(&t, info), Some(1.0), "{t}");
    let cases: &[(&str, f64)] = &[
        ("ferrox_plan_weight_bytes", 1e8),
        ("ferrox_plan_kv_block_bytes", 368_640.0),
        ("ferrox_plan_max_seqs", 16.0),
        ("ferrox_plan_max_model_len", 8192.0),
        (
            "ferrox_plan_memory_bytes{source=\"kv-cache-memory\"}",
            (1u64 << 30) as f64,
        ),
    ];
    for (series, want) in cases {
        assert_eq!(value(&t, series), Some(*want), "{series}\n{t}");
    }
    plan.prefix_caching = false;
    plan.memory_source = "kv-blocks".into();
    m.set_plan(&plan);
    let t = m.render("m");
    assert_eq!(t.matches("vllm:cache_config_info{").count(), 1, "{t}");
    assert!(t.contains("enable_prefix_caching=\"False\""), "{t}");
    assert_eq!(t.matches("ferrox_plan_memory_bytes{").count(), 1, "{t}");
}

#[test]
fn vllm_names_count_the_same_facts() {
    let m = Metrics::new().unwrap();
    // Before the model is named, no vLLM latency series counts anything.
    m.observe(Latency::TimeToFirstToken, Duration::from_millis(5));
    m.set_model_name("smol");
    m.add_prompt_tokens(7);
    m.add_generation_tokens(11);
    m.finished("stop");
    m.finished("stop");
    m.finished("abort");
    m.finished("error");
    m.observe(Latency::TimeToFirstToken, Duration::from_millis(30));
    m.observe(Latency::InterToken, Duration::from_millis(8));
    m.observe(Latency::InterToken, Duration::from_millis(9));
    m.observe(Latency::EndToEnd, Duration::from_secs(2));
    m.observe(Latency::Queue, Duration::from_millis(1));
    let t = m.render("smol");
    let label = "{model_name=\"smol\"}";
    let cases: Vec<(String, f64)> = vec![
        (format!("vllm:prompt_tokens_total{label}"), 7.0),
        (format!("vllm:generation_tokens_total{label}"), 11.0),
        (
            "vllm:request_success_total{finished_reason=\"stop\",model_name=\"smol\"}".into(),
            2.0,
        ),
        (
            "vllm:request_success_total{finished_reason=\"abort\",model_name=\"smol\"}".into(),
            1.0,
        ),
        (
            "vllm:request_success_total{finished_reason=\"length\",model_name=\"smol\"}".into(),
            0.0,
        ),
        (
            format!("vllm:time_to_first_token_seconds_count{label}"),
            1.0,
        ),
        (format!("vllm:time_to_first_token_seconds_sum{label}"), 0.03),
        (
            format!("vllm:inter_token_latency_seconds_count{label}"),
            2.0,
        ),
        (
            format!("vllm:time_per_output_token_seconds_count{label}"),
            2.0,
        ),
        (
            format!("vllm:e2e_request_latency_seconds_count{label}"),
            1.0,
        ),
        (format!("vllm:request_queue_time_seconds_count{label}"), 1.0),
        // Ferrox's own names count everything, named or not.
        ("ferrox_time_to_first_token_seconds_count".into(), 2.0),
    ];
    for (series, want) in cases {
        assert_eq!(value(&t, &series), Some(want), "{series}\n{t}");
    }
    assert!(
        !t.contains("finished_reason=\"error\""),
        "vLLM counts no error reason"
    );
}

#[test]
fn every_pool_is_reported_by_kind_beside_the_kv_pool() {
    let m = Metrics::new().unwrap();
    m.set_gauges(0, 1, &[(kv(), pool(5, 20))]);
    let t = m.render("m");
    assert!(
        !t.contains("ferrox_pool_blocks_capacity{pool=\"window"),
        "no window, no series:\n{t}"
    );
    assert_eq!(
        value(&t, "ferrox_pool_blocks_capacity{pool=\"full\"}"),
        Some(20.0)
    );
    let window = CacheKind::Window(1024);
    let w = PoolStats {
        total: 10,
        reserved: 8,
        held: 3,
        free: 2,
        ..PoolStats::default()
    };
    m.set_gauges(0, 1, &[(kv(), pool(5, 20)), (window, w)]);
    let t = m.render("m");
    let cases: &[(&str, f64)] = &[
        ("ferrox_kv_blocks_used", 5.0),
        ("ferrox_pool_blocks_used{pool=\"window:1024\"}", 8.0),
        ("ferrox_pool_blocks_capacity{pool=\"window:1024\"}", 10.0),
        ("ferrox_pool_blocks_held{pool=\"window:1024\"}", 3.0),
        ("ferrox_pool_usage_ratio{pool=\"window:1024\"}", 0.8),
        ("ferrox_pool_usage_ratio{pool=\"full\"}", 0.25),
        // Usage is the fuller pool's: what admission stops on, and what
        // an autoscaler must read.
        ("ferrox_kv_usage_ratio", 0.8),
        ("vllm:kv_cache_usage_perc{model_name=\"m\"}", 0.8),
    ];
    for (series, want) in cases {
        assert_eq!(value(&t, series), Some(*want), "{series}\n{t}");
    }
    // Every layer windowed: no KV pool, its gauges at zero.
    m.set_gauges(0, 1, &[(window, w)]);
    let t = m.render("m");
    assert_eq!(value(&t, "ferrox_kv_blocks_total"), Some(0.0));
    assert_eq!(value(&t, "ferrox_kv_usage_ratio"), Some(0.8));
    // A state pool: its slots by kind; they are not tokens, so the KV usage
    // ratio is still the fullest token pool's.
    let slots = PoolStats {
        total: 4,
        reserved: 4,
        held: 4,
        ..PoolStats::default()
    };
    m.set_gauges(0, 4, &[(window, w), (CacheKind::State, slots)]);
    let t = m.render("m");
    assert_eq!(
        value(&t, "ferrox_pool_blocks_used{pool=\"state\"}"),
        Some(4.0)
    );
    assert_eq!(value(&t, "ferrox_kv_usage_ratio"), Some(0.8));
    // The plan names its pools by kind, and vLLM's label the window.
    let pool = |kind, blocks| ferrox_core::Pool { kind, blocks };
    m.set_plan(&PlanInfo {
        pools: vec![pool(kv(), 64), pool(window, 97), pool(CacheKind::State, 8)],
        ..PlanInfo::default()
    });
    let t = m.render("m");
    for (series, want) in [
        ("ferrox_plan_pool_blocks{pool=\"full\"}", 64.0),
        ("ferrox_plan_pool_blocks{pool=\"window:1024\"}", 97.0),
        ("ferrox_plan_pool_blocks{pool=\"state\"}", 8.0),
    ] {
        assert_eq!(value(&t, series), Some(want), "{t}");
    }
    assert!(t.contains("sliding_window=\"1024\""), "{t}");
    assert!(t.contains("num_gpu_blocks=\"64\""), "{t}");
}
