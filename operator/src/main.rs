//! The ferrox-operator binary: `run`, `crdgen` and `render`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use ferrox_operator::desired::DesiredConfig;
use ferrox_operator::lease::LeaderElection;
use ferrox_operator::metrics::Metrics;
use ferrox_operator::reconcile::Context;
use ferrox_operator::router::poll::RouterPods;
use ferrox_operator::router::{PendingBoard, RouterService};
use ferrox_operator::{autoscaling, crd, node_watch, reconcile, render, router, server};

#[derive(Parser)]
#[command(
    name = "ferrox-operator",
    version,
    about = "Kubernetes operator for ModelDeployments"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller and the built-in autoscaler.
    Run(RunArgs),
    /// Print the ModelDeployment CRD as YAML.
    Crdgen,
    /// Print the plan and the objects a ModelDeployment would get, as YAML.
    Render(RenderArgs),
}

#[derive(Args)]
struct Shared {
    /// ferrox-server image used when a spec names none.
    #[arg(
        long,
        env = "FERROX_SERVER_IMAGE",
        default_value = "ferrox-server:0.1.0"
    )]
    default_image: String,
    /// ferrox-server image (a CUDA build) used when a spec with accelerators names none.
    #[arg(
        long,
        env = "FERROX_SERVER_CUDA_IMAGE",
        default_value = "ferrox-server:0.1.0-cuda"
    )]
    cuda_image: String,
    /// Prometheus address for KEDA triggers.
    #[arg(
        long,
        env = "FERROX_PROMETHEUS_ADDRESS",
        default_value = "http://prometheus.monitoring.svc:9090"
    )]
    prometheus_address: String,
    /// ferrox-router's Service, NAMESPACE/NAME: `status.url` points at it,
    /// KEDA triggers on its waiting requests, and `run` long-polls its pods
    /// to wake models from zero.
    #[arg(long, env = "FERROX_ROUTER_SERVICE")]
    router_service: Option<String>,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    shared: Shared,
    /// Address of `/metrics` and `/healthz`.
    #[arg(long, env = "FERROX_OPERATOR_LISTEN", default_value = "0.0.0.0:8080")]
    listen: SocketAddr,
    /// Seconds between scrapes of the servers (observed plan, built-in autoscaler).
    #[arg(long, env = "FERROX_SCRAPE_INTERVAL", default_value_t = 15)]
    scrape_interval: u64,
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "ferrox-system")]
    lease_namespace: String,
    /// Name of the Lease.
    #[arg(long, env = "FERROX_LEASE_NAME", default_value = "ferrox-operator")]
    lease_name: String,
    /// This replica's identity.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Skip leader election (a single replica, or a test).
    #[arg(long, env = "FERROX_NO_LEADER_ELECTION")]
    no_leader_election: bool,
    /// A ferrox-router pod to long-poll, as a base URL (repeatable), instead
    /// of the pods of --router-service.
    #[arg(long = "router-endpoint", value_name = "URL")]
    router_endpoints: Vec<String>,
}

#[derive(Args)]
struct RenderArgs {
    #[command(flatten)]
    shared: Shared,
    /// The ModelDeployment manifest.
    #[arg(short = 'f', long)]
    file: PathBuf,
    /// `ferrox-server inspect --json` output, or a model file to run it on.
    #[arg(long)]
    geometry_from: Option<PathBuf>,
    /// The ferrox-server binary used to inspect a model file.
    #[arg(long, env = "FERROX_SERVER_BIN", default_value = "ferrox-server")]
    server_bin: PathBuf,
}

impl Shared {
    fn config(&self) -> anyhow::Result<DesiredConfig> {
        Ok(DesiredConfig {
            default_image: self.default_image.clone(),
            cuda_image: self.cuda_image.clone(),
            prometheus_address: self.prometheus_address.clone(),
            router: self
                .router_service
                .as_deref()
                .map(RouterService::parse)
                .transpose()?,
        })
    }
}

impl RunArgs {
    /// Where the router pods are, if the operator is to wake models from zero.
    fn router_pods(&self, config: &DesiredConfig) -> Option<RouterPods> {
        if !self.router_endpoints.is_empty() {
            let urls = self.router_endpoints.iter();
            return Some(RouterPods::Fixed(
                urls.map(|u| u.trim_end_matches('/').to_string()).collect(),
            ));
        }
        config.router.clone().map(RouterPods::Service)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Crdgen => print!("{}", crd::crd_yaml()),
        Command::Render(args) => render_cmd(&args)?,
        Command::Run(args) => run(args).await?,
    }
    Ok(())
}

fn render_cmd(args: &RenderArgs) -> anyhow::Result<()> {
    let manifest = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let geometry = args
        .geometry_from
        .as_ref()
        .map(|p| geometry_json(p, &args.server_bin))
        .transpose()?;
    let md = render::read_manifest(&manifest)?;
    let rendered = render::render(&md, geometry.as_deref(), &args.shared.config()?)?;
    print!("{}", render::to_yaml(&md, &rendered)?);
    Ok(())
}

/// The inspect JSON in `path`, or what `ferrox-server inspect` says of the model there.
fn geometry_json(path: &Path, server: &Path) -> anyhow::Result<String> {
    if path.is_file() {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        if bytes.trim_ascii_start().starts_with(b"{") {
            return Ok(String::from_utf8(bytes)?);
        }
    }
    let out = std::process::Command::new(server)
        .args(["inspect", "--json", "--model"])
        .arg(path)
        .output()
        .with_context(|| format!("running {} inspect", server.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "{} inspect failed: {}",
        server.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let client = kube::Client::try_default()
        .await
        .context("kubernetes client")?;
    let metrics = Arc::new(Metrics::default());
    let http = tokio::spawn(server::serve(args.listen, metrics.clone()));
    let identity = args
        .identity
        .clone()
        .unwrap_or_else(|| format!("ferrox-operator-{}", std::process::id()));
    let election = LeaderElection::new(
        client.clone(),
        &args.lease_namespace,
        &args.lease_name,
        &identity,
        15,
    );
    if !args.no_leader_election {
        tracing::info!(%identity, "waiting for the lease");
        election.acquire().await;
    }
    metrics.set_leader(true);
    tracing::info!(%identity, "leading");
    let (nodes, node_changes) = node_watch::watch(client.clone()).await;
    let config = args.shared.config()?;
    let router_pods = args.router_pods(&config);
    let mut ctx =
        Context::new(client.clone(), config, metrics.clone(), Some(identity)).with_nodes(nodes);
    let mut router_tasks = Vec::new();
    if let Some(pods) = router_pods {
        tracing::info!(?pods, "long-polling ferrox-router's waiting line");
        let board = PendingBoard::default();
        ctx = ctx.with_pending(board.clone());
        router_tasks.push(tokio::spawn(router::poll::run(client, pods, board)));
    }
    let ctx = Arc::new(ctx);
    if let Some(board) = ctx.pending.clone() {
        router_tasks.push(tokio::spawn(autoscaling::waker::run(ctx.clone(), board)));
    }
    let scaler = tokio::spawn(autoscaling::run::run(
        ctx.clone(),
        Duration::from_secs(args.scrape_interval.max(1)),
    ));
    let lost = async {
        if args.no_leader_election {
            std::future::pending::<()>().await;
        }
        election.hold().await;
    };
    tokio::select! {
        () = reconcile::run(ctx, node_changes) => tracing::info!("controller stopped"),
        () = lost => anyhow::bail!("lost the lease; exiting so that a new leader acts alone"),
        r = http => r?.context("metrics server")?,
    }
    scaler.abort();
    router_tasks.iter().for_each(|t| t.abort());
    Ok(())
}
