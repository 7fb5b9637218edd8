//! The long-polls: one per ferrox-router pod, each `GET /pending?since=V`
//! held by the router until its waiting line changes (or `wait_ms` passes),
//! so the board hears of the first waiting request as it is queued, with no
//! polling interval to race. The pods come from the router Service's
//! EndpointSlices (ready addresses, watched) or a fixed list.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ferrox_plan::contract::router::{PENDING_PATH, PendingReport};
use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use tokio::task::JoinHandle;

use super::{PendingBoard, RouterService};

/// How long each poll is held by the router.
const WAIT_MS: u64 = 30_000;
/// First pause after a failed poll; doubled up to [`MAX_BACKOFF`].
const BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Where the router pods are.
#[derive(Debug, Clone)]
pub enum RouterPods {
    /// The ready addresses of this Service's EndpointSlices.
    Service(RouterService),
    /// Base URLs, fixed (`--router-endpoint`, tests and single routers).
    Fixed(Vec<String>),
}

/// Keeps one long-poll per router pod feeding `board`, until dropped.
pub async fn run(client: Client, pods: RouterPods, board: PendingBoard) {
    let http = reqwest::Client::new();
    let mut polls: BTreeMap<String, JoinHandle<()>> = BTreeMap::new();
    let mut resync = |urls: BTreeSet<String>| {
        polls.retain(|url, task| {
            let keep = urls.contains(url);
            if !keep {
                task.abort();
                board.forget(url);
            }
            keep
        });
        for url in urls {
            polls
                .entry(url.clone())
                .or_insert_with(|| tokio::spawn(poll_one(http.clone(), url, board.clone())));
        }
    };
    match pods {
        RouterPods::Fixed(urls) => {
            resync(urls.into_iter().collect());
            std::future::pending::<()>().await;
        }
        RouterPods::Service(svc) => {
            let api: Api<EndpointSlice> = Api::namespaced(client, &svc.namespace);
            let cfg = watcher::Config::default()
                .labels(&format!("kubernetes.io/service-name={}", svc.name));
            let (store, writer) = reflector::store();
            let mut events = std::pin::pin!(reflector(writer, watcher(api, cfg)).default_backoff());
            while let Some(event) = events.next().await {
                if let Err(e) = event {
                    tracing::warn!(error = %e, "router EndpointSlices watch");
                    continue;
                }
                let slices = store.state();
                resync(ready_urls(slices.iter().map(|s| s.as_ref())));
            }
        }
    }
}

/// Base URLs of the ready addresses in `slices`.
pub fn ready_urls<'a>(slices: impl Iterator<Item = &'a EndpointSlice>) -> BTreeSet<String> {
    slices
        .flat_map(|s| &s.endpoints)
        .filter(|e| {
            let c = e.conditions.as_ref();
            // Ready unset means ready (the API's documented default).
            c.and_then(|c| c.ready).unwrap_or(true)
                && !c.and_then(|c| c.terminating).unwrap_or(false)
        })
        .flat_map(|e| e.addresses.iter().map(|a| RouterService::pod_url(a)))
        .collect()
}

/// Polls one router pod forever (the task is aborted when the pod goes).
async fn poll_one(http: reqwest::Client, base: String, board: PendingBoard) {
    let mut since: Option<u64> = None;
    let mut backoff = BACKOFF;
    loop {
        let query = match since {
            Some(v) => format!("?since={v}&wait_ms={WAIT_MS}"),
            None => String::new(),
        };
        let got = async {
            http.get(format!("{base}{PENDING_PATH}{query}"))
                .timeout(Duration::from_millis(WAIT_MS + 5_000))
                .send()
                .await?
                .error_for_status()?
                .json::<PendingReport>()
                .await
        }
        .await;
        match got {
            Ok(report) => {
                since = Some(report.version);
                board.report(&base, report);
                backoff = BACKOFF;
            }
            Err(e) => {
                tracing::debug!(router = %base, error = %e, "pending poll");
                board.forget(&base);
                since = None;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions};

    fn ep(ip: &str, ready: Option<bool>, terminating: Option<bool>) -> Endpoint {
        Endpoint {
            addresses: vec![ip.into()],
            conditions: Some(EndpointConditions {
                ready,
                terminating,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn ready_addresses_only() {
        let slice = EndpointSlice {
            endpoints: vec![
                ep("10.0.0.1", Some(true), None),
                ep("10.0.0.2", Some(false), None),
                ep("10.0.0.3", None, None),
                ep("10.0.0.4", Some(true), Some(true)),
            ],
            ..Default::default()
        };
        let urls: Vec<_> = ready_urls([&slice].into_iter()).into_iter().collect();
        assert_eq!(urls, ["http://10.0.0.1:8000", "http://10.0.0.3:8000"]);
    }

    #[tokio::test]
    async fn a_long_poll_brings_the_first_waiting_request_to_the_board() {
        // A router stand-in: answers at once without `since`, holds with it
        // until its count changes (here: 150 ms later, one request queued).
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let app = axum::Router::new().route(
            PENDING_PATH,
            axum::routing::get(
                |q: axum::extract::Query<BTreeMap<String, String>>| async move {
                    let models = if q.contains_key("since") {
                        tokio::time::sleep(Duration::from_millis(150)).await;
                        BTreeMap::from([("smol".to_string(), 1)])
                    } else {
                        BTreeMap::new()
                    };
                    axum::Json(PendingReport {
                        version: 1 + q.len() as u64,
                        models,
                    })
                },
            ),
        );
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let board = PendingBoard::default();
        let mut changes = board.subscribe();
        let client =
            Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let task = tokio::spawn(run(client, RouterPods::Fixed(vec![base]), board.clone()));
        tokio::time::timeout(Duration::from_secs(5), changes.changed())
            .await
            .expect("the board heard of the waiting request")
            .unwrap();
        assert_eq!(board.pending("smol"), 1);
        task.abort();
    }
}
