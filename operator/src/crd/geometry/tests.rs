//! `GeometrySpec`: ferrox-plan's geometry on the CRD's wire and in its schema.

use ferrox_plan::SlidingWindow;
use kube::CustomResourceExt;
use serde_json::json;

use super::*;
use crate::crd::ModelDeployment;
use crate::fixtures;

#[test]
fn geometry_round_trips() {
    let g = ModelGeometry {
        heads: 32,
        hidden_size: 4096,
        intermediate_size: 14_336,
        vocab_size: 128_256,
        params: 8_030_261_248,
        active_params: 8_030_261_248,
        ..fixtures::llama3_8b()
    };
    for device in [DeviceKind::Cpu, DeviceKind::Cuda] {
        assert_eq!(GeometrySpec::from(&g).for_device(device), g);
        assert_eq!(
            GeometrySpec::from(&fixtures::llama3_8b()).for_device(device),
            fixtures::llama3_8b()
        );
    }
}

#[test]
fn an_absent_kv_dtype_is_the_servers_auto_on_the_device() {
    let mut spec = GeometrySpec::from(&fixtures::llama3_8b());
    spec.kv_dtype = None;
    // (device, KV dtype planned, bytes per token)
    let cases = [
        (DeviceKind::Cpu, KvDtype::F16),
        (DeviceKind::Cuda, KvDtype::Bf16),
    ];
    for (device, want) in cases {
        let g = spec.for_device(device);
        assert_eq!(g.kv_dtype, want, "{device}");
        assert_eq!(g.kv_bytes_per_token(), 2 * 32 * 8 * 128 * 2);
    }
    // Given, it is used as given on either device.
    spec.kv_dtype = Some(KvDtype::F32);
    assert_eq!(spec.for_device(DeviceKind::Cuda).kv_dtype, KvDtype::F32);
}

#[test]
fn the_wire_is_the_crds_own_absent_stays_absent() {
    // As the examples write it: no kvDtype, no unknown counts.
    let written = json!({
        "layers": 30, "kvHeads": 3, "headDim": 64, "weightBytes": 96_576_768,
        "contextLength": 8192, "heads": 9, "vocabSize": 49152,
        "slidingWindows": [{"window": 1024, "layers": 29}],
    });
    let spec: GeometrySpec = serde_json::from_value(written.clone()).unwrap();
    assert_eq!(spec.kv_dtype, None);
    assert_eq!(spec.facts.hidden_size, 0, "absent: unknown");
    assert_eq!(
        spec.facts.sliding_windows,
        [SlidingWindow {
            window: 1024,
            layers: 29
        }]
    );
    assert_eq!(
        serde_json::to_value(&spec).unwrap(),
        written,
        "written back as read"
    );
    // A null KV dtype is an absent one; a given one is read and written back.
    let mut null = written.clone();
    null["kvDtype"] = Value::Null;
    assert_eq!(serde_json::from_value::<GeometrySpec>(null).unwrap(), spec);
    let mut bf16 = written;
    bf16["kvDtype"] = json!("bf16");
    let given: GeometrySpec = serde_json::from_value(bf16.clone()).unwrap();
    assert_eq!(given.kv_dtype, Some(KvDtype::Bf16));
    assert_eq!(serde_json::to_value(&given).unwrap(), bf16);
}

#[test]
fn equal_geometries_compare_equal_however_they_were_made() {
    // Status written from an inspection and read back from the API server.
    let made = GeometrySpec::from(&fixtures::llama3_8b());
    let read: GeometrySpec = serde_json::from_value(serde_json::to_value(&made).unwrap()).unwrap();
    assert_eq!(read, made);
    assert_eq!(made.facts.kv_dtype, KvDtype::default(), "not read");
}

/// `spec.model.geometry`'s schema in the generated CRD.
fn crd_geometry_schema() -> Value {
    let crd = serde_json::to_value(ModelDeployment::crd()).unwrap();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["model"]["properties"]["geometry"]
        .clone()
}

#[test]
fn the_schema_is_the_geometry_s_as_kubernetes_reads_it() {
    let schema = crd_geometry_schema();
    let properties = schema["properties"].as_object().unwrap();
    // Every field of ModelGeometry, under its own name.
    let facts = serde_json::to_value(ModelGeometry {
        sliding_windows: vec![SlidingWindow {
            window: 1,
            layers: 1,
        }],
        ..fixtures::llama3_8b()
    })
    .unwrap();
    for field in facts.as_object().unwrap().keys() {
        assert!(properties.contains_key(field), "{field} missing");
    }
    assert_eq!(
        schema["required"],
        json!([
            "contextLength",
            "headDim",
            "kvHeads",
            "layers",
            "weightBytes"
        ])
    );
    for required in ["layers", "kvHeads", "headDim", "contextLength"] {
        assert_eq!(
            properties[required]["minimum"].as_f64(),
            Some(1.0),
            "{required}"
        );
    }
    // The API server knows int64, not uint64, and must default nothing:
    // an absent kvDtype is decided by the pods' device.
    let text = schema.to_string();
    assert!(!text.contains("uint"), "{text}");
    assert!(!text.contains("\"default\""), "{text}");
    let windows = &properties["slidingWindows"]["items"]["properties"]["window"];
    assert_eq!(windows["format"], "int64");
    assert_eq!(properties["kvDtype"]["nullable"], true);
    assert_eq!(
        schema["x-kubernetes-validations"],
        json!([
            {"rule": FP8_RULE, "message": FP8_MESSAGE},
            {"rule": SHARED_RULE, "message": SHARED_MESSAGE},
            {"rule": LATENT_RULE, "message": LATENT_MESSAGE},
        ])
    );
}

/// Each rule reads only fields the schema has and names in its message
/// the fields it refuses.
#[test]
fn the_kv_kind_rules_name_their_fields() {
    let schema = crd_geometry_schema();
    let properties = schema["properties"].as_object().unwrap();
    let cases = [
        (SHARED_RULE, SHARED_MESSAGE, &["kvSharedLayers"][..]),
        (
            LATENT_RULE,
            LATENT_MESSAGE,
            &["fullKvHeads", "fullHeadDim", "kvLatentDim"][..],
        ),
    ];
    for (rule, message, fields) in cases {
        for field in fields {
            assert!(properties.contains_key(*field), "{field}");
            assert!(rule.contains(&format!("self.{field}")), "{rule}");
            assert!(message.contains(&format!("geometry.{field}")), "{message}");
        }
    }
    for field in ["fullKvHeads", "fullHeadDim", "kvSharedLayers"] {
        assert_eq!(properties[field]["format"], "int64", "{field}");
        assert!(!schema["required"].to_string().contains(field), "{field}");
    }
}

#[test]
fn gemma4_s_kinds_round_trip_on_the_wire() {
    // Gemma 4 31B as a spec writes it.
    let written = json!({
        "layers": 60, "kvHeads": 16, "headDim": 256, "fullKvHeads": 4, "fullHeadDim": 512,
        "weightBytes": 61_400_000_000_u64, "contextLength": 262_144,
        "slidingWindows": [{"window": 1024, "layers": 50}],
    });
    let spec: GeometrySpec = serde_json::from_value(written.clone()).unwrap();
    assert_eq!(
        (spec.facts.full_kv_heads, spec.facts.full_head_dim),
        (4, 512)
    );
    assert_eq!(spec.facts.kv_shared_layers, 0, "absent: none");
    assert_eq!(serde_json::to_value(&spec).unwrap(), written);
    let mut e4b = written;
    e4b["kvSharedLayers"] = json!(18);
    let spec: GeometrySpec = serde_json::from_value(e4b.clone()).unwrap();
    assert_eq!(spec.facts.kv_shared_layers, 18);
    assert_eq!(serde_json::to_value(&spec).unwrap(), e4b);
}
