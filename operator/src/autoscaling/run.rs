//! The scrape loop: list, scrape each ready pod, then record what the
//! servers run with (`status.observedPlan`) and, for the built-in
//! autoscaler, decide (pure) and write `/scale`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::decision::{Decision, History, Policy, decide};
use super::observation::Observation;
use super::scrape::{aggregate, scrape_all};
use crate::Error;
use crate::crd::{
    AdapterStatus, AutoscalerStatus, AutoscalingSpec, KvTierStatus, ModelDeployment,
    ObservedPlanStatus,
};
use crate::desired::{SERVER_PORT, selector_string};
use crate::kv_tiers;
use crate::observed_plan::{Expected, observe};
use crate::reconcile::{Context, publish};
use crate::served_adapters::served;
use crate::served_name::served_name;

/// Field manager of `status.autoscaler`, `status.observedPlan`,
/// `status.adapters` and `status.kvTiers` (the reconciler owns the rest).
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

/// When `spec.replicas` was changed, and whether that was a wake from zero.
#[derive(Debug, Clone, PartialEq)]
pub struct Scaled {
    /// RFC 3339.
    pub at: String,
    /// From zero, on requests waiting in ferrox-router.
    pub woke: bool,
}

/// The status block for a decision; `last` carries the previous scale and wake times.
pub fn autoscaler_status(
    decision: &Decision,
    obs: &Observation,
    last: Option<&AutoscalerStatus>,
    scaled: Option<Scaled>,
) -> AutoscalerStatus {
    let woke = scaled.as_ref().filter(|s| s.woke).map(|s| s.at.clone());
    AutoscalerStatus {
        desired_replicas: decision.desired,
        last_scale_time: scaled
            .map(|s| s.at)
            .or_else(|| last.and_then(|l| l.last_scale_time.clone())),
        last_wake_time: woke.or_else(|| last.and_then(|l| l.last_wake_time.clone())),
        reason: decision.reason.clone(),
        observed_queue: (obs.waiting * 100.0).round() / 100.0,
        observed_pending: obs.pending,
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
            || o.observed_pending != new.observed_pending
            || o.observed_kv_usage != new.observed_kv_usage
    })
}

/// The plan `md`'s servers should report, if it has one.
pub fn expected(md: &ModelDeployment) -> Option<Expected<'_>> {
    let status = md.status.as_ref()?;
    let plan = status.plan.as_ref()?;
    // The geometry as planned with: its KV dtype is always recorded.
    let dtype = status.geometry.as_ref()?.geometry.kv_dtype?;
    Some(Expected {
        plan,
        kv_dtype: dtype.name(),
    })
}

/// Runs the scrape loop every `interval` until the task is dropped: the
/// observed plan of every planned ModelDeployment, and the built-in
/// autoscaler's decision for those it scales.
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
                tracing::warn!(error = %e, "scraper: list ModelDeployments");
                continue;
            }
        };
        let watched = |m: &&ModelDeployment| {
            m.builtin_autoscaling().is_some() || m.status.as_ref().is_some_and(|s| s.plan.is_some())
        };
        for md in list.items.iter().filter(watched) {
            if let Err(e) = step(&ctx, &http, md, &mut histories).await {
                tracing::warn!(name = %md.name_any(), error = %e, "scraper step");
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
    let ns = md.namespace().ok_or(Error::Missing("metadata.namespace"))?;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let list = pods
        .list(&ListParams::default().labels(&selector_string(md)))
        .await?;
    let urls = ready_pod_urls(&list.items);
    let (samples, errors) = scrape_all(http, &urls).await;
    for e in &errors {
        ctx.metrics.scrape_failed();
        tracing::debug!(error = %e, "scrape");
    }
    // Scraping takes a while, and the waker may have scaled and written
    // status meanwhile: decide on the object as it is now, not as listed.
    let api: Api<ModelDeployment> = Api::namespaced(ctx.client.clone(), &ns);
    let fresh = api.get(&md.name_any()).await?;
    let md = &fresh;
    let reports: Vec<_> = samples.iter().filter_map(|s| s.plan.clone()).collect();
    let observed = expected(md).and_then(|e| observe(&reports, &e));
    let old = md.status.as_ref().and_then(|s| s.autoscaler.as_ref());
    let autoscaler = match md.builtin_autoscaling() {
        Some(spec) => {
            let key = format!("{ns}/{}", md.name_any());
            let obs = Observation {
                pending: ctx
                    .pending
                    .as_ref()
                    .map_or(0, |b| b.pending(&served_name(md))) as f64,
                ..aggregate(&samples)
            };
            Some(autoscale(ctx, &api, md, spec, &obs, histories, key).await?)
        }
        None => None,
    };
    // Unless this step scaled (the object moved on, by our hand), the write
    // holds only if nothing wrote the object since it was read: a status the
    // waker wrote just now (its lastWakeTime) is not overwritten from an
    // older view. A refused write is retried on the next tick.
    let precondition = match autoscaler {
        Some((_, true)) => None,
        _ => md.resource_version(),
    };
    let autoscaler = autoscaler.map(|(status, _)| status);
    let old_observed = md.status.as_ref().and_then(|s| s.observed_plan.as_ref());
    let adapters = served(&md.spec.adapters, &samples);
    let old_adapters = md
        .status
        .as_ref()
        .map_or(&[][..], |s| s.adapters.as_slice());
    let tiers = kv_tiers::observe(&samples);
    let old_tiers = (md.status.as_ref()).map_or(&[][..], |s| s.kv_tiers.as_slice());
    let changed = match &autoscaler {
        Some(new) => status_changed(old, new),
        None => old.is_some(),
    } || old_observed != observed.as_ref()
        || old_adapters != adapters.as_slice()
        || old_tiers != tiers.as_slice();
    if !changed {
        return Ok(());
    }
    match write_status(
        &api,
        md,
        autoscaler.as_ref(),
        observed.as_ref(),
        (&adapters, &tiers),
        precondition,
    )
    .await
    {
        Err(Error::Kube(kube::Error::Api(e))) if e.code == 409 => {
            tracing::debug!(name = %md.name_any(), "status moved on since read; next tick");
            Ok(())
        }
        other => other,
    }
}

/// The built-in autoscaler's decision on `obs`; writes `/scale` when it
/// moves (then the flag is true).
async fn autoscale(
    ctx: &Context,
    api: &Api<ModelDeployment>,
    md: &ModelDeployment,
    spec: &AutoscalingSpec,
    obs: &Observation,
    histories: &mut HashMap<String, (Policy, History)>,
    key: String,
) -> Result<(AutoscalerStatus, bool), Error> {
    let policy = match ctx.pending {
        Some(_) => Policy::from(spec),
        None => Policy::from(spec).without_wake(),
    };
    let entry = histories
        .entry(key)
        .or_insert_with(|| (policy.clone(), History::default()));
    if entry.0 != policy {
        *entry = (policy.clone(), History::default());
    }
    let now = (ctx.clock)().0.as_second();
    let decision = decide(&policy, md.spec.replicas, obs, &mut entry.1, now);
    act(ctx, api, md, &decision, obs).await
}

/// Writes `/scale` when `decision` moves the count (event `Woke` from zero,
/// else `Scaled`); returns the status block to record, and whether it scaled.
pub async fn act(
    ctx: &Context,
    api: &Api<ModelDeployment>,
    md: &ModelDeployment,
    decision: &Decision,
    obs: &Observation,
) -> Result<(AutoscalerStatus, bool), Error> {
    let current = md.spec.replicas;
    let mut scaled = None;
    if decision.scales(current) {
        let patch = json!({"spec": {"replicas": decision.desired}});
        api.patch_scale(
            &md.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
        ctx.metrics.scaled();
        let woke = current == 0;
        scaled = Some(Scaled {
            at: (ctx.clock)().0.to_string(),
            woke,
        });
        let reason = if woke { "Woke" } else { "Scaled" };
        publish(ctx, md, false, reason.into(), decision.reason.clone()).await?;
    }
    let old = md.status.as_ref().and_then(|s| s.autoscaler.as_ref());
    let moved = scaled.is_some();
    Ok((autoscaler_status(decision, obs, old, scaled), moved))
}

/// Applies `status.autoscaler`, `status.observedPlan`, `status.adapters`
/// and `status.kvTiers` under the scraper's own field manager (what it
/// leaves out, it gives up).
pub async fn write_status(
    api: &Api<ModelDeployment>,
    md: &ModelDeployment,
    autoscaler: Option<&AutoscalerStatus>,
    observed: Option<&ObservedPlanStatus>,
    (adapters, tiers): (&[AdapterStatus], &[KvTierStatus]),
    precondition: Option<String>,
) -> Result<(), Error> {
    let mut status = serde_json::Map::new();
    if !adapters.is_empty() {
        status.insert("adapters".into(), serde_json::to_value(adapters)?);
    }
    if !tiers.is_empty() {
        status.insert("kvTiers".into(), serde_json::to_value(tiers)?);
    }
    if let Some(a) = autoscaler {
        status.insert("autoscaler".into(), serde_json::to_value(a)?);
    }
    if let Some(o) = observed {
        status.insert("observedPlan".into(), serde_json::to_value(o)?);
    }
    let mut metadata = json!({"name": md.name_any()});
    if let Some(rv) = precondition {
        // The API server refuses the apply (409) once the object moved on.
        metadata["resourceVersion"] = rv.into();
    }
    let body = json!({
        "apiVersion": ModelDeployment::api_version(&()),
        "kind": ModelDeployment::kind(&()),
        "metadata": metadata,
        "status": status,
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
            ..Default::default()
        };
        let first = autoscaler_status(&d, &obs, None, None);
        assert!(status_changed(None, &first));
        let reworded = Decision {
            reason: "steady again".into(),
            ..d.clone()
        };
        let same = autoscaler_status(&reworded, &obs, Some(&first), None);
        assert!(!status_changed(Some(&first), &same));
        let at = |t: &str, woke| Some(Scaled { at: t.into(), woke });
        let woke = autoscaler_status(&d, &obs, Some(&first), at("t0", true));
        assert!(status_changed(Some(&first), &woke));
        let scaled = autoscaler_status(&d, &obs, Some(&woke), at("t", false));
        assert!(status_changed(Some(&first), &scaled));
        let later = autoscaler_status(&d, &obs, Some(&scaled), None);
        assert_eq!(later.last_scale_time.as_deref(), Some("t"));
        assert_eq!(later.last_wake_time.as_deref(), Some("t0"));
        let pending = Observation {
            pending: 2.0,
            ..obs
        };
        let waiting = autoscaler_status(&d, &pending, Some(&later), None);
        assert!(
            status_changed(Some(&later), &waiting),
            "the router's count is a number"
        );
    }

    #[tokio::test]
    async fn a_status_read_before_a_wake_is_not_written_over_it() {
        use crate::crd::ModelDeploymentStatus;
        use crate::fixtures::{cpu_spec, md};
        use crate::verifier::mock_client;
        use http::{Method, StatusCode};

        let (client, mut v) = mock_client();
        let ctx = Context::new(client, Default::default(), Arc::default(), None);
        let mut spec = cpu_spec("2Gi");
        spec.autoscaling = Some(
            serde_json::from_value(json!({"enabled": true, "minReplicas": 1, "maxReplicas": 2}))
                .unwrap(),
        );
        let listed = md("m", spec);
        // Meanwhile the waker scaled it and wrote its wake time.
        let mut fresh = listed.clone();
        fresh.metadata.resource_version = Some("7".into());
        let woke = AutoscalerStatus {
            desired_replicas: 1,
            last_scale_time: Some("t-wake".into()),
            last_wake_time: Some("t-wake".into()),
            reason: "woke".into(),
            observed_queue: 0.0,
            observed_pending: 3.0,
            observed_kv_usage: 0.0,
            observed_pods: 0,
        };
        fresh.status = Some(ModelDeploymentStatus {
            autoscaler: Some(woke),
            ..Default::default()
        });
        let answer = serde_json::to_value(&fresh).unwrap();
        let scripted = tokio::spawn(async move {
            v.expect(Method::GET, "/api/v1/namespaces/default/pods", |_| {
                (
                    StatusCode::OK,
                    json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": []}),
                )
            })
            .await;
            v.expect(
                Method::GET,
                "/apis/ferrox.dev/v1alpha1/namespaces/default/modeldeployments/m",
                |_| (StatusCode::OK, answer),
            )
            .await;
            // Moved on again before this write: the API server refuses it.
            let conflict = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "reason": "Conflict", "code": 409, "message": "the object has been modified"});
            let seen = v
                .expect(
                    Method::PATCH,
                    "/apis/ferrox.dev/v1alpha1/namespaces/default/modeldeployments/m/status",
                    |_| (StatusCode::CONFLICT, conflict),
                )
                .await;
            v.expect_silence().await;
            seen.body
        });
        let mut histories = HashMap::new();
        step(&ctx, &reqwest::Client::new(), &listed, &mut histories)
            .await
            .expect("a refused write waits for the next tick");
        let body = scripted.await.unwrap();
        // Written from the object as read after scraping, and only if unchanged since.
        assert_eq!(body["metadata"]["resourceVersion"], "7");
        assert_eq!(body["status"]["autoscaler"]["lastWakeTime"], "t-wake");
    }
}
