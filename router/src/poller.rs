//! One task per endpoint: fetches its prefix spec once, then reads its KV
//! event log every poll interval and its load gauges every few, into the
//! table. An endpoint whose poll fails is not ready until one succeeds.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ferrox_core::KvEventsPage;
use ferrox_plan::KvTier;
use ferrox_plan::contract::metric;
use ferrox_prompt::Prompter;

use crate::shared::Shared;

/// Load gauges are read every this many event polls.
const LOAD_EVERY: u32 = 4;

/// The upstream key for the router's own reads (`--upstream-api-key`).
static UPSTREAM_KEY: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

/// Sets the key the router's own reads carry.
pub fn set_upstream_key(key: Option<String>) {
    let _ = UPSTREAM_KEY.set(key.filter(|k| !k.is_empty()));
}

fn get(s: &Shared, url: String) -> reqwest::RequestBuilder {
    let req = s.client().get(url).timeout(Duration::from_secs(10));
    match UPSTREAM_KEY.get().and_then(Option::as_ref) {
        Some(key) => req.bearer_auth(key),
        None => req,
    }
}

/// Makes the endpoint set `wanted` (model -> [(url, ready)]), starting
/// a poller for each new endpoint and stopping those of gone ones, and
/// lets waiters of models that have a ready endpoint now go.
pub fn sync(s: &Shared, wanted: &BTreeMap<String, Vec<(String, bool)>>) {
    let changes = s.table().sync(wanted);
    let mut pollers = s.pollers();
    for key in changes.removed {
        if let Some(task) = pollers.remove(&key) {
            task.abort();
        }
        s.metrics().forget_endpoint(&key.0, &key.1);
    }
    for (model, url) in changes.added {
        let task = tokio::spawn(run(s.clone(), model.clone(), url.clone()));
        pollers.insert((model, url), task);
    }
    drop(pollers);
    let models: Vec<String> = s.table().models().map(str::to_string).collect();
    for m in models {
        s.wake(&m);
    }
}

/// Polls `url` (an endpoint of `model`) until aborted.
pub async fn run(s: Shared, model: String, url: String) {
    let interval = s.settings().poll_interval;
    let mut tick: u32 = 0;
    loop {
        let has_prompter = s
            .table()
            .endpoint_mut(&model, &url)
            .is_some_and(|e| e.prompter.is_some());
        if !has_prompter
            && let Some(p) = fetch_prompter(&s, &url).await
            && let Some(e) = s.table().endpoint_mut(&model, &url)
        {
            e.prompter = Some(p);
        }
        let was_ready = s
            .table()
            .endpoint_mut(&model, &url)
            .is_some_and(|e| e.ready());
        match read_events(&s, &model, &url).await {
            Ok(page) => {
                s.table().apply_events(&model, &url, &page);
                read_lower_tiers(&s, &model, &url).await;
            }
            Err(e) => {
                tracing::debug!(%url, error = %e, "KV events not read");
                if let Some(e) = s.table().endpoint_mut(&model, &url) {
                    e.reachable = false;
                }
            }
        }
        if tick.is_multiple_of(LOAD_EVERY)
            && let Ok((waiting, kv_usage)) = read_load(&s, &url).await
            && let Some(e) = s.table().endpoint_mut(&model, &url)
        {
            e.load.waiting = waiting;
            e.load.kv_usage = kv_usage;
        }
        if tick.is_multiple_of(LOAD_EVERY)
            && let Ok(adapters) = read_adapters(&s, &url).await
            && let Some(e) = s.table().endpoint_mut(&model, &url)
        {
            e.adapters = adapters;
        }
        let ready = s
            .table()
            .endpoint_mut(&model, &url)
            .is_some_and(|e| e.ready());
        if ready && !was_ready {
            tracing::info!(%model, %url, "endpoint ready");
            s.wake(&model);
        }
        tick = tick.wrapping_add(1);
        tokio::time::sleep(interval).await;
    }
}

/// The endpoint's prompt recipe, or `None` (no tokenizer: the hash
/// fallback routes its model until one is fetched).
async fn fetch_prompter(s: &Shared, url: &str) -> Option<Arc<Prompter>> {
    let resp = get(s, format!("{url}/prefix_spec")).send().await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let bytes = resp.bytes().await.ok()?;
    match s.prompters().get(bytes.to_vec()).await {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::warn!(%url, error = %e, "prefix spec unusable; routing by prompt hash");
            None
        }
    }
}

async fn read_events(s: &Shared, model: &str, url: &str) -> anyhow::Result<KvEventsPage> {
    let (since, epoch) = s
        .table()
        .endpoint_mut(model, url)
        .map(|e| e.holdings.cursor())
        .unwrap_or_default();
    let resp = get(s, format!("{url}/kv_events?since={since}&epoch={epoch}"))
        .send()
        .await?
        .error_for_status()?;
    Ok(resp.json().await?)
}

/// What a server answered to a lower tier's page.
#[derive(Debug, PartialEq)]
enum TierAnswer {
    /// The tier's page (an empty one, epoch 0, when it has no such tier).
    Page(KvEventsPage),
    /// It cannot page tiers at all (an older server: 400).
    NoSuchTier,
}

/// `GET /kv_events?tier=..` of `url`.
fn tier_events_url(url: &str, tier: KvTier, (since, epoch): (u64, u64)) -> String {
    format!("{url}/kv_events?tier={tier}&since={since}&epoch={epoch}")
}

/// A 400 to a tier query is an older server's "no such parameter": no such
/// tier, not an error (a newer one answers an absent tier with an empty page).
fn refused(status: reqwest::StatusCode) -> bool {
    status == reqwest::StatusCode::BAD_REQUEST
}

/// Reads each lower tier the endpoint has not refused into the table; one
/// that fails otherwise is tried again next poll.
async fn read_lower_tiers(s: &Shared, model: &str, url: &str) {
    let tiers = s.table().endpoint_mut(model, url).map(|e| e.lower.to_ask());
    for tier in tiers.unwrap_or_default() {
        match read_tier(s, model, url, tier).await {
            Ok(TierAnswer::Page(page)) => s.table().apply_tier_events(model, url, tier, &page),
            Ok(TierAnswer::NoSuchTier) => {
                tracing::debug!(%url, %tier, "no KV tier pages; not asked again until it restarts");
                if let Some(e) = s.table().endpoint_mut(model, url) {
                    e.lower.refuse(tier);
                }
            }
            Err(e) => tracing::debug!(%url, %tier, error = %e, "KV tier events not read"),
        }
    }
}

async fn read_tier(s: &Shared, model: &str, url: &str, tier: KvTier) -> anyhow::Result<TierAnswer> {
    let cursor = s
        .table()
        .endpoint_mut(model, url)
        .map(|e| e.lower.cursor(tier));
    let resp = get(s, tier_events_url(url, tier, cursor.unwrap_or_default()))
        .send()
        .await?;
    if refused(resp.status()) {
        return Ok(TierAnswer::NoSuchTier);
    }
    Ok(TierAnswer::Page(resp.error_for_status()?.json().await?))
}

async fn read_load(s: &Shared, url: &str) -> anyhow::Result<(usize, f64)> {
    let text = get(s, format!("{url}/metrics"))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    let waiting = gauge(&text, metric::WAITING).unwrap_or(0.0);
    let kv = gauge(&text, metric::KV_USAGE).unwrap_or(0.0);
    Ok((waiting.max(0.0) as usize, kv))
}

/// The LoRA adapters an endpoint lists, with their prefix-cache keys.
async fn read_adapters(s: &Shared, url: &str) -> anyhow::Result<BTreeMap<String, Option<String>>> {
    let body: serde_json::Value = get(s, format!("{url}/v1/models"))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    Ok(adapters_of(&body))
}

/// The adapters of a `/v1/models` body: the cards with a `parent`.
fn adapters_of(body: &serde_json::Value) -> BTreeMap<String, Option<String>> {
    let cards = body["data"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    cards
        .iter()
        .filter(|c| c["parent"].is_string())
        .filter_map(|c| {
            let id = c["id"].as_str()?.to_string();
            Some((id, c["cache_key"].as_str().map(str::to_string)))
        })
        .collect()
}

/// The value of the first sample of `name` in a Prometheus text exposition.
fn gauge(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::atomic::Ordering::SeqCst;

    #[test]
    fn adapters_are_the_cards_with_a_parent() {
        let body = serde_json::json!({"object": "list", "data": [
            {"id": "m", "parent": null},
            {"id": "sql", "parent": "m", "cache_key": "sql@ab"},
            {"id": "cold", "parent": "m"},
            {"parent": "m"}]});
        let got = adapters_of(&body);
        assert_eq!(got.len(), 2);
        assert_eq!(got["sql"].as_deref(), Some("sql@ab"));
        assert_eq!(got["cold"], None);
        assert!(adapters_of(&serde_json::json!({})).is_empty());
    }

    #[test]
    fn gauges_are_read_by_exact_name() {
        let text = "# HELP vllm:num_requests_waiting x\n\
                    vllm:num_requests_waiting_total 9\n\
                    vllm:num_requests_waiting{model_name=\"m\"} 3\n\
                    vllm:kv_cache_usage_perc 0.25\n";
        assert_eq!(gauge(text, "vllm:num_requests_waiting"), Some(3.0));
        assert_eq!(gauge(text, "vllm:kv_cache_usage_perc"), Some(0.25));
        assert_eq!(gauge(text, "vllm:absent"), None);
    }

    #[test]
    fn tier_queries_name_the_tier_and_only_a_400_means_no_such_tier() {
        let url = tier_events_url("http://h:8000", KvTier::Disk, (7, 3));
        assert_eq!(url, "http://h:8000/kv_events?tier=disk&since=7&epoch=3");
        assert!(refused(reqwest::StatusCode::BAD_REQUEST));
        for other in [200, 404, 500, 503] {
            assert!(!refused(reqwest::StatusCode::from_u16(other).unwrap()));
        }
    }

    /// Counts a fake server's device and tier pages; answers 400 to a tier.
    #[derive(Default)]
    struct OldServer {
        epoch: AtomicU64,
        device: AtomicU64,
        tiers: AtomicU64,
    }

    async fn old_server(state: Arc<OldServer>) -> String {
        use axum::response::IntoResponse;
        let page = move |q: axum::extract::Query<BTreeMap<String, String>>| async move {
            if q.contains_key("tier") {
                state.tiers.fetch_add(1, SeqCst);
                return (axum::http::StatusCode::BAD_REQUEST, "unknown tier").into_response();
            }
            state.device.fetch_add(1, SeqCst);
            let epoch = state.epoch.load(SeqCst);
            axum::Json(KvEventsPage {
                epoch,
                ..KvEventsPage::default()
            })
            .into_response()
        };
        let app = axum::Router::new().route("/kv_events", axum::routing::get(page));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    /// Waits until the server has answered `n` more device pages.
    async fn polls(state: &OldServer, n: u64) {
        let until = state.device.load(SeqCst) + n;
        for _ in 0..2000 {
            if state.device.load(SeqCst) >= until {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the poller stopped polling");
    }

    #[tokio::test]
    async fn an_old_server_s_400_stops_the_tier_queries_until_it_restarts() {
        let state = Arc::new(OldServer::default());
        state.epoch.store(1, SeqCst);
        let url = old_server(state.clone()).await;
        let settings = crate::shared::Settings {
            bounds: ferrox_router::Bounds::default(),
            load_factor: 1.25,
            expect_ttl: Duration::from_secs(1),
            wait_timeout: Duration::from_secs(1),
            max_body: 1 << 20,
            poll_interval: Duration::from_millis(1),
            tier_weights: ferrox_plan::TierWeights::default(),
        };
        let s = Shared::new(settings, ferrox_core::ApiKeys::new(&[]), 8).unwrap();
        sync(
            &s,
            &BTreeMap::from([("m".to_string(), vec![(url.clone(), true)])]),
        );
        polls(&state, 10).await;
        // Asked once per lower tier, then never again.
        assert_eq!(state.tiers.load(SeqCst), 2);
        assert!(
            s.table().has_ready("m"),
            "a refused tier is not an unreachable server"
        );
        // Restarted (a new device epoch): asked once more.
        state.epoch.store(2, SeqCst);
        polls(&state, 10).await;
        assert_eq!(state.tiers.load(SeqCst), 4);
        sync(&s, &BTreeMap::new());
    }
}
