//! The objects a `ModelDeployment` should own, computed by pure functions.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DynamicObject, ObjectMeta};
use kube::{Resource, ResourceExt};

use crate::Error;
use crate::crd::{AutoscalingMode, ModelDeployment};
use crate::plan::Planned;
use crate::router::RouterService;

pub mod adapters;
pub mod autoscaler;
pub mod deployment;
pub mod inference_pool;
pub mod inspect_job;
pub mod kv_offload;
pub mod pdb;
pub mod service;
pub mod side_sources;

/// Port the server listens on inside the pod.
pub const SERVER_PORT: i32 = 8000;
/// Pods a rolling update starts beyond `replicas` (an old pod stops once
/// its replacement is Ready): each is one more server on a shared claim.
pub const MAX_SURGE: i32 = 1;
/// Where downloaded models are cached.
pub const MODEL_CACHE_DIR: &str = "/var/cache/ferrox";
/// Label naming the application.
pub const NAME_LABEL: &str = "app.kubernetes.io/name";
/// Label naming the ModelDeployment.
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";

/// Operator-wide settings the objects depend on.
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredConfig {
    /// ferrox-server image when the spec names none.
    pub default_image: String,
    /// The same for specs with accelerators (a `--features cuda` build).
    pub cuda_image: String,
    /// Prometheus the KEDA trigger queries.
    pub prometheus_address: String,
    /// ferrox-router's Service, when the chart deploys one (`status.url`,
    /// and KEDA's trigger on its waiting requests).
    pub router: Option<RouterService>,
}

impl Default for DesiredConfig {
    fn default() -> Self {
        DesiredConfig {
            default_image: "ferrox-server:0.1.0".into(),
            cuda_image: "ferrox-server:0.1.0-cuda".into(),
            prometheus_address: "http://prometheus.monitoring.svc:9090".into(),
            router: None,
        }
    }
}

/// Everything the reconciler applies for one planned ModelDeployment.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    /// The ferrox-server pods.
    pub deployment: Deployment,
    /// The Service in front of them.
    pub service: Service,
    /// Present when more than one replica may run.
    pub pdb: Option<PodDisruptionBudget>,
    /// Present in `hpa` mode.
    pub hpa: Option<HorizontalPodAutoscaler>,
    /// Present in `keda` mode.
    pub scaled_object: Option<DynamicObject>,
    /// Present when `spec.inferencePool` asks for one.
    pub inference_pool: Option<DynamicObject>,
    /// The disk KV tier's shared claim, when `kvCache.offload.disk` names
    /// a storage class.
    pub kv_cache_claim: Option<PersistentVolumeClaim>,
}

/// The objects `md` should own under `plan`.
pub fn desired(
    md: &ModelDeployment,
    plan: &Planned,
    config: &DesiredConfig,
) -> Result<Desired, Error> {
    let autoscaling = md.spec.autoscaling.as_ref().filter(|a| a.enabled);
    let mode = autoscaling.map(|a| a.mode);
    Ok(Desired {
        deployment: deployment::deployment(md, plan, config)?,
        service: service::service(md)?,
        pdb: (md.spec.replicas > 1).then(|| pdb::pdb(md)).transpose()?,
        hpa: match (mode, autoscaling) {
            (Some(AutoscalingMode::Hpa), Some(a)) => Some(autoscaler::hpa(md, a)?),
            _ => None,
        },
        scaled_object: match (mode, autoscaling) {
            (Some(AutoscalingMode::Keda), Some(a)) => {
                Some(autoscaler::scaled_object(md, a, config)?)
            }
            _ => None,
        },
        inference_pool: md
            .spec
            .inference_pool
            .as_ref()
            .map(|p| inference_pool::inference_pool(md, p))
            .transpose()?,
        kv_cache_claim: kv_offload::claim(md)?,
    })
}

/// Labels that select the server pods of `md`.
pub fn selector_labels(md: &ModelDeployment) -> BTreeMap<String, String> {
    BTreeMap::from([
        (NAME_LABEL.to_string(), "ferrox-server".to_string()),
        (INSTANCE_LABEL.to_string(), md.name_any()),
    ])
}

/// `selector_labels` as a label-selector string (for the scale subresource).
pub fn selector_string(md: &ModelDeployment) -> String {
    selector_labels(md)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Labels on every child object.
pub fn labels(md: &ModelDeployment) -> BTreeMap<String, String> {
    let mut labels = selector_labels(md);
    labels.insert(
        "app.kubernetes.io/managed-by".into(),
        "ferrox-operator".into(),
    );
    labels
}

/// Metadata of a child named `name`, owned by `md`.
pub fn child_meta(md: &ModelDeployment, name: String) -> Result<ObjectMeta, Error> {
    let owner = md
        .controller_owner_ref(&())
        .ok_or(Error::Missing("metadata.uid of the ModelDeployment"))?;
    Ok(ObjectMeta {
        name: Some(name),
        namespace: md.namespace(),
        labels: Some(labels(md)),
        owner_references: Some(vec![owner]),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, autoscaling, gpu_spec, md};
    use crate::plan::plan_offline;

    fn objects(spec: crate::crd::ModelDeploymentSpec) -> Desired {
        let md = md("llama", spec);
        let plan = plan_offline(&md.spec, &fixtures::llama3_8b()).unwrap();
        desired(&md, &plan, &DesiredConfig::default()).unwrap()
    }

    #[test]
    fn optional_children_follow_replicas_and_mode() {
        let with = |replicas, mode: Option<AutoscalingMode>| {
            let mut spec = gpu_spec(1, "80Gi");
            spec.replicas = replicas;
            spec.autoscaling = mode.map(|m| crate::crd::AutoscalingSpec {
                mode: m,
                ..autoscaling(1, 4)
            });
            let d = objects(spec);
            (d.pdb.is_some(), d.hpa.is_some(), d.scaled_object.is_some())
        };
        let cases = [
            (1, None, (false, false, false)),
            (2, None, (true, false, false)),
            (2, Some(AutoscalingMode::Builtin), (true, false, false)),
            (1, Some(AutoscalingMode::Hpa), (false, true, false)),
            (3, Some(AutoscalingMode::Keda), (true, false, true)),
        ];
        for (replicas, mode, want) in cases {
            assert_eq!(
                with(replicas, mode),
                want,
                "replicas {replicas} mode {mode:?}"
            );
        }
    }

    #[test]
    fn every_child_is_owned_by_the_model_deployment() {
        let mut spec = gpu_spec(1, "80Gi");
        spec.replicas = 2;
        spec.autoscaling = Some(crate::crd::AutoscalingSpec {
            mode: AutoscalingMode::Hpa,
            ..autoscaling(1, 4)
        });
        let d = objects(spec);
        let owners = [
            d.deployment.metadata.owner_references.clone(),
            d.service.metadata.owner_references.clone(),
            d.pdb.unwrap().metadata.owner_references,
            d.hpa.unwrap().metadata.owner_references,
        ];
        for refs in owners {
            let refs = refs.expect("owner references");
            assert_eq!(refs.len(), 1);
            assert_eq!(refs[0].kind, "ModelDeployment");
            assert_eq!(refs[0].uid, "uid-llama");
            assert_eq!(refs[0].controller, Some(true));
        }
    }

    #[test]
    fn selector_string_is_stable() {
        let md = md("llama", gpu_spec(1, "80Gi"));
        assert_eq!(
            selector_string(&md),
            "app.kubernetes.io/instance=llama,app.kubernetes.io/name=ferrox-server"
        );
    }

    #[test]
    fn children_need_a_stored_owner() {
        let mut md = md("llama", gpu_spec(1, "80Gi"));
        md.metadata.uid = None;
        assert!(child_meta(&md, "x".into()).is_err());
    }
}
