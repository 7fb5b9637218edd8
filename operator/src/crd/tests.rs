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
        [
            "Model",
            "Replicas",
            "Ready",
            "Max Seqs",
            "KV Blocks",
            "Server KV",
            "Verified",
            "Age"
        ]
    );
    assert_eq!(crd.spec.names.short_names, Some(vec!["md".to_string()]));
}

#[test]
fn crd_carries_cel_rules_with_messages() {
    let yaml = crd_yaml();
    for needle in [
        "self.matches('^(hf://",
        MIN_ZERO_MESSAGE,
        "self.minReplicas <= self.maxReplicas",
        "model.source must be hf://org/name[@rev][/file]",
        "engine.memoryUtilization must be in (0, 1]",
        "without spec.accelerator",
        CPU_HOST_TIER_MESSAGE,
        DISK_VOLUME_MESSAGE,
        "kvCache.offload.disk.accessMode must be",
    ] {
        assert!(yaml.contains(needle), "missing {needle}");
    }
}

#[test]
fn the_committed_source_rule_is_the_shared_grammar() {
    // Read the rule back out of the committed YAML, as the API server gets it.
    let crd: serde_yaml::Value = serde_yaml::from_str(COMMITTED).unwrap();
    let source = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["model"]["properties"]["source"];
    let rule = source["x-kubernetes-validations"][0]["rule"]
        .as_str()
        .unwrap();
    assert_eq!(
        ferrox_source::pattern_of_cel_rule(rule).as_deref(),
        Some(ferrox_source::SPEC_PATTERN)
    );
    assert_eq!(
        source["x-kubernetes-validations"][0]["message"].as_str(),
        Some(SOURCE_MESSAGE)
    );
}

#[test]
fn defaults_fill_a_minimal_spec() {
    let spec: ModelDeploymentSpec = serde_json::from_value(serde_json::json!({
        "model": {"source": "hf://a/b"},
        "accelerator": {}
    }))
    .unwrap();
    assert_eq!(spec.model.served_name, None);
    assert_eq!(spec.engine.typical_seq_len, DEFAULT_TYPICAL_SEQ_LEN);
    assert_eq!(spec.replicas, 1);
    assert_eq!(spec.engine.block_size, 16);
    assert_eq!(spec.service.port, 8000);
    let acc = spec.accelerator.unwrap();
    assert_eq!(
        (acc.resource_name.as_str(), acc.count, acc.memory_per_device),
        ("nvidia.com/gpu", 1, None)
    );
}
