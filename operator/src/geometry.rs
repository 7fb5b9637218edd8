//! Where a plan's geometry comes from: the spec, a past inspection recorded in
//! status, or the termination message of an inspection pod.

use ferrox_plan::ModelGeometry;
use k8s_openapi::api::core::v1::Pod;

use crate::Error;
use crate::crd::{ModelDeployment, ObservedGeometry};
use crate::plan::{from_geometry, to_geometry};

/// `status.geometry.source` when the geometry came from the spec.
pub const FROM_SPEC: &str = "spec";

/// The geometry already known for `md`'s current spec, if any.
pub fn known(md: &ModelDeployment) -> Option<ObservedGeometry> {
    if let Some(g) = &md.spec.model.geometry {
        return Some(ObservedGeometry {
            source: FROM_SPEC.into(),
            geometry: g.clone(),
        });
    }
    md.status
        .as_ref()
        .and_then(|s| s.geometry.clone())
        .filter(|g| g.source == md.spec.model.source)
}

/// Parses `ferrox-server inspect --json` output (extra fields are ignored).
pub fn parse_inspect(json: &str) -> Result<ModelGeometry, Error> {
    let line = json
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with('{'))
        .ok_or(Error::Missing("a JSON line in the inspect output"))?;
    let geometry: ModelGeometry = serde_json::from_str(line)?;
    Ok(geometry)
}

/// The geometry a successful inspection pod reported, if one did.
pub fn from_pods(pods: &[Pod], source: &str) -> Option<Result<ObservedGeometry, Error>> {
    let message = pods.iter().find_map(|pod| {
        let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
        statuses.iter().find_map(|cs| {
            let t = cs.state.as_ref()?.terminated.as_ref()?;
            (t.exit_code == 0).then(|| t.message.clone()).flatten()
        })
    })?;
    Some(parse_inspect(&message).map(|g| ObservedGeometry {
        source: source.to_string(),
        geometry: from_geometry(&g),
    }))
}

/// ferrox-plan's geometry from a recorded one.
pub fn to_plan_geometry(g: &ObservedGeometry) -> ModelGeometry {
    to_geometry(&g.geometry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::ModelDeploymentStatus;
    use crate::fixtures::{self, gpu_spec, md};
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStatus, PodStatus,
    };

    const INSPECT: &str = r#"{"architecture":"llama","layers":30,"kvHeads":3,"headDim":64,"kvDtype":"f32","weightBytes":98362432,"contextLength":8192,"hiddenSize":576,"heads":9,"vocabSize":49152,"intermediateSize":1536}"#;

    fn terminated(exit_code: i32, message: &str) -> Pod {
        Pod {
            status: Some(PodStatus {
                container_statuses: Some(vec![ContainerStatus {
                    name: "inspect".into(),
                    state: Some(ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            exit_code,
                            message: Some(message.into()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn inspect_output_parses_to_geometry() {
        let want = ModelGeometry {
            heads: 9,
            hidden_size: 576,
            intermediate_size: 1536,
            vocab_size: 49152,
            ..fixtures::smollm2_135m()
        };
        assert_eq!(parse_inspect(INSPECT).unwrap(), want);
        assert_eq!(
            parse_inspect(&format!("loading...\n{INSPECT}\n")).unwrap(),
            want
        );
        assert!(parse_inspect("no json here").is_err());
    }

    #[test]
    fn only_a_successful_pod_reports() {
        let src = "hf://a/b";
        assert!(from_pods(&[terminated(1, "boom")], src).is_none());
        let got = from_pods(&[terminated(1, "boom"), terminated(0, INSPECT)], src)
            .unwrap()
            .unwrap();
        assert_eq!(got.source, src);
        assert_eq!(to_plan_geometry(&got), fixtures::smollm2_135m());
        assert!(from_pods(&[terminated(0, "{bad")], src).unwrap().is_err());
    }

    #[test]
    fn recorded_geometry_counts_only_for_the_same_source() {
        let mut md = md("m", gpu_spec(1, "80Gi"));
        assert!(known(&md).is_none());
        let recorded = ObservedGeometry {
            source: md.spec.model.source.clone(),
            geometry: from_geometry(&fixtures::llama3_8b()),
        };
        md.status = Some(ModelDeploymentStatus {
            geometry: Some(recorded.clone()),
            ..Default::default()
        });
        assert_eq!(known(&md), Some(recorded));
        md.spec.model.source = "hf://org/other".into();
        assert!(known(&md).is_none());
        md.spec.model.geometry = Some(from_geometry(&fixtures::llama3_8b()));
        assert_eq!(known(&md).unwrap().source, FROM_SPEC);
    }
}
