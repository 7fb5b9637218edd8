//! What `spec.kvCache.offload` adds to the server pods: the `--kv-offload`
//! values (in the contract's `ServeArgs`), the host tier's bytes on the
//! pod's memory, and the disk tier's volume: an `emptyDir` per pod, or one
//! claim `<name>-kv-cache` that every replica mounts at [`KV_CACHE_DIR`].

use std::collections::BTreeMap;

use ferrox_plan::OffloadTier;
use k8s_openapi::api::core::v1::{
    EmptyDirVolumeSource, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;

use super::child_meta;
use crate::crd::{
    ACCESS_MODES, CPU_HOST_TIER_MESSAGE, DISK_VOLUME_MESSAGE, KvDiskSpec, KvOffloadSpec,
    ModelDeployment, ModelDeploymentSpec,
};
use crate::{Error, quantity};

/// Where the disk tier's volume is mounted (the server's `disk=PATH`).
pub const KV_CACHE_DIR: &str = "/var/cache/ferrox/kv";
/// The disk tier's volume in the pod.
const VOLUME: &str = "kv-cache";

fn offload(spec: &ModelDeploymentSpec) -> Option<&KvOffloadSpec> {
    spec.kv_cache.as_ref()?.offload.as_ref()
}

fn disk(spec: &ModelDeploymentSpec) -> Option<&KvDiskSpec> {
    offload(spec)?.disk.as_ref()
}

/// The shared claim's name: `<name>-kv-cache`.
pub fn claim_name(md: &ModelDeployment) -> String {
    format!("{}-{VOLUME}", md.name_any())
}

/// Bytes of the host tier; 0 without one (or with a quantity
/// [`refusal`] refuses).
pub fn host_bytes(spec: &ModelDeploymentSpec) -> u64 {
    let q = offload(spec).and_then(|o| o.host_memory.as_ref());
    q.and_then(|q| quantity::bytes(q).ok()).unwrap_or(0)
}

/// The most servers that share one claim at once: `autoscaling.maxReplicas`
/// when the replicas follow load (so that scaling never changes the
/// servers' args, which would roll every pod), else `replicas`; at least 1.
pub fn max_replicas(spec: &ModelDeploymentSpec) -> u64 {
    let autoscaled = spec.autoscaling.as_ref().filter(|a| a.enabled);
    let n = autoscaled.map_or(spec.replicas, |a| a.max_replicas);
    u64::try_from(n).unwrap_or(0).max(1)
}

/// The most servers writing to one shared claim at once: the most
/// replicas, and the pods a rolling update starts beside them.
pub fn servers_at_once(spec: &ModelDeploymentSpec) -> u64 {
    max_replicas(spec) + u64::try_from(super::MAX_SURGE).unwrap_or(0)
}

/// Bytes of each server's disk tier: a pod's own `emptyDir`'s `size`, or
/// the shared claim's `size / servers_at_once`, floored, so that the
/// servers together never outgrow it, mid-rollout too; less 1/32 for what the files take beyond
/// their bytes (directories, a block being written), so an `emptyDir`
/// never passes its `sizeLimit` and gets its pod evicted.
fn disk_bytes(spec: &ModelDeploymentSpec, disk: &KvDiskSpec) -> u64 {
    let size = quantity::bytes(&disk.size).unwrap_or(0);
    let share = if disk.per_pod() {
        size
    } else {
        size / servers_at_once(spec)
    };
    share - share / DISK_HEADROOM
}

/// The part of a disk share held back for the file system's own use.
const DISK_HEADROOM: u64 = 32;

/// The `--kv-offload` values: the host tier, then the disk tier.
pub fn tiers(spec: &ModelDeploymentSpec) -> Vec<OffloadTier> {
    let mut out = Vec::new();
    let host = host_bytes(spec);
    if host > 0 {
        out.push(OffloadTier::Host { bytes: host });
    }
    if let Some(d) = disk(spec) {
        let bytes = disk_bytes(spec, d);
        if bytes > 0 {
            out.push(OffloadTier::Disk {
                path: KV_CACHE_DIR.into(),
                bytes,
            });
        }
    }
    out
}

/// The disk tier's volume, when there is one.
pub fn volumes(md: &ModelDeployment) -> Vec<Volume> {
    let Some(d) = disk(&md.spec) else {
        return Vec::new();
    };
    let volume = if d.per_pod() {
        Volume {
            name: VOLUME.into(),
            empty_dir: Some(EmptyDirVolumeSource {
                size_limit: Some(d.size.clone()),
                ..Default::default()
            }),
            ..Default::default()
        }
    } else {
        Volume {
            name: VOLUME.into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim_name(md),
                read_only: Some(false),
            }),
            ..Default::default()
        }
    };
    vec![volume]
}

/// Mounts matching [`volumes`].
pub fn mounts(md: &ModelDeployment) -> Vec<VolumeMount> {
    let mount = || VolumeMount {
        name: VOLUME.into(),
        mount_path: KV_CACHE_DIR.into(),
        ..Default::default()
    };
    disk(&md.spec).map(|_| mount()).into_iter().collect()
}

/// The shared claim the disk tier asks for with `storageClassName`. Owned
/// by `md`, so deleted with it; scaling (to zero too) leaves it.
pub fn claim(md: &ModelDeployment) -> Result<Option<PersistentVolumeClaim>, Error> {
    let Some(d) = disk(&md.spec).filter(|d| !d.per_pod()) else {
        return Ok(None);
    };
    Ok(Some(PersistentVolumeClaim {
        metadata: child_meta(md, claim_name(md))?,
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec![d.access_mode.clone()]),
            storage_class_name: d.storage_class_name.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".into(), d.size.clone())])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }))
}

/// The condition's reason and message when the API server refuses to
/// change the existing claim as the spec now asks (`why`, its message).
pub fn claim_refusal(md: &ModelDeployment, why: &str) -> (&'static str, String) {
    // Its first line: the API server appends a diff of the whole spec.
    let why = why.lines().next().unwrap_or_default().trim_end();
    let message = format!(
        "spec.kvCache.offload.disk: the claim {} cannot take this change ({why}); set the \
         field back, or delete the claim (its cached blocks go with it) for a new one",
        claim_name(md)
    );
    ("KvCacheClaimImmutable", message)
}

/// Why the spec's lower tiers cannot be served (a condition reason and a
/// message), in the words of the CRD's rules where they overlap (an API
/// server without them, or `render`, still refuses).
pub fn refusal(spec: &ModelDeploymentSpec) -> Option<(&'static str, String)> {
    let o = offload(spec)?;
    let invalid = |m: String| Some(("InvalidSpec", m));
    if let Some(q) = &o.host_memory {
        if spec.accelerator.is_none() {
            return invalid(CPU_HOST_TIER_MESSAGE.into());
        }
        match quantity::bytes(q) {
            Ok(0) => {
                return invalid(
                    "kvCache.offload.hostMemory is 0: give the tier some bytes, or leave it out"
                        .into(),
                );
            }
            Err(_) => return invalid(not_a_quantity("hostMemory", q)),
            Ok(_) => {}
        }
    }
    let d = o.disk.as_ref()?;
    if d.storage_class_name.is_some() == d.per_pod() {
        return invalid(DISK_VOLUME_MESSAGE.into());
    }
    if !ACCESS_MODES.contains(&d.access_mode.as_str()) {
        return invalid(format!(
            "kvCache.offload.disk.accessMode {:?} must be one of {}",
            d.access_mode,
            ACCESS_MODES.join(", ")
        ));
    }
    let size = match quantity::bytes(&d.size) {
        Ok(b) => b,
        Err(_) => return invalid(not_a_quantity("disk.size", &d.size)),
    };
    if disk_bytes(spec, d) == 0 {
        return invalid(format!(
            "kvCache.offload.disk.size {} ({size} bytes) leaves nothing for each of {} servers \
             ({} replicas, and {} more during a rollout)",
            d.size.0,
            servers_at_once(spec),
            max_replicas(spec),
            super::MAX_SURGE
        ));
    }
    None
}

fn not_a_quantity(field: &str, q: &Quantity) -> String {
    format!(
        "kvCache.offload.{field} {:?} is not a quantity of bytes (e.g. 8Gi, 500G)",
        q.0
    )
}

#[cfg(test)]
mod tests;
