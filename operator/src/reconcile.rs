//! The reconciler: the imperative shell around `geometry`, `plan`, `desired`
//! and `status`. Server-side apply under one field manager; the status is
//! written only when it changed; events only for decisions that changed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::crd::{AcceleratorStatus, ModelDeployment, ObservedGeometry};
use crate::desired::{
    Desired, DesiredConfig, adapters, desired, inference_pool, inspect_job, kv_offload,
    selector_string,
};
use crate::gpu_nodes::GpuTarget;
use crate::metrics::Metrics;
use crate::router::PendingBoard;
use crate::status::{
    Observed, PlanOutcome, decisions, desired_status, status_patch, unschedulable,
};
use crate::trigger_backoff::TriggerBackoff;
use crate::{Error, geometry, gpu_nodes, plan};

/// The one field manager of everything the operator applies.
pub const FIELD_MANAGER: &str = "ferrox-operator";

/// What every reconcile shares.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Publishes events.
    pub recorder: Recorder,
    /// Image and Prometheus settings.
    pub config: DesiredConfig,
    /// The operator's own metrics.
    pub metrics: Arc<Metrics>,
    /// The clock, injected so that tests are deterministic.
    pub clock: fn() -> Time,
    /// The cluster's nodes, kept by a reflector (GPU memory is read from their labels).
    pub nodes: Store<Node>,
    /// What ferrox-router's replicas say is waiting; `None` when the operator
    /// knows no router (then nothing could wake a model at zero).
    pub pending: Option<PendingBoard>,
    failures: Mutex<HashMap<String, u32>>,
}

impl Context {
    /// A context with the system clock.
    pub fn new(
        client: Client,
        config: DesiredConfig,
        metrics: Arc<Metrics>,
        instance: Option<String>,
    ) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.into(),
            instance,
        };
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            config,
            metrics,
            clock: || Time(k8s_openapi::jiff::Timestamp::now()),
            nodes: reflector::store().0,
            pending: None,
            failures: Mutex::default(),
        }
    }

    /// The same context reading nodes from `nodes`.
    pub fn with_nodes(mut self, nodes: Store<Node>) -> Self {
        self.nodes = nodes;
        self
    }

    /// The same context reading the routers' waiting lines from `board`.
    pub fn with_pending(mut self, board: PendingBoard) -> Self {
        self.pending = Some(board);
        self
    }

    /// The same context with another clock (tests pin time).
    pub fn with_clock(mut self, clock: fn() -> Time) -> Self {
        self.clock = clock;
        self
    }
}

fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

async fn apply<K>(api: &Api<K>, obj: &K) -> Result<K, Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let name = obj
        .meta()
        .name
        .clone()
        .ok_or(Error::Missing("metadata.name"))?;
    Ok(api
        .patch(&name, &apply_params(), &Patch::Apply(obj))
        .await?)
}

/// One pass over one ModelDeployment.
pub async fn reconcile(md: Arc<ModelDeployment>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.metrics.reconciled();
    // Being deleted (foreground, or held by a finalizer): the garbage
    // collector is removing the children, and applying them again would
    // re-create what it just deleted.
    if md.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = md.namespace().ok_or(Error::Missing("metadata.namespace"))?;
    let (outcome, geometry, accelerator) = plan_md(&md, &ctx, &ns).await?;
    let mut observed = Observed {
        outcome,
        geometry,
        replicas: 0,
        ready_replicas: 0,
        updated_replicas: 0,
        accelerator,
        unschedulable: None,
    };
    // The shared disk tier's claim first, so no pod waits on a claim not yet
    // asked for; one the API server refuses to change stops the rollout.
    if matches!(observed.outcome, PlanOutcome::Planned(_))
        && let Some(refused) = apply_claim(&md, &ctx, &ns).await?
    {
        observed.outcome = refused;
    }
    if let PlanOutcome::Planned(p) = &observed.outcome {
        let deployment = apply_children(&md, p, &ctx, &ns).await?;
        let s = deployment.status.unwrap_or_default();
        observed.replicas = s.replicas.unwrap_or(0);
        observed.ready_replicas = s.ready_replicas.unwrap_or(0);
        observed.updated_replicas = s.updated_replicas.unwrap_or(0);
        if s.unavailable_replicas.unwrap_or(0) > 0 {
            let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
            let list = pods
                .list(&ListParams::default().labels(&selector_string(&md)))
                .await?;
            observed.unschedulable = unschedulable(&list.items);
        }
    }
    let next = desired_status(&md, &observed, ctx.config.router.as_ref(), &(ctx.clock)());
    if let Some(patch) = status_patch(&md, &next) {
        let api: Api<ModelDeployment> = Api::namespaced(ctx.client.clone(), &ns);
        api.patch_status(&md.name_any(), &apply_params(), &Patch::Apply(patch))
            .await?;
    }
    for d in decisions(md.status.as_ref(), &next) {
        publish(&ctx, &md, d.warning, d.reason, d.note).await?;
    }
    ctx.failures.lock().expect("lock").remove(&key(&md));
    Ok(requeue_after(&observed))
}

type PlanParts = (
    PlanOutcome,
    Option<ObservedGeometry>,
    Option<AcceleratorStatus>,
);

/// The plan (or why there is none), the geometry it used and the GPUs it is for.
async fn plan_md(md: &ModelDeployment, ctx: &Context, ns: &str) -> Result<PlanParts, Error> {
    let refused = (plan::unsupported(&md.spec))
        .or_else(|| adapters::refusal(md))
        .or_else(|| kv_offload::refusal(&md.spec));
    if let Some((reason, message)) = refused {
        return Ok((PlanOutcome::Refused { reason, message }, None, None));
    }
    let gpu = match &md.spec.accelerator {
        Some(acc) => {
            let nodes: Vec<Node> = ctx.nodes.state().iter().map(|n| (**n).clone()).collect();
            match gpu_nodes::target(&md.spec, acc, &nodes) {
                Ok(t) => Some(t),
                Err(message) => {
                    let reason = "NoMatchingNodes";
                    return Ok((PlanOutcome::Refused { reason, message }, None, None));
                }
            }
        }
        None => None,
    };
    let accelerator = gpu.as_ref().map(accelerator_status);
    let g = match resolve_geometry(md, ctx, ns).await? {
        Ok(g) => g,
        Err(outcome) => return Ok((outcome, None, accelerator)),
    };
    let device = plan::device_kind(&md.spec);
    let held = geometry::held_on(&g, device);
    let draft = (g.draft.as_ref()).map(|d| geometry::draft_plan(d, device, held.kv_dtype));
    let outcome = match plan::memory(&md.spec, gpu.as_ref()) {
        Ok(memory) => match plan::planned(
            &md.spec,
            plan::task(&md.spec, Some(&g)),
            &held,
            draft,
            memory,
        ) {
            Ok(p) => PlanOutcome::Planned(Box::new(p)),
            Err(e) => refusal(&e),
        },
        Err(e) => PlanOutcome::Refused {
            reason: "InvalidSpec",
            message: e.to_string(),
        },
    };
    Ok((outcome, Some(geometry::as_planned(&g, device)), accelerator))
}

fn accelerator_status(t: &GpuTarget) -> AcceleratorStatus {
    AcceleratorStatus {
        product: t.product.clone(),
        memory_per_device_bytes: i64::try_from(t.memory_per_device).unwrap_or(i64::MAX),
        memory_from: t.memory_from.into(),
        nodes: i32::try_from(t.nodes).unwrap_or(i32::MAX),
    }
}

fn refusal(e: &ferrox_plan::PlanError) -> PlanOutcome {
    let reason = match e {
        ferrox_plan::PlanError::InsufficientMemory { .. }
        | ferrox_plan::PlanError::PoolTooSmall { .. }
        | ferrox_plan::PlanError::WindowPoolTooSmall { .. }
        | ferrox_plan::PlanError::OverMemory { .. } => "InsufficientMemory",
        ferrox_plan::PlanError::Invalid(_)
        | ferrox_plan::PlanError::NoSuchPool { .. }
        | ferrox_plan::PlanError::SpeculativeConfig(_) => "InvalidSpec",
    };
    PlanOutcome::Refused {
        reason,
        message: e.to_string(),
    }
}

fn requeue_after(o: &Observed) -> Action {
    match o.outcome {
        PlanOutcome::Pending { .. } => Action::requeue(Duration::from_secs(10)),
        PlanOutcome::Planned(_) if o.ready_replicas < o.replicas => {
            Action::requeue(Duration::from_secs(30))
        }
        _ => Action::requeue(Duration::from_secs(300)),
    }
}

/// The geometry to plan with, or the outcome to report while there is none.
async fn resolve_geometry(
    md: &ModelDeployment,
    ctx: &Context,
    ns: &str,
) -> Result<Result<ObservedGeometry, PlanOutcome>, Error> {
    if let Some(g) = geometry::known(md) {
        return Ok(Ok(g));
    }
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    let name = inspect_job::job_name(md);
    let pending = |message: String| {
        Ok(Err(PlanOutcome::Pending {
            reason: "Inspecting",
            message,
        }))
    };
    let Some(job) = jobs.get_opt(&name).await? else {
        match inspect_job::inspect_job(md, &ctx.config) {
            Ok(job) => apply(&jobs, &job).await?,
            Err(e) => {
                return Ok(Err(PlanOutcome::Refused {
                    reason: "InvalidSpec",
                    message: e.to_string(),
                }));
            }
        };
        return pending(format!("inspecting the model with job {name}"));
    };
    let status = job.status.unwrap_or_default();
    let failed = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Failed" && c.status == "True");
    if failed {
        return Ok(Err(PlanOutcome::Refused {
            reason: "InspectionFailed",
            message: format!("job {name} failed; see its pod's logs"),
        }));
    }
    if status.succeeded.unwrap_or(0) == 0 {
        return pending(format!("waiting for job {name}"));
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(&format!("job-name={name}")))
        .await?;
    match geometry::from_pods(&list.items, md) {
        Some(Ok(g)) => Ok(Ok(g)),
        Some(Err(e)) => Ok(Err(PlanOutcome::Refused {
            reason: "InspectionFailed",
            message: format!("job {name} printed no geometry: {e}"),
        })),
        None => pending(format!(
            "job {name} succeeded; its termination message is not visible yet"
        )),
    }
}

/// Applies the shared disk tier's claim, if the spec has one. A change the
/// API server refuses (a claim's spec is immutable but for a larger size,
/// and that only where its storage class expands) is the plan's refusal,
/// with the API server's reason.
async fn apply_claim(
    md: &ModelDeployment,
    ctx: &Context,
    ns: &str,
) -> Result<Option<PlanOutcome>, Error> {
    let Some(claim) = kv_offload::claim(md)? else {
        return Ok(None);
    };
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
    match apply::<PersistentVolumeClaim>(&api, &claim).await {
        Ok(_) => Ok(None),
        Err(Error::Kube(kube::Error::Api(e))) if matches!(e.code, 403 | 422) => {
            let (reason, message) = kv_offload::claim_refusal(md, &e.message);
            Ok(Some(PlanOutcome::Refused { reason, message }))
        }
        Err(e) => Err(e),
    }
}

/// Applies every desired child; returns the Deployment as the server has it.
async fn apply_children(
    md: &ModelDeployment,
    plan: &plan::Planned,
    ctx: &Context,
    ns: &str,
) -> Result<Deployment, Error> {
    let d = desired(md, plan, &ctx.config)?;
    let client = &ctx.client;
    let deployment = apply(&Api::namespaced(client.clone(), ns), &d.deployment).await?;
    apply::<Service>(&Api::namespaced(client.clone(), ns), &d.service).await?;
    if let Some(pdb) = &d.pdb {
        apply::<PodDisruptionBudget>(&Api::namespaced(client.clone(), ns), pdb).await?;
    }
    if let Some(hpa) = &d.hpa {
        apply::<HorizontalPodAutoscaler>(&Api::namespaced(client.clone(), ns), hpa).await?;
    }
    if let Some(so) = &d.scaled_object {
        apply(&scaled_objects(client, ns), so).await?;
    }
    if let Some(pool) = &d.inference_pool {
        apply(&inference_pools(client, ns), pool).await?;
    }
    prune(md, &d, ctx, ns).await?;
    Ok(deployment)
}

fn scaled_objects(client: &Client, ns: &str) -> Api<DynamicObject> {
    let gvk = kube::api::GroupVersionKind::gvk("keda.sh", "v1alpha1", "ScaledObject");
    Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk))
}

fn inference_pools(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk(&inference_pool::gvk()),
    )
}

/// Deletes optional children the spec no longer asks for. Only a spec change
/// (a new generation) can make one stale, so steady state costs no calls.
async fn prune(md: &ModelDeployment, d: &Desired, ctx: &Context, ns: &str) -> Result<(), Error> {
    let observed = md.status.as_ref().and_then(|s| s.observed_generation);
    if observed.is_some() && observed == md.meta().generation {
        return Ok(());
    }
    let client = &ctx.client;
    let uid = md.uid().ok_or(Error::Missing("metadata.uid"))?;
    let name = md.name_any();
    if d.pdb.is_none() {
        delete_owned::<PodDisruptionBudget>(&Api::namespaced(client.clone(), ns), &name, &uid)
            .await?;
    }
    if d.hpa.is_none() {
        delete_owned::<HorizontalPodAutoscaler>(&Api::namespaced(client.clone(), ns), &name, &uid)
            .await?;
    }
    if d.scaled_object.is_none() {
        delete_owned(&scaled_objects(client, ns), &name, &uid).await?;
    }
    if d.inference_pool.is_none() {
        delete_owned(&inference_pools(client, ns), &name, &uid).await?;
    }
    if d.kv_cache_claim.is_none() {
        let claim = kv_offload::claim_name(md);
        delete_owned::<PersistentVolumeClaim>(&Api::namespaced(client.clone(), ns), &claim, &uid)
            .await?;
    }
    Ok(())
}

/// Deletes `name` if it exists and `uid` owns it (never a user's own object).
async fn delete_owned<K>(api: &Api<K>, name: &str, uid: &str) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let absent = |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.code == 404);
    let found = match api.get_opt(name).await {
        Ok(found) => found,
        // The kind itself may not be installed (KEDA, GAIE): nothing to prune.
        Err(e) if absent(&e) => None,
        Err(e) => return Err(e.into()),
    };
    let Some(obj) = found else {
        return Ok(());
    };
    if !obj.owner_references().iter().any(|o| o.uid == uid) {
        return Ok(());
    }
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(e) if absent(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Publishes one event about `md`.
pub async fn publish(
    ctx: &Context,
    md: &ModelDeployment,
    warning: bool,
    reason: String,
    note: String,
) -> Result<(), Error> {
    let event = Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason,
        note: Some(note.chars().take(1000).collect()),
        action: "Reconcile".into(),
        secondary: None,
    };
    ctx.recorder.publish(&event, &md.object_ref(&())).await?;
    Ok(())
}

fn key(md: &ModelDeployment) -> String {
    format!("{}/{}", md.namespace().unwrap_or_default(), md.name_any())
}

/// Seconds to wait after the `attempt`-th consecutive failure (5 s doubling, capped at 5 min).
pub fn backoff_seconds(attempt: u32) -> u64 {
    (5u64 << attempt.min(6)).min(300)
}

/// Requeues a failed object with exponential backoff.
pub fn error_policy(md: Arc<ModelDeployment>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.failed();
    let mut failures = ctx.failures.lock().expect("lock");
    let attempt = failures.entry(key(&md)).or_insert(0);
    let delay = backoff_seconds(*attempt);
    *attempt += 1;
    tracing::warn!(name = %md.name_any(), %error, delay, "reconcile failed");
    Action::requeue(Duration::from_secs(delay))
}

/// Runs the controller until shutdown. `node_changes` fires when what
/// planning reads from the nodes changed (every ModelDeployment re-plans).
pub async fn run(
    ctx: Arc<Context>,
    node_changes: impl futures::Stream<Item = ()> + Send + 'static,
) {
    let client = ctx.client.clone();
    let mds: Api<ModelDeployment> = Api::all(client.clone());
    Controller::new(mds, watcher::Config::default())
        .reconcile_all_on(node_changes)
        .owns(
            Api::<Deployment>::all(client.clone()),
            watcher::Config::default(),
        )
        .owns(
            Api::<Service>::all(client.clone()),
            watcher::Config::default(),
        )
        .owns(Api::<Job>::all(client.clone()), watcher::Config::default())
        .owns(
            Api::<PodDisruptionBudget>::all(client.clone()),
            watcher::Config::default(),
        )
        .owns(
            Api::<HorizontalPodAutoscaler>::all(client),
            watcher::Config::default(),
        )
        .trigger_backoff(TriggerBackoff::default())
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile loop");
            }
        })
        .await;
}

#[cfg(test)]
mod tests;
