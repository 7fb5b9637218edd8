//! External autoscalers (`hpa`, `keda` modes), both aimed at the
//! ModelDeployment's scale subresource so that `spec.replicas` stays the one
//! source of the Deployment's replica count.

use k8s_openapi::api::autoscaling::v2::{
    CrossVersionObjectReference, HPAScalingRules, HorizontalPodAutoscaler,
    HorizontalPodAutoscalerBehavior, HorizontalPodAutoscalerSpec, MetricIdentifier, MetricSpec,
    MetricTarget, PodsMetricSource,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::{DesiredConfig, INSTANCE_LABEL, child_meta};
use crate::Error;
use crate::crd::{AutoscalingSpec, ModelDeployment};
use crate::served_name::served_name;

/// The queue-depth series both external autoscalers scale on.
pub const QUEUE_METRIC: &str = ferrox_plan::contract::metric::WAITING;
/// ferrox-router's waiting requests, KEDA's trigger from zero.
pub const PENDING_METRIC: &str = ferrox_plan::contract::router::PENDING_METRIC;

fn target_ref(md: &ModelDeployment) -> CrossVersionObjectReference {
    CrossVersionObjectReference {
        api_version: Some(ModelDeployment::api_version(&()).into_owned()),
        kind: ModelDeployment::kind(&()).into_owned(),
        name: md.name_any(),
    }
}

/// An autoscaling/v2 HPA on the mean `ferrox_requests_waiting` per pod.
pub fn hpa(md: &ModelDeployment, a: &AutoscalingSpec) -> Result<HorizontalPodAutoscaler, Error> {
    let window = |s: i64| {
        Some(HPAScalingRules {
            stabilization_window_seconds: Some(s.clamp(0, 3600) as i32),
            ..Default::default()
        })
    };
    Ok(HorizontalPodAutoscaler {
        metadata: child_meta(md, md.name_any())?,
        spec: Some(HorizontalPodAutoscalerSpec {
            scale_target_ref: target_ref(md),
            min_replicas: Some(a.min_replicas.max(1)),
            max_replicas: a.max_replicas,
            metrics: Some(vec![MetricSpec {
                type_: "Pods".into(),
                pods: Some(PodsMetricSource {
                    metric: MetricIdentifier {
                        name: QUEUE_METRIC.into(),
                        selector: None,
                    },
                    target: MetricTarget {
                        type_: "AverageValue".into(),
                        average_value: Some(Quantity(format_quantity(a.target_queue_per_replica))),
                        ..Default::default()
                    },
                }),
                ..Default::default()
            }]),
            behavior: Some(HorizontalPodAutoscalerBehavior {
                scale_up: window(a.scale_up_stabilization_seconds),
                scale_down: window(a.scale_down_delay_seconds),
            }),
        }),
        status: None,
    })
}

/// A KEDA ScaledObject with a Prometheus trigger on the summed queue and,
/// when a router is known, one on its waiting requests for this model: the
/// servers export nothing at zero replicas, the router does, and KEDA
/// activates (0 -> 1) when that trigger is over its activation threshold 0.
pub fn scaled_object(
    md: &ModelDeployment,
    a: &AutoscalingSpec,
    config: &DesiredConfig,
) -> Result<DynamicObject, Error> {
    let gvk = GroupVersionKind::gvk("keda.sh", "v1alpha1", "ScaledObject");
    let mut obj = DynamicObject::new(&md.name_any(), &ApiResource::from_gvk(&gvk));
    obj.metadata = child_meta(md, md.name_any())?;
    let query = format!(
        "sum({QUEUE_METRIC}{{namespace=\"{}\",{}=\"{}\"}})",
        md.namespace().unwrap_or_default(),
        INSTANCE_LABEL.replace(['.', '/', '-'], "_"),
        md.name_any()
    );
    obj.data = json!({
        "spec": {
            "scaleTargetRef": {
                "apiVersion": ModelDeployment::api_version(&()),
                "kind": ModelDeployment::kind(&()),
                "name": md.name_any(),
            },
            "minReplicaCount": a.min_replicas,
            "maxReplicaCount": a.max_replicas,
            "cooldownPeriod": a.scale_down_delay_seconds,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                "scaleUp": {"stabilizationWindowSeconds": a.scale_up_stabilization_seconds},
                "scaleDown": {"stabilizationWindowSeconds": a.scale_down_delay_seconds},
            }}},
            "triggers": triggers(md, a, config, query),
        }
    });
    Ok(obj)
}

fn triggers(
    md: &ModelDeployment,
    a: &AutoscalingSpec,
    config: &DesiredConfig,
    queue: String,
) -> serde_json::Value {
    let threshold = format_quantity(a.target_queue_per_replica);
    let prometheus = |query: String| {
        json!({
            "type": "prometheus",
            "metadata": {
                "serverAddress": config.prometheus_address,
                "query": query,
                "threshold": threshold,
                "activationThreshold": "0",
            },
        })
    };
    let mut out = vec![prometheus(queue)];
    if config.router.is_some() {
        out.push(prometheus(format!(
            "sum({PENDING_METRIC}{{model=\"{}\"}}) or vector(0)",
            served_name(md)
        )));
    }
    json!(out)
}

/// A float as a short decimal Quantity string (`4`, `0.5`).
fn format_quantity(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{autoscaling, gpu_spec, md};

    #[test]
    fn hpa_targets_the_scale_subresource_on_queue_depth() {
        let md = md("llama", gpu_spec(1, "80Gi"));
        let hpa = hpa(&md, &autoscaling(1, 5)).unwrap();
        let spec = hpa.spec.unwrap();
        assert_eq!(spec.scale_target_ref.kind, "ModelDeployment");
        assert_eq!(
            spec.scale_target_ref.api_version.as_deref(),
            Some("ferrox.dev/v1alpha1")
        );
        assert_eq!(spec.max_replicas, 5);
        let pods = spec.metrics.unwrap()[0].pods.clone().unwrap();
        assert_eq!(pods.metric.name, QUEUE_METRIC);
        assert_eq!(pods.target.average_value, Some(Quantity("4".into())));
        assert_eq!(
            spec.behavior
                .unwrap()
                .scale_down
                .unwrap()
                .stabilization_window_seconds,
            Some(300)
        );
    }

    #[test]
    fn scaled_object_queries_this_deployments_queue() {
        let md = md("llama", gpu_spec(1, "80Gi"));
        let obj = scaled_object(&md, &autoscaling(0, 3), &DesiredConfig::default()).unwrap();
        assert_eq!(obj.types.as_ref().unwrap().kind, "ScaledObject");
        let trigger = &obj.data["spec"]["triggers"][0];
        assert_eq!(trigger["type"], "prometheus");
        assert_eq!(
            trigger["metadata"]["query"],
            "sum(ferrox_requests_waiting{namespace=\"default\",app_kubernetes_io_instance=\"llama\"})"
        );
        assert_eq!(obj.data["spec"]["minReplicaCount"], 0);
        assert_eq!(obj.data["spec"]["triggers"].as_array().unwrap().len(), 1);
        // With a router: its waiting line wakes the model from zero.
        let config = DesiredConfig {
            router: Some(crate::router::RouterService::parse("ferrox/ferrox-router").unwrap()),
            ..DesiredConfig::default()
        };
        let obj = scaled_object(&md, &autoscaling(0, 3), &config).unwrap();
        let pending = &obj.data["spec"]["triggers"][1]["metadata"];
        assert_eq!(
            pending["query"],
            "sum(ferrox_router_pending_requests{model=\"model\"}) or vector(0)"
        );
        assert_eq!(pending["activationThreshold"], "0");
    }

    #[test]
    fn quantities_are_short() {
        for (v, s) in [(4.0, "4"), (0.5, "0.5"), (2.25, "2.25")] {
            assert_eq!(format_quantity(v), s);
        }
    }
}
