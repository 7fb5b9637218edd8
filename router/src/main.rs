//! ferrox-router: the flags, then the endpoint sources, the pollers and the
//! proxy. See the library for the rules.

mod kube_source;
mod poller;
mod prompters;
mod proxy;
mod shared;

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Parser;
use ferrox_core::ApiKeys;
use ferrox_plan::TierWeights;
use ferrox_router::{Bounds, RouterError};

use crate::shared::{Settings, Shared};

/// Routes OpenAI requests to the ferrox-server replica holding the prompt's
/// KV blocks, bounded by load; holds them while a model has no ready replica.
#[derive(Debug, Parser)]
#[command(name = "ferrox-router", version)]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "FERROX_ROUTER_LISTEN", default_value = "0.0.0.0:8000")]
    listen: std::net::SocketAddr,
    /// A static endpoint, MODEL=URL (repeatable), e.g. smol=http://10.0.0.1:8000.
    #[arg(long = "endpoint", value_name = "MODEL=URL")]
    endpoints: Vec<String>,
    /// A LoRA adapter a static model serves, MODEL=ADAPTER (repeatable):
    /// known before any endpoint lists it, so its requests wait for one.
    #[arg(long = "adapter", value_name = "MODEL=ADAPTER")]
    adapters: Vec<String>,
    /// Watch ModelDeployments and their EndpointSlices.
    #[arg(long, env = "FERROX_ROUTER_KUBERNETES")]
    kubernetes: bool,
    /// Watch this namespace only (default: all).
    #[arg(long, env = "FERROX_ROUTER_NAMESPACE")]
    namespace: Option<String>,
    /// A key clients must send as `Authorization: Bearer KEY` (repeatable;
    /// FERROX_API_KEY takes a comma-separated list). None: no auth.
    #[arg(
        long = "api-key",
        env = "FERROX_API_KEY",
        value_delimiter = ',',
        hide_env_values = true
    )]
    api_keys: Vec<String>,
    /// The key the router's own reads of the servers carry, when they have keys.
    #[arg(long, env = "FERROX_UPSTREAM_API_KEY", hide_env_values = true)]
    upstream_api_key: Option<String>,
    /// Largest request body in bytes (the server's default: 4 MiB).
    #[arg(long, env = "FERROX_MAX_BODY", default_value_t = 4 << 20)]
    max_body: usize,
    /// Most requests waiting per model for a ready replica.
    #[arg(long, default_value_t = 256)]
    max_pending: usize,
    /// Seconds a request waits for a ready replica before a 503.
    #[arg(long, default_value_t = 300.0)]
    wait_timeout: f64,
    /// Load bound: most requests in a replica's own waiting line.
    #[arg(long, default_value_t = Bounds::default().max_waiting)]
    max_waiting: usize,
    /// Load bound: most KV usage (0..=1).
    #[arg(long, default_value_t = Bounds::default().max_kv_usage)]
    max_kv_usage: f64,
    /// Load bound: most requests in flight from this router to one replica.
    #[arg(long, default_value_t = Bounds::default().max_in_flight)]
    max_in_flight: usize,
    /// The hash fallback's bound: a replica may carry this times the mean load.
    #[arg(long, default_value_t = ferrox_router::chwbl::DEFAULT_LOAD_FACTOR)]
    load_factor: f64,
    /// Milliseconds between reads of each replica's KV events.
    #[arg(long, default_value_t = 100)]
    poll_interval_ms: u64,
    /// Seconds a routed prompt counts as held by its replica before the
    /// replica reports it.
    #[arg(long, default_value_t = 10.0)]
    expect_ttl: f64,
    /// What a prompt block held in each KV tier counts for when replicas
    /// are ranked by the run of the prompt they hold: TIER=WEIGHT, comma
    /// separated, each in [0, 1], not rising down the tiers (any subset;
    /// the rest default).
    #[arg(long, env = "FERROX_ROUTER_TIER_WEIGHTS", default_value = "device=1,host=0.8,disk=0.5", value_parser = tier_weights)]
    tier_weights: TierWeights,
}

/// `--tier-weights`, read by the contract's one reader.
fn tier_weights(text: &str) -> Result<TierWeights, String> {
    TierWeights::parse(text)
}

/// `MODEL=URL` flags as the table's wanted set.
fn static_endpoints(
    flags: &[String],
) -> Result<BTreeMap<String, Vec<(String, bool)>>, RouterError> {
    let mut out: BTreeMap<String, Vec<(String, bool)>> = BTreeMap::new();
    for flag in flags {
        let bad = || RouterError::BadEndpoint(flag.clone());
        let (model, url) = flag.split_once('=').ok_or_else(bad)?;
        let url = url.trim_end_matches('/');
        if model.is_empty() || !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(bad());
        }
        out.entry(model.to_string())
            .or_default()
            .push((url.to_string(), true));
    }
    Ok(out)
}

/// `MODEL=ADAPTER` flags as adapter -> model.
fn static_adapters(flags: &[String]) -> Result<BTreeMap<String, String>, RouterError> {
    let mut out = BTreeMap::new();
    for flag in flags {
        match flag.split_once('=') {
            Some((m, a)) if !m.is_empty() && !a.is_empty() => {
                out.insert(a.to_string(), m.to_string());
            }
            _ => {
                return Err(RouterError::BadRequest(format!(
                    "--adapter {flag}: not MODEL=ADAPTER"
                )));
            }
        }
    }
    Ok(out)
}

fn secs(v: f64, flag: &str) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(v)
        .map_err(|_| anyhow::anyhow!("--{flag} {v}: not a duration in seconds"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let wanted = static_endpoints(&args.endpoints)?;
    if wanted.is_empty() && !args.kubernetes {
        anyhow::bail!("no endpoints: give --endpoint MODEL=URL or --kubernetes");
    }
    let settings = Settings {
        bounds: Bounds {
            max_waiting: args.max_waiting,
            max_kv_usage: args.max_kv_usage,
            max_in_flight: args.max_in_flight,
        },
        load_factor: args.load_factor,
        expect_ttl: secs(args.expect_ttl, "expect-ttl")?,
        wait_timeout: secs(args.wait_timeout, "wait-timeout")?,
        max_body: args.max_body,
        poll_interval: Duration::from_millis(args.poll_interval_ms.max(1)),
        tier_weights: args.tier_weights,
    };
    poller::set_upstream_key(args.upstream_api_key.clone());
    let s = Shared::new(settings, ApiKeys::new(&args.api_keys), args.max_pending)?;
    if args.kubernetes {
        let (s, ns) = (s.clone(), args.namespace.clone());
        tokio::spawn(async move {
            if let Err(e) = kube_source::run(s, ns).await {
                tracing::error!(error = %e, "the Kubernetes watch ended");
            }
        });
    } else {
        s.table().declare_adapters(static_adapters(&args.adapters)?);
        poller::sync(&s, &wanted);
    }
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    tracing::info!(listen = %args.listen, "ferrox-router listening");
    let app = proxy::app(s.clone());
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown().await;
            // Held long-polls would hold the shutdown for their whole wait.
            s.release_long_polls();
        })
        .await?;
    Ok(())
}

/// SIGTERM (Kubernetes) or Ctrl-C.
async fn shutdown() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(t) => t,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tier_weights_default_to_the_contract_s_and_a_bad_value_says_why() {
        let args = Args::try_parse_from(["ferrox-router"]).unwrap();
        assert_eq!(args.tier_weights, TierWeights::default());
        let args =
            Args::try_parse_from(["ferrox-router", "--tier-weights", "host=0.6,disk=0.1"]).unwrap();
        assert_eq!((args.tier_weights.host, args.tier_weights.disk), (0.6, 0.1));
        for (bad, why) in [
            ("disk=0.9", "must not rise down the tiers"),
            ("host=2", "not a weight in [0, 1]"),
            ("ssd=0.1", "not a KV tier"),
        ] {
            let e = Args::try_parse_from(["ferrox-router", "--tier-weights", bad]).unwrap_err();
            let text = e.to_string();
            assert!(
                text.contains("--tier-weights") && text.contains(why),
                "{text}"
            );
        }
    }

    #[test]
    fn endpoint_flags() {
        let w = static_endpoints(&[
            "smol=http://127.0.0.1:8001/".into(),
            "smol=http://127.0.0.1:8002".into(),
            "big=https://b:1".into(),
        ])
        .unwrap();
        assert_eq!(w["smol"].len(), 2);
        assert_eq!(w["smol"][0].0, "http://127.0.0.1:8001");
        for bad in ["nourl", "=http://x", "m=ftp://x", "m="] {
            let e = static_endpoints(&[bad.into()]).unwrap_err();
            assert_eq!(e, RouterError::BadEndpoint(bad.into()));
        }
    }
}
