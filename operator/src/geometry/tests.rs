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
    let mut md = md("m", gpu_spec(1, "80Gi"));
    md.spec.model.source = "hf://a/b".into();
    assert!(from_pods(&[terminated(1, "boom")], &md).is_none());
    let got = from_pods(&[terminated(1, "boom"), terminated(0, INSPECT)], &md)
        .unwrap()
        .unwrap();
    assert_eq!(got.source, "hf://a/b");
    assert_eq!(held_on(&got, DeviceKind::Cpu), smollm2_shaped());
    assert!(from_pods(&[terminated(0, "{bad")], &md).unwrap().is_err());
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
        draft: None,
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

fn drafted(md: &mut crate::crd::ModelDeployment, draft: &str) {
    md.spec.speculative = Some(fixtures::draft(draft));
}

#[test]
fn a_named_draft_is_known_only_once_its_geometry_is() {
    let mut md = md("m", gpu_spec(1, "80Gi"));
    md.spec.model.geometry = Some(GeometrySpec::from(&fixtures::llama3_8b()));
    assert!(known(&md).is_some());
    drafted(&mut md, "pvc://models/draft.gguf");
    // The model's geometry is given, the draft's is not: inspect.
    assert!(known(&md).is_none());
    // The inspection prints the model's line, then the draft's.
    let json = format!("{INSPECT_DEVICES}\n{INSPECT}\n");
    let g = from_pods(&[terminated(0, &json)], &md).unwrap().unwrap();
    assert_eq!(g.source, FROM_SPEC, "the spec's model geometry wins");
    let offline = from_inspection(&md, &json).unwrap();
    assert_eq!(offline.source, md.spec.model.source, "the inspection's");
    assert_eq!(offline.draft, g.draft);
    let d = g.draft.clone().unwrap();
    assert_eq!(d.source, "pvc://models/draft.gguf");
    // Recorded, it is known; another draft source is not.
    md.status = Some(ModelDeploymentStatus {
        geometry: Some(g.clone()),
        ..Default::default()
    });
    assert_eq!(known(&md), Some(g));
    drafted(&mut md, "pvc://models/other.gguf");
    assert!(known(&md).is_none());
    // Without the draft's line, the inspection is refused, naming it.
    let err = from_inspection(&md, INSPECT).unwrap_err().to_string();
    assert!(err.contains("draft"), "{err}");
    // The spec's draft geometry needs no inspection.
    let spec = md.spec.speculative.as_mut().unwrap();
    spec.draft_geometry = Some(GeometrySpec::from(&smollm2_shaped()));
    assert_eq!(known(&md).unwrap().draft.unwrap().source, FROM_SPEC);
}

#[test]
fn a_draft_plans_its_weights_as_held_and_its_kv_in_the_target_s_dtype() {
    let line = parse_inspect(INSPECT_DEVICES).unwrap();
    let d = observed_draft("hf://a/draft", &line);
    let smol = smollm2_shaped();
    let per_token = |dtype: KvDtype| {
        ModelGeometry {
            kv_dtype: dtype,
            ..smol.clone()
        }
        .kv_bytes_per_token()
    };
    let cuda = draft_plan(&d, DeviceKind::Cuda, KvDtype::F32);
    assert_eq!(cuda.weight_bytes, 270_000_000);
    assert_eq!(cuda.kv_bytes_per_token, per_token(KvDtype::F32));
    let cpu = draft_plan(&d, DeviceKind::Cpu, KvDtype::F16);
    assert_eq!(cpu.weight_bytes, 98_362_432);
    assert_eq!(cpu.kv_bytes_per_token, per_token(KvDtype::F16));
    assert_eq!(cpu.kv_bytes_per_token, 23040);
}
