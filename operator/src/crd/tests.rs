//! The CRD: drift against the committed YAML, subresources, columns, CEL rules.

use super::*;

const COMMITTED: &str = include_str!("../../../crds/modeldeployment.yaml");

#[test]
fn committed_crd_matches_the_rust_types() {
    assert!(
        COMMITTED == crd_yaml(),
        "crds/modeldeployment.yaml is stale: run `cargo run -p ferrox-operator -- crdgen > crds/modeldeployment.yaml`"
    );
}

#[test]
fn crd_has_scale_status_and_columns() {
    let crd = ModelDeployment::crd();
    let version = &crd.spec.versions[0];
    let sub = version.subresources.as_ref().expect("subresources");
    assert!(sub.status.is_some());
    let scale = sub.scale.as_ref().expect("scale");
    assert_eq!(scale.spec_replicas_path, ".spec.replicas");
    assert_eq!(scale.status_replicas_path, ".status.replicas");
    assert_eq!(
        scale.label_selector_path.as_deref(),
        Some(".status.selector")
    );
    let columns: Vec<_> = version
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        columns,
        ["Model", "Replicas", "Ready", "Max Seqs", "KV Blocks", "Age"]
    );
    assert_eq!(crd.spec.names.short_names, Some(vec!["md".to_string()]));
}

#[test]
fn crd_carries_cel_rules_with_messages() {
    let yaml = crd_yaml();
    for needle in [
        SOURCE_PATTERN,
        "self.minReplicas <= self.maxReplicas",
        "model.source must be hf://org/name[@rev][/file]",
        "engine.memoryUtilization must be in (0, 1]",
        "without spec.accelerator",
    ] {
        assert!(yaml.contains(needle), "missing {needle}");
    }
}

#[test]
fn source_pattern_accepts_the_four_schemes_only() {
    // The same pattern is embedded in the CEL rule; this checks its intent.
    let cases = [
        ("hf://HuggingFaceTB/SmolLM2-135M-Instruct", true),
        ("hf://org/name@main", true),
        ("pvc://models/llama/8b", true),
        ("file:///models/smollm2.gguf", true),
        ("https://example.com/m.gguf", true),
        ("http://example.com/m.gguf", false),
        ("hf://justname", false),
        ("s3://bucket/key", false),
        ("file://relative", false),
    ];
    for (source, ok) in cases {
        assert_eq!(
            crate::source::ModelSource::parse(source).is_ok(),
            ok,
            "{source}"
        );
    }
}

#[test]
fn defaults_fill_a_minimal_spec() {
    let spec: ModelDeploymentSpec = serde_json::from_value(serde_json::json!({
        "model": {"source": "hf://a/b", "servedName": "b"},
        "accelerator": {"memoryPerDevice": "80Gi"}
    }))
    .unwrap();
    assert_eq!(spec.replicas, 1);
    assert_eq!(spec.engine.block_size, 16);
    assert_eq!(spec.service.port, 8000);
    let acc = spec.accelerator.unwrap();
    assert_eq!(
        (acc.resource_name.as_str(), acc.count),
        ("nvidia.com/gpu", 1)
    );
}
