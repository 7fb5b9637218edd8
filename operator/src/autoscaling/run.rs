//! The built-in autoscaler's loop: list, scrape, decide (pure), write /scale.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::Error;
use crate::autoscale::{Decision, History, Observation, Policy};
use crate::crd::{AutoscalerStatus, ModelDeployment};
use crate::desired::{SERVER_PORT, selector_string};
use crate::metrics_scrape::scrape_and_decide;
use crate::reconcile::{Context, publish};

/// Field manager of `status.autoscaler` (the reconciler owns the rest).
pub const FIELD_MANAGER: &str = "ferrox-operator-autoscaler";

/// `/metrics` URLs of the ready pods among `pods`.
pub fn ready_pod_urls(pods: &[Pod]) -> Vec<String> {
    pods.iter()
        .filter_map(|p| {
            let status = p.status.as_ref()?;
            let ready = status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let ip = status.pod_ip.as_ref()?;
            (ready && p.metadata.deletion_timestamp.is_none())
                .then(|| format!("http://{ip}:{SERVER_PORT}/metrics"))
        })
        .collect()
}

/// The status block for a decision; `last` carries the previous scale time.
pub fn autoscaler_status(
    decision: &Decision,
    obs: &Observation,
    last: Option<&AutoscalerStatus>,
    scaled_at: Option<String>,
) -> AutoscalerStatus {
    AutoscalerStatus {
        desired_replicas: decision.desired,
        last_scale_time: scaled_at.or_else(|| last.and_then(|l| l.last_scale_time.clone())),
        reason: decision.reason.clone(),
        observed_queue: (obs.waiting * 100.0).round() / 100.0,
        observed_kv_usage: (obs.kv_usage * 100.0).round() / 100.0,
        observed_pods: obs.pods as i32,
    }
}

/// Whether the status block is worth a write (the numbers moved, not just the words).
pub fn status_changed(old: Option<&AutoscalerStatus>, new: &AutoscalerStatus) -> bool {
    old.is_none_or(|o| {
        (o.desired_replicas, &o.last_scale_time, o.observed_pods)
            != (
                new.desired_replicas,
                &new.last_scale_time,
                new.observed_pods,
            )
            || o.observed_queue != new.observed_queue
            || o.observed_kv_usage != new.observed_kv_usage
    })
}

/// Runs the autoscaler every `interval` until the task is dropped.
pub async fn run(ctx: Arc<Context>, interval: Duration) {
    let http = reqwest::Client::new();
    let mut histories: HashMap<String, (Policy, History)> = HashMap::new();
    let mut tick = tokio::time::interval(interval);
    loop {
        tick.tick().await;
        let api: Api<ModelDeployment> = Api::all(ctx.client.clone());
        let list = match api.list(&ListParams::default()).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "autoscaler: list ModelDeployments");
                continue;
            }
        };
        for md in list
            .items
            .iter()
            .filter(|m| m.builtin_autoscaling().is_some())
        {
            if let Err(e) = step(&ctx, &http, md, &mut histories).await {
                tracing::warn!(name = %md.name_any(), error = %e, "autoscaler step");
            }
        }
    }
}

async fn step(
    ctx: &Context,
    http: &reqwest::Client,
    md: &ModelDeployment,
    histories: &mut HashMap<String, (Policy, History)>,
) -> Result<(), Error> {
    let spec = md
        .builtin_autoscaling()
        .ok_or(Error::Missing("builtin autoscaling"))?;
    let ns = md.namespace().ok_or(Error::Missing("metadata.namespace"))?;
    let policy = Policy::from(spec);
    let entry = histories
        .entry(format!("{ns}/{}", md.name_any()))
        .or_insert_with(|| (policy.clone(), History::default()));
    if entry.0 != policy {
        *entry = (policy.clone(), History::default());
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let list = pods
        .list(&ListParams::default().labels(&selector_string(md)))
        .await?;
    let urls = ready_pod_urls(&list.items);
    let now = (ctx.clock)();
    let current = md.spec.replicas;
    let (decision, obs, errors) = scrape_and_decide(
        http,
        &urls,
        &policy,
        current,
        &mut entry.1,
        now.0.as_second(),
    )
    .await;
    for e in &errors {
        ctx.metrics.scrape_failed();
        tracing::debug!(error = %e, "scrape");
    }
    let api: Api<ModelDeployment> = Api::namespaced(ctx.client.clone(), &ns);
    let mut scaled_at = None;
    if decision.scales(current) {
        let patch = json!({"spec": {"replicas": decision.desired}});
        api.patch_scale(
            &md.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
        ctx.metrics.scaled();
        scaled_at = Some(now.0.to_string());
        publish(ctx, md, false, "Scaled".into(), decision.reason.clone()).await?;
    }
    let old = md.status.as_ref().and_then(|s| s.autoscaler.as_ref());
    let new = autoscaler_status(&decision, &obs, old, scaled_at);
    if status_changed(old, &new) {
        write_status(&api, md, &new).await?;
    }
    Ok(())
}

/// Applies `status.autoscaler` under the autoscaler's own field manager.
async fn write_status(
    api: &Api<ModelDeployment>,
    md: &ModelDeployment,
    status: &AutoscalerStatus,
) -> Result<(), Error> {
    let body = json!({
        "apiVersion": ModelDeployment::api_version(&()),
        "kind": ModelDeployment::kind(&()),
        "metadata": {"name": md.name_any()},
        "status": {"autoscaler": status},
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch_status(&md.name_any(), &params, &Patch::Apply(&body))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};

    fn pod(ip: Option<&str>, ready: bool) -> Pod {
        Pod {
            status: Some(PodStatus {
                pod_ip: ip.map(String::from),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_ready_pods_with_an_ip_are_scraped() {
        let pods = [
            pod(Some("10.0.0.1"), true),
            pod(Some("10.0.0.2"), false),
            pod(None, true),
        ];
        assert_eq!(ready_pod_urls(&pods), ["http://10.0.0.1:8000/metrics"]);
    }

    #[test]
    fn status_writes_only_when_numbers_move() {
        let d = Decision {
            desired: 2,
            recommendation: 2,
            reason: "steady".into(),
        };
        let obs = Observation {
            pods: 2,
            waiting: 1.0,
            running: 2.0,
            kv_usage: 0.5,
        };
        let first = autoscaler_status(&d, &obs, None, None);
        assert!(status_changed(None, &first));
        let reworded = Decision {
            reason: "steady again".into(),
            ..d.clone()
        };
        let same = autoscaler_status(&reworded, &obs, Some(&first), None);
        assert!(!status_changed(Some(&first), &same));
        let scaled = autoscaler_status(&d, &obs, Some(&first), Some("t".into()));
        assert!(status_changed(Some(&first), &scaled));
        let later = autoscaler_status(&d, &obs, Some(&scaled), None);
        assert_eq!(later.last_scale_time.as_deref(), Some("t"));
    }
}
