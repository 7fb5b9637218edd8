//! Where a plan's geometry comes from: the spec, a past inspection recorded in
//! status, or the termination message of an inspection pod.

use ferrox_plan::{DeviceKind, Footprint, Footprints, ModelGeometry, Task};
use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;

use crate::Error;
use crate::crd::{
    DeviceFootprints, FootprintStatus, GeometrySpec, ModelDeployment, ObservedGeometry,
};

/// `ferrox-server inspect --json`: the geometry (top-level weight bytes and
/// KV dtype are the CPU figures) and, from newer servers, every device's.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Inspected {
    /// The shape facts.
    #[serde(flatten)]
    pub geometry: ModelGeometry,
    /// How the model is held on each device kind.
    #[serde(default)]
    pub devices: Option<Footprints>,
    /// What the model's files say it serves (absent from older servers).
    #[serde(default)]
    pub task: Option<Task>,
}

/// `status.geometry.source` when the geometry came from the spec.
pub const FROM_SPEC: &str = "spec";

/// The geometry already known for `md`'s current spec, if any.
pub fn known(md: &ModelDeployment) -> Option<ObservedGeometry> {
    if let Some(g) = &md.spec.model.geometry {
        return Some(ObservedGeometry {
            source: FROM_SPEC.into(),
            geometry: g.clone(),
            devices: None,
            task: None,
        });
    }
    md.status
        .as_ref()
        .and_then(|s| s.geometry.clone())
        .filter(|g| g.source == md.spec.model.source)
}

/// Parses `ferrox-server inspect --json` output (extra fields are ignored).
pub fn parse_inspect(json: &str) -> Result<Inspected, Error> {
    let line = json
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with('{'))
        .ok_or(Error::Missing("a JSON line in the inspect output"))?;
    Ok(serde_json::from_str(line)?)
}

/// An inspection as status records it.
pub fn observed(source: &str, inspected: &Inspected) -> ObservedGeometry {
    ObservedGeometry {
        source: source.to_string(),
        geometry: GeometrySpec::from(&inspected.geometry),
        devices: inspected.devices.as_ref().map(|d| DeviceFootprints {
            cpu: footprint_status(&d.cpu),
            cuda: footprint_status(&d.cuda),
        }),
        task: inspected.task,
    }
}

/// The geometry to plan with on `device`: the inspected device's weights and
/// KV dtype when known, else the recorded (or spec's) figures as given.
pub fn held_on(g: &ObservedGeometry, device: DeviceKind) -> ModelGeometry {
    let base = g.geometry.for_device(device);
    match &g.devices {
        Some(d) => base.held_as(&to_footprint(match device {
            DeviceKind::Cpu => &d.cpu,
            DeviceKind::Cuda => &d.cuda,
        })),
        None => base,
    }
}

/// `g` with its numbers replaced by those planned with on `device`.
pub fn as_planned(g: &ObservedGeometry, device: DeviceKind) -> ObservedGeometry {
    ObservedGeometry {
        geometry: GeometrySpec::from(&held_on(g, device)),
        ..g.clone()
    }
}

fn footprint_status(f: &Footprint) -> FootprintStatus {
    let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    FootprintStatus {
        weight_bytes: n(f.weight_bytes),
        kv_dtype: f.kv_dtype,
        kv_bytes_per_token: n(f.kv_bytes_per_token),
    }
}

fn to_footprint(f: &FootprintStatus) -> Footprint {
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    Footprint {
        weight_bytes: n(f.weight_bytes),
        kv_dtype: f.kv_dtype,
        kv_bytes_per_token: n(f.kv_bytes_per_token),
    }
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
    Some(parse_inspect(&message).map(|i| observed(source, &i)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::ModelDeploymentStatus;
    use crate::fixtures::{self, gpu_spec, md};
    use ferrox_plan::KvDtype;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStatus, PodStatus,
    };

    const INSPECT: &str = r#"{"architecture":"llama","layers":30,"kvHeads":3,"headDim":64,"kvDtype":"f32","weightBytes":98362432,"contextLength":8192,"hiddenSize":576,"heads":9,"vocabSize":49152,"intermediateSize":1536}"#;
    const INSPECT_DEVICES: &str = r#"{"architecture":"llama","layers":30,"kvHeads":3,"headDim":64,"kvDtype":"f16","weightBytes":98362432,"contextLength":8192,"hiddenSize":576,"heads":9,"vocabSize":49152,"intermediateSize":1536,"devices":{"cpu":{"weightBytes":98362432,"kvDtype":"f16","kvBytesPerToken":23040},"cuda":{"weightBytes":270000000,"kvDtype":"bf16","kvBytesPerToken":23040}}}"#;

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

    fn smollm2_shaped() -> ModelGeometry {
        ModelGeometry {
            heads: 9,
            hidden_size: 576,
            intermediate_size: 1536,
            vocab_size: 49152,
            ..fixtures::smollm2_135m()
        }
    }

    #[test]
    fn inspect_output_parses_to_geometry() {
        let want = smollm2_shaped();
        assert_eq!(parse_inspect(INSPECT).unwrap().geometry, want);
        assert_eq!(parse_inspect(INSPECT).unwrap().devices, None);
        // An older server's inspection says no task: the plan generates.
        assert_eq!(parse_inspect(INSPECT).unwrap().task, None);
        let embedder = INSPECT.replace('}', r#","task":"embed"}"#);
        let g = observed("hf://a/b", &parse_inspect(&embedder).unwrap());
        assert_eq!(g.task, Some(Task::Embed));
        assert_eq!(as_planned(&g, DeviceKind::Cpu).task, Some(Task::Embed));
        assert_eq!(
            parse_inspect(&format!("loading...\n{INSPECT}\n"))
                .unwrap()
                .geometry,
            want
        );
        assert!(parse_inspect("no json here").is_err());
    }

    #[test]
    fn each_device_plans_with_its_own_footprint() {
        let g = observed("hf://a/b", &parse_inspect(INSPECT_DEVICES).unwrap());
        let cases = [
            (DeviceKind::Cpu, 98_362_432, KvDtype::F16),
            (DeviceKind::Cuda, 270_000_000, KvDtype::Bf16),
        ];
        for (device, weights, dtype) in cases {
            let held = held_on(&g, device);
            assert_eq!(
                (held.weight_bytes, held.kv_dtype),
                (weights, dtype),
                "{device}"
            );
            assert_eq!(held.layers, 30);
            // The status records what was planned with, and keeps the devices.
            let recorded = as_planned(&g, device);
            assert_eq!(recorded.geometry.facts.weight_bytes, weights);
            assert_eq!(held_on(&recorded, device), held);
        }
        // Without `devices` (an older server, or the spec) the figures are used as given.
        let old = observed("hf://a/b", &parse_inspect(INSPECT).unwrap());
        assert_eq!(held_on(&old, DeviceKind::Cuda), smollm2_shaped());
    }

    #[test]
    fn an_inspection_with_sliding_windows_plans_and_records_them() {
        // `inspect --json` of a Gemma-3-shaped model (abridged).
        let json = r#"{"architecture":"gemma3","layers":34,"kvHeads":4,"headDim":256,"kvDtype":"f16","weightBytes":7760000000,"contextLength":131072,"slidingWindows":[{"window":1024,"layers":29}],"kvGroups":[{"window":null,"layers":[5,11,17,23,29]},{"window":1024,"layers":[0,1,2,3,4]}]}"#;
        let g = observed("hf://google/gemma-3-4b-it", &parse_inspect(json).unwrap());
        let windows = g.geometry.facts.sliding_windows.clone();
        assert_eq!((windows[0].window, windows[0].layers), (1024, 29));
        let held = held_on(&g, DeviceKind::Cuda);
        assert_eq!(held.full_layers(), 5);
        assert_eq!(held.cache_groups().len(), 2);
        assert_eq!(
            as_planned(&g, DeviceKind::Cuda)
                .geometry
                .facts
                .sliding_windows,
            windows
        );
    }

    #[test]
    fn only_a_successful_pod_reports() {
        let src = "hf://a/b";
        assert!(from_pods(&[terminated(1, "boom")], src).is_none());
        let got = from_pods(&[terminated(1, "boom"), terminated(0, INSPECT)], src)
            .unwrap()
            .unwrap();
        assert_eq!(got.source, src);
        assert_eq!(held_on(&got, DeviceKind::Cpu), smollm2_shaped());
        assert!(from_pods(&[terminated(0, "{bad")], src).unwrap().is_err());
    }

    #[test]
    fn recorded_geometry_counts_only_for_the_same_source() {
        let mut md = md("m", gpu_spec(1, "80Gi"));
        assert!(known(&md).is_none());
        let recorded = ObservedGeometry {
            source: md.spec.model.source.clone(),
            geometry: GeometrySpec::from(&fixtures::llama3_8b()),
            devices: None,
            task: None,
        };
        md.status = Some(ModelDeploymentStatus {
            geometry: Some(recorded.clone()),
            ..Default::default()
        });
        assert_eq!(known(&md), Some(recorded));
        md.spec.model.source = "hf://org/other".into();
        assert!(known(&md).is_none());
        md.spec.model.geometry = Some(GeometrySpec::from(&fixtures::llama3_8b()));
        assert_eq!(known(&md).unwrap().source, FROM_SPEC);
    }

    #[test]
    fn a_spec_without_a_kv_dtype_plans_with_the_devices_auto_and_records_it() {
        let mut spec = GeometrySpec::from(&fixtures::llama3_8b());
        spec.kv_dtype = None;
        let mut md = fixtures::md("m", fixtures::gpu_spec(1, "80Gi"));
        md.spec.model.geometry = Some(spec);
        let g = known(&md).unwrap();
        for (device, want) in [
            (DeviceKind::Cpu, KvDtype::F16),
            (DeviceKind::Cuda, KvDtype::Bf16),
        ] {
            assert_eq!(held_on(&g, device).kv_dtype, want, "{device}");
            let recorded = as_planned(&g, device).geometry.kv_dtype;
            assert_eq!(recorded, Some(want), "{device}");
        }
    }
}
