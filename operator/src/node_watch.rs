//! The shell that keeps the cluster's nodes: a reflector store for planning,
//! and a trigger that fires when what planning reads from them changed.

use futures::channel::mpsc;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};

use crate::gpu_nodes::fingerprint;

/// Starts watching nodes; returns once the first list is in the store.
pub async fn watch(client: kube::Client) -> (Store<Node>, impl Stream<Item = ()> + Send + 'static) {
    let (reader, writer) = reflector::store();
    let (tx, rx) = mpsc::unbounded();
    let store = reader.clone();
    let events = watcher(Api::<Node>::all(client), watcher::Config::default())
        .default_backoff()
        .reflect(writer);
    tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        let mut last = None;
        while let Some(event) = events.next().await {
            match event {
                // Each object of a (re)list is followed by InitDone: wait for it.
                Ok(watcher::Event::InitApply(_) | watcher::Event::Init) => continue,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "node watch");
                    continue;
                }
            }
            let now = fingerprint(store.state().iter().map(|n| n.as_ref()));
            if last.replace(now) != Some(now) && tx.unbounded_send(()).is_err() {
                break;
            }
        }
    });
    if reader.wait_until_ready().await.is_err() {
        tracing::warn!("node watch ended before its first list");
    }
    (reader, rx)
}
