//! The built-in autoscaler's scrape-and-decide step against two real
//! ferrox-server processes on loopback, loaded by ferrox-bench: it asks for
//! more replicas under load, and fewer once the load stops and the delay
//! has passed.
//!
//! Needs the server and bench binaries (`cargo build --workspace --bins`)
//! and the default model; skipped when they are absent unless
//! `FERROX_REQUIRE_MODEL=1` (as `scripts/test` sets).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferrox_operator::autoscaling::decision::{History, Policy};
use ferrox_operator::autoscaling::scrape::scrape_and_decide;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn binary(env: &str, name: &str) -> PathBuf {
    std::env::var_os(env).map(PathBuf::from).unwrap_or_else(|| {
        let target =
            std::env::var_os("CARGO_TARGET_DIR").map_or(root().join("target"), PathBuf::from);
        target.join("debug").join(name)
    })
}

/// Kills the child on drop, so a failed assertion leaves no server behind.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn start_server(bin: &Path, model: &Path) -> (Proc, String) {
    let port = free_port();
    let child = Command::new(bin)
        .args([
            "serve",
            "--host",
            "127.0.0.1",
            "--served-model-name",
            "smol",
            "--threads",
            "1",
        ])
        .args([
            "--max-seqs",
            "2",
            "--kv-blocks",
            "256",
            "--max-model-len",
            "512",
        ])
        .arg("--port")
        .arg(port.to_string())
        .arg("--model")
        .arg(model)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start ferrox-server");
    let proc = Proc(child);
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let ready = reqwest::get(format!("{url}/ready")).await;
        if ready.is_ok_and(|r| r.status().is_success()) {
            return (proc, url);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("ferrox-server on {url} never became ready");
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scales_up_under_load_and_down_after_the_delay() {
    let (server, bench) = (
        binary("FERROX_SERVER_BIN", "ferrox-server"),
        binary("FERROX_BENCH_BIN", "ferrox-bench"),
    );
    let model = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let present = server.exists() && bench.exists() && model.exists();
    if !present {
        assert!(
            std::env::var("FERROX_REQUIRE_MODEL").as_deref() != Ok("1"),
            "binaries or model missing: {server:?} {bench:?} {model:?}"
        );
        eprintln!("skipping: build the binaries and run scripts/fetch-model first");
        return;
    }
    let (_a, url_a) = start_server(&server, &model).await;
    let (_b, url_b) = start_server(&server, &model).await;
    let metrics = vec![format!("{url_a}/metrics"), format!("{url_b}/metrics")];
    let policy = Policy {
        min_replicas: 1,
        max_replicas: 6,
        target_queue_per_replica: 1.0,
        target_kv_usage: 0.9,
        scale_up_window: 1,
        scale_down_delay: 3,
        scale_to_zero_after: 600,
    };
    let client = reqwest::Client::new();
    let mut history = History::default();
    let current = 2;

    // Load: 10 concurrent streams on each server, each server runs 2 at a time.
    let load = |url: &str| {
        Command::new(&bench)
            .args([
                "-c",
                "10",
                "-n",
                "20",
                "--prompt-len",
                "16",
                "--output-len",
                "48",
                "--model",
                "smol",
            ])
            .arg("--url")
            .arg(url)
            .stdout(Stdio::null())
            .spawn()
            .map(Proc)
            .expect("start ferrox-bench")
    };
    let loads = [load(&url_a), load(&url_b)];
    let mut scaled_up = None;
    let deadline = Instant::now() + Duration::from_secs(90);
    while scaled_up.is_none() && Instant::now() < deadline {
        let (decision, obs, errors) =
            scrape_and_decide(&client, &metrics, &policy, current, &mut history, now()).await;
        assert!(errors.is_empty(), "scrape errors: {errors:?}");
        if decision.desired > current {
            scaled_up = Some((decision, obs));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (up, obs) = scaled_up.expect("the autoscaler never asked for more replicas under load");
    assert!(obs.waiting > 0.0, "scaled up without a queue: {obs:?}");
    assert_eq!(obs.pods, 2);
    drop(loads); // the load stops

    // Idle: once the queues are empty and the delay has passed, fewer replicas.
    let current = up.desired;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut scaled_down = None;
    while scaled_down.is_none() && Instant::now() < deadline {
        let (decision, obs, _) =
            scrape_and_decide(&client, &metrics, &policy, current, &mut history, now()).await;
        if decision.desired < current {
            assert_eq!(
                obs.waiting, 0.0,
                "scaled down while requests queue: {obs:?}"
            );
            scaled_down = Some(decision);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let down = scaled_down.expect("the autoscaler never scaled down after the load stopped");
    assert!(down.desired >= policy.min_replicas);
}
