//! One task per endpoint: fetches its prefix spec once, then reads its KV
//! event log every poll interval and its load gauges every few, into the
//! table. An endpoint whose poll fails is not ready until one succeeds.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ferrox_core::KvEventsPage;
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
            Ok(page) => s.table().apply_events(&model, &url, &page),
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
}
