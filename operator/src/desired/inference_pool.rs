//! The Gateway API Inference Extension `InferencePool` over the server pods:
//! a GAIE-enabled gateway then routes on their vLLM-named gauges.

use kube::ResourceExt;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::json;

use super::{SERVER_PORT, child_meta, selector_labels};
use crate::Error;
use crate::crd::{InferencePoolSpec, ModelDeployment};

/// The InferencePool kind.
pub fn gvk() -> GroupVersionKind {
    GroupVersionKind::gvk("inference.networking.k8s.io", "v1", "InferencePool")
}

/// The InferencePool selecting `md`'s pods on the server port.
pub fn inference_pool(
    md: &ModelDeployment,
    pool: &InferencePoolSpec,
) -> Result<DynamicObject, Error> {
    let mut obj = DynamicObject::new(&md.name_any(), &ApiResource::from_gvk(&gvk()));
    obj.metadata = child_meta(md, md.name_any())?;
    let epp = &pool.endpoint_picker;
    obj.data = json!({
        "spec": {
            "selector": {"matchLabels": selector_labels(md)},
            "targetPorts": [{"number": SERVER_PORT}],
            "endpointPickerRef": {
                "kind": "Service",
                "name": epp.name,
                "port": {"number": epp.port},
                "failureMode": epp.failure_mode,
            },
        }
    });
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::EndpointPickerSpec;
    use crate::fixtures::{gpu_spec, md};

    #[test]
    fn the_pool_selects_the_pods_and_names_the_picker() {
        let md = md("llama", gpu_spec(1, "80Gi"));
        let pool = InferencePoolSpec {
            endpoint_picker: EndpointPickerSpec {
                name: "llama-epp".into(),
                port: 9002,
                failure_mode: "FailOpen".into(),
            },
        };
        let obj = inference_pool(&md, &pool).unwrap();
        let types = obj.types.as_ref().unwrap();
        assert_eq!(
            (types.api_version.as_str(), types.kind.as_str()),
            ("inference.networking.k8s.io/v1", "InferencePool")
        );
        let spec = &obj.data["spec"];
        assert_eq!(
            spec["selector"]["matchLabels"]["app.kubernetes.io/instance"],
            "llama"
        );
        assert_eq!(spec["targetPorts"][0]["number"], SERVER_PORT);
        assert_eq!(spec["endpointPickerRef"]["name"], "llama-epp");
        assert_eq!(spec["endpointPickerRef"]["port"]["number"], 9002);
        assert_eq!(spec["endpointPickerRef"]["failureMode"], "FailOpen");
        assert_eq!(
            obj.metadata.owner_references.unwrap()[0].kind,
            "ModelDeployment"
        );
    }
}
