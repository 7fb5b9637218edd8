//! Planning against node sets, table by table.

use super::*;
use crate::fixtures::{gpu_node, gpu_spec, gpu_toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

const H100: &str = "NVIDIA-H100-80GB-HBM3";
const L4: &str = "NVIDIA-L4";

fn cluster() -> Vec<Node> {
    vec![
        gpu_node("h100-a", H100, 81_559, 8),
        gpu_node("h100-b", H100, 81_559, 8),
        gpu_node("l4-a", L4, 23_034, 4),
    ]
}

/// A GPU spec with no memory override, tolerating the GPU taint.
fn spec(product: Option<&str>, count: i32) -> ModelDeploymentSpec {
    let mut s = gpu_spec(count, "1Gi");
    let acc = s.accelerator.as_mut().unwrap();
    acc.memory_per_device = None;
    acc.product = product.map(String::from);
    s.tolerations = Some(vec![gpu_toleration()]);
    s
}

fn run(s: &ModelDeploymentSpec, nodes: &[Node]) -> Result<GpuTarget, String> {
    target(s, s.accelerator.as_ref().unwrap(), nodes)
}

#[test]
fn plans_against_the_smallest_matching_device() {
    let mut untolerated = spec(None, 1);
    untolerated.tolerations = None;
    let mut selected = spec(None, 1);
    selected.node_selector = Some([("pool".to_string(), "big".to_string())].into());
    let mut labelled = cluster();
    labelled[1]
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("pool".into(), "big".into());
    let mut cordoned = cluster();
    cordoned[2].spec.as_mut().unwrap().unschedulable = Some(true);
    let mut override_ = spec(Some(L4), 1);
    override_.accelerator.as_mut().unwrap().memory_per_device = Some(Quantity("20Gi".into()));
    type Want = Result<(Option<&'static str>, u64, &'static str, usize), &'static str>;
    let cases: [(&str, ModelDeploymentSpec, Vec<Node>, Want); 9] = [
        (
            "mixed products: the smallest",
            spec(None, 1),
            cluster(),
            Ok((Some("NVIDIA-H100-80GB-HBM3,NVIDIA-L4"), 23_034, "nodes", 3)),
        ),
        (
            "pinned to H100",
            spec(Some(H100), 1),
            cluster(),
            Ok((Some(H100), 81_559, "nodes", 2)),
        ),
        (
            "pinned to L4",
            spec(Some(L4), 1),
            cluster(),
            Ok((Some(L4), 23_034, "nodes", 1)),
        ),
        (
            "count above what the L4 node has",
            spec(None, 5),
            cluster(),
            Ok((Some(H100), 81_559, "nodes", 2)),
        ),
        (
            "a cordoned node is no candidate",
            spec(None, 1),
            cordoned,
            Ok((Some(H100), 81_559, "nodes", 2)),
        ),
        (
            "nodeSelector",
            selected,
            labelled,
            Ok((Some(H100), 81_559, "nodes", 1)),
        ),
        (
            "no toleration for the GPU taint",
            untolerated,
            cluster(),
            Err("untolerated taint nvidia.com/gpu:NoSchedule"),
        ),
        ("no node at all", spec(None, 1), vec![], Err("0 nodes seen")),
        (
            "memoryPerDevice overrides, nodes still counted",
            override_,
            cluster(),
            Ok((Some(L4), 20 << 10, "spec", 1)),
        ),
    ];
    for (name, s, nodes, want) in cases {
        match (run(&s, &nodes), want) {
            (Ok(t), Ok((product, mib, from, n))) => assert_eq!(
                (
                    t.product.as_deref(),
                    t.memory_per_device,
                    t.memory_from,
                    t.nodes
                ),
                (product, mib << 20, from, n),
                "{name}"
            ),
            (Err(msg), Err(needle)) => assert!(msg.contains(needle), "{name}: {msg}"),
            (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn no_match_says_what_it_looked_for() {
    let msg = run(&spec(Some("NVIDIA-A100"), 2), &cluster()).unwrap_err();
    for needle in [
        "nvidia.com/gpu >= 2 allocatable",
        "nvidia.com/gpu.product=NVIDIA-A100",
        "nvidia.com/gpu.memory",
        "3 nodes seen",
        "l4-a: nvidia.com/gpu.product=NVIDIA-L4",
    ] {
        assert!(msg.contains(needle), "{needle}: {msg}");
    }
    // Matching nodes without the memory label cannot be planned for either.
    let mut unlabelled = cluster();
    for n in &mut unlabelled {
        n.metadata.labels.as_mut().unwrap().remove(GPU_MEMORY_LABEL);
    }
    let msg = run(&spec(None, 1), &unlabelled).unwrap_err();
    assert!(
        msg.contains("h100-a: no nvidia.com/gpu.memory label"),
        "{msg}"
    );
}

#[test]
fn tolerations_match_as_kubernetes_matches_them() {
    let taint = |key: &str, value: Option<&str>, effect: &str| Taint {
        key: key.into(),
        value: value.map(String::from),
        effect: effect.into(),
        ..Default::default()
    };
    let tol = |key: Option<&str>, op: Option<&str>, value: Option<&str>, effect: Option<&str>| {
        Toleration {
            key: key.map(String::from),
            operator: op.map(String::from),
            value: value.map(String::from),
            effect: effect.map(String::from),
            ..Default::default()
        }
    };
    let gpu = taint("nvidia.com/gpu", None, "NoSchedule");
    let dedicated = taint("dedicated", Some("llm"), "NoExecute");
    let cases = [
        (
            &gpu,
            tol(Some("nvidia.com/gpu"), Some("Exists"), None, None),
            true,
        ),
        (
            &gpu,
            tol(
                Some("nvidia.com/gpu"),
                Some("Exists"),
                None,
                Some("NoExecute"),
            ),
            false,
        ),
        (&gpu, tol(None, Some("Exists"), None, None), true),
        (&gpu, tol(Some("other"), Some("Exists"), None, None), false),
        (
            &dedicated,
            tol(Some("dedicated"), None, Some("llm"), None),
            true,
        ),
        (
            &dedicated,
            tol(Some("dedicated"), Some("Equal"), Some("web"), None),
            false,
        ),
        (
            &dedicated,
            tol(
                Some("dedicated"),
                Some("Equal"),
                Some("llm"),
                Some("NoExecute"),
            ),
            true,
        ),
    ];
    for (i, (taint, toleration, want)) in cases.into_iter().enumerate() {
        assert_eq!(tolerated(taint, &[toleration]), want, "case {i}");
    }
    assert!(!tolerated(&gpu, &[]));
    // PreferNoSchedule never keeps a pod off.
    let mut soft = cluster();
    soft[0].spec.as_mut().unwrap().taints = Some(vec![taint("x", None, "PreferNoSchedule")]);
    let mut s = spec(Some(H100), 1);
    s.tolerations = Some(vec![gpu_toleration()]);
    assert_eq!(run(&s, &soft).unwrap().nodes, 2);
}

#[test]
fn the_fingerprint_moves_on_planning_facts_only() {
    let base = fingerprint(&cluster());
    let mut reordered = cluster();
    reordered.reverse();
    assert_eq!(fingerprint(&reordered), base, "order does not matter");
    let mut heartbeat = cluster();
    heartbeat[0].status.as_mut().unwrap().conditions = Some(vec![Default::default()]);
    assert_eq!(
        fingerprint(&heartbeat),
        base,
        "status conditions do not matter"
    );
    let mut relabelled = cluster();
    relabelled[2]
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(GPU_MEMORY_LABEL.into(), "40960".into());
    assert_ne!(fingerprint(&relabelled), base);
    assert_ne!(fingerprint(&cluster()[..2]), base, "a node went away");
}
