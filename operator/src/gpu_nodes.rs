//! The GPUs a spec's pods can land on, from the labels NVIDIA's GPU Feature
//! Discovery puts on each node. Pure: the nodes come in as a slice.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};

use k8s_openapi::api::core::v1::{Node, Taint, Toleration};

use crate::crd::{AcceleratorSpec, ModelDeploymentSpec};
use crate::quantity;

/// GPU Feature Discovery: the product name.
pub const GPU_PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
/// GPU Feature Discovery: memory of one device, in MiB.
pub const GPU_MEMORY_LABEL: &str = "nvidia.com/gpu.memory";

/// What a GPU plan is made for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuTarget {
    /// The matching nodes' product(s), sorted, comma-separated.
    pub product: Option<String>,
    /// Bytes of one device.
    pub memory_per_device: u64,
    /// `nodes` or `spec`.
    pub memory_from: &'static str,
    /// Nodes the pods can be scheduled on.
    pub nodes: usize,
}

/// The nodes `spec`'s pods can land on, and the device memory to plan with:
/// the spec's `memoryPerDevice` if given, else the smallest
/// `nvidia.com/gpu.memory` among them. `Err` says what was looked for.
pub fn target(
    spec: &ModelDeploymentSpec,
    acc: &AcceleratorSpec,
    nodes: &[Node],
) -> Result<GpuTarget, String> {
    let verdicts: Vec<(&Node, Result<Option<u64>, String>)> =
        nodes.iter().map(|n| (n, fits(spec, acc, n))).collect();
    let fitting: Vec<(&Node, Option<u64>)> = verdicts
        .iter()
        .filter_map(|(n, v)| v.as_ref().ok().map(|m| (*n, *m)))
        .collect();
    let products: BTreeSet<&str> = fitting
        .iter()
        .filter_map(|(n, _)| label(n, GPU_PRODUCT_LABEL))
        .collect();
    let product =
        (!products.is_empty()).then(|| products.into_iter().collect::<Vec<_>>().join(","));
    if let Some(q) = &acc.memory_per_device {
        let memory_per_device = quantity::bytes(q).map_err(|e| e.to_string())?;
        return Ok(GpuTarget {
            product,
            memory_per_device,
            memory_from: "spec",
            nodes: fitting.len(),
        });
    }
    let smallest = fitting.iter().filter_map(|(_, m)| *m).min();
    match smallest {
        Some(memory_per_device) => Ok(GpuTarget {
            product,
            memory_per_device,
            memory_from: "nodes",
            nodes: fitting.len(),
        }),
        None => Err(no_match(spec, acc, &verdicts)),
    }
}

/// Whether a pod of `spec` can land on `node`: `Ok` with its device memory
/// (None without the label), or `Err` with why not.
pub fn fits(
    spec: &ModelDeploymentSpec,
    acc: &AcceleratorSpec,
    node: &Node,
) -> Result<Option<u64>, String> {
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        return Err("cordoned".into());
    }
    let have = allocatable(node, &acc.resource_name);
    let want = u64::try_from(acc.count.max(1)).unwrap_or(1);
    if have < want {
        return Err(format!("{have} {} allocatable", acc.resource_name));
    }
    for (key, value) in wanted_labels(spec, acc) {
        match label(node, &key) {
            Some(v) if v == value => {}
            Some(v) => return Err(format!("{key}={v}")),
            None => return Err(format!("no {key} label")),
        }
    }
    let tolerations = spec.tolerations.as_deref().unwrap_or(&[]);
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or(&[]);
    if let Some(t) = taints
        .iter()
        .find(|t| repels(t) && !tolerated(t, tolerations))
    {
        return Err(format!("untolerated taint {}:{}", t.key, t.effect));
    }
    Ok(label(node, GPU_MEMORY_LABEL)
        .and_then(|mib| mib.trim().parse::<u64>().ok())
        .and_then(|mib| mib.checked_mul(1 << 20)))
}

/// The node labels a pod requires: `nodeSelector` plus the product.
fn wanted_labels(spec: &ModelDeploymentSpec, acc: &AcceleratorSpec) -> BTreeMap<String, String> {
    let mut labels = spec.node_selector.clone().unwrap_or_default();
    if let Some(p) = &acc.product {
        labels.insert(GPU_PRODUCT_LABEL.into(), p.clone());
    }
    labels
}

fn no_match(
    spec: &ModelDeploymentSpec,
    acc: &AcceleratorSpec,
    verdicts: &[(&Node, Result<Option<u64>, String>)],
) -> String {
    let mut wanted = vec![format!(
        "{} >= {} allocatable",
        acc.resource_name, acc.count
    )];
    wanted.extend(
        wanted_labels(spec, acc)
            .iter()
            .map(|(k, v)| format!("{k}={v}")),
    );
    wanted.push(format!(
        "a {GPU_MEMORY_LABEL} label (or set accelerator.memoryPerDevice)"
    ));
    let seen: Vec<String> = verdicts
        .iter()
        .take(8)
        .map(|(n, v)| {
            let name = n.metadata.name.as_deref().unwrap_or("?");
            match v {
                Err(why) => format!("{name}: {why}"),
                Ok(_) => format!("{name}: no {GPU_MEMORY_LABEL} label"),
            }
        })
        .collect();
    let more = verdicts.len().saturating_sub(seen.len());
    format!(
        "no node matches: looked for {}, tolerating the pods' tolerations; {} nodes seen{}{}",
        wanted.join(", "),
        verdicts.len(),
        if seen.is_empty() {
            String::new()
        } else {
            format!(" ({})", seen.join("; "))
        },
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        },
    )
}

fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// Whole devices of `resource` the node can give pods.
fn allocatable(node: &Node, resource: &str) -> u64 {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get(resource))
        .and_then(|q| q.0.trim().parse::<u64>().ok())
        .unwrap_or(0)
}

/// Taints that keep pods off (PreferNoSchedule only discourages).
fn repels(t: &Taint) -> bool {
    t.effect == "NoSchedule" || t.effect == "NoExecute"
}

/// Kubernetes' toleration match: key (empty with Exists is every key),
/// operator Exists or Equal (the default), and effect (empty is every effect).
pub fn tolerated(taint: &Taint, tolerations: &[Toleration]) -> bool {
    tolerations.iter().any(|t| {
        let key = t.key.as_deref().unwrap_or("");
        let exists = t.operator.as_deref() == Some("Exists");
        let key_ok = key == taint.key || (key.is_empty() && exists);
        let value_ok =
            exists || t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("");
        let effect_ok = t
            .effect
            .as_deref()
            .is_none_or(|e| e.is_empty() || e == taint.effect);
        key_ok && value_ok && effect_ok
    })
}

/// A hash of what planning reads from the nodes (names, labels, taints,
/// allocatable, cordons): it changes when a re-plan may be due, and not on
/// heartbeats.
pub fn fingerprint<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> u64 {
    let mut rows: Vec<String> = nodes
        .into_iter()
        .map(|n| {
            let spec = n.spec.as_ref();
            format!(
                "{:?}|{:?}|{:?}|{:?}|{:?}",
                n.metadata.name,
                n.metadata.labels,
                spec.and_then(|s| s.taints.as_ref()).map(|t| t
                    .iter()
                    .map(|t| (&t.key, &t.value, &t.effect))
                    .collect::<Vec<_>>()),
                spec.and_then(|s| s.unschedulable),
                n.status.as_ref().and_then(|s| s.allocatable.as_ref()),
            )
        })
        .collect();
    rows.sort();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    rows.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests;
