//! `ferrox-server serve`: bind, load the model, run the worker, serve, and on
//! SIGTERM drain: readiness off at once, new work refused, in-flight work
//! given `drain_timeout`, then exit 0.

use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::net::TcpListener;

use crate::load::config::{HttpConfig, ServeConfig};
use crate::serve::app::router;
use crate::serve::edge::EdgeConfig;
use crate::serve::state::{AppState, Loaded};

/// Runs the server until SIGTERM or SIGINT, then drains.
pub fn run(config: ServeConfig) -> anyhow::Result<()> {
    if let Some(n) = config.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .context("sizing the compute thread pool")?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(serve(config))
}

async fn serve(config: ServeConfig) -> anyhow::Result<()> {
    let state = AppState::new(
        config.served_model_name.clone(),
        config.max_body,
        config.default_max_tokens,
        &config.http,
    );
    let listener = TcpListener::bind((config.host.as_str(), config.port))
        .await
        .with_context(|| format!("binding {}:{}", config.host, config.port))?;
    tracing::info!(
        auth = !state.api_keys().is_open(),
        "listening on http://{}",
        listener.local_addr()?
    );
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let app = router(state.clone());
    let edge = edge_config(&config.http);
    let server = tokio::spawn(crate::serve::edge::serve(listener, app, edge, async {
        let _ = stop_rx.await;
    }));
    let load_config = config.clone();
    let loading = tokio::task::spawn_blocking(move || crate::load::model::load(&load_config));
    let loaded: Loaded = tokio::select! {
        loaded = loading => loaded.context("model loading panicked")??,
        _ = shutdown_signal() => {
            tracing::info!("signal received while loading; exiting");
            return Ok(());
        }
    };
    state.set_loaded(loaded);
    tracing::info!("model loaded; ready");
    shutdown_signal().await;
    drain(&state, config.drain_timeout).await;
    let _ = stop_tx.send(());
    // Connections still streaming after the drain deadline are cut here.
    let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
    tracing::info!("drained; exiting");
    Ok(())
}

/// Refuses new work and waits for in-flight requests, up to `timeout`.
async fn drain(state: &AppState, timeout: Duration) {
    let Some(loaded) = state.loaded() else {
        return;
    };
    loaded.engine.start_draining();
    let deadline = Instant::now() + timeout;
    tracing::info!(in_flight = loaded.engine.in_flight(), "draining");
    // A dead worker ends nothing more: waiting for it would only delay exit.
    while loaded.engine.in_flight() > 0 && loaded.engine.is_alive() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let left = loaded.engine.in_flight();
    if left > 0 {
        tracing::warn!(left, "drain timeout: abandoning in-flight requests");
    }
    // The last blocks computed, on their way to a lower KV tier.
    while loaded.engine.tier_writes_pending() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The edge's limits from the HTTP config.
pub fn edge_config(http: &HttpConfig) -> EdgeConfig {
    EdgeConfig {
        header_read_timeout: http.read_timeout,
        write_stall_timeout: http.stream_idle_timeout,
        max_connections: http.max_connections,
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
