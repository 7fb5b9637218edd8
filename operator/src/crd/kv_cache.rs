//! The KV cache beyond the device pool on a `ModelDeployment`: the lower
//! tiers (`--kv-offload host=SIZE`, `--kv-offload disk=PATH:SIZE`) that
//! prefix blocks evicted from the device pool fall to.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// Why a disk tier must name exactly one kind of volume.
pub const DISK_VOLUME_MESSAGE: &str = "kvCache.offload.disk needs exactly one of storageClassName (a PersistentVolumeClaim the replicas share) or emptyDir: true (a volume per pod)";

/// Why a host tier is refused on a CPU deployment.
pub const CPU_HOST_TIER_MESSAGE: &str =
    "on a CPU server the KV pool is host memory already; use disk (kvCache.offload.disk)";

/// The access modes a disk tier's claim may ask for.
pub const ACCESS_MODES: [&str; 3] = ["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"];

/// The KV cache's settings beyond the planned device pool.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct KvCacheSpec {
    /// Lower tiers that prefix blocks evicted from the device pool move to,
    /// so a prompt that shares a prefix is read back instead of prefilled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offload: Option<KvOffloadSpec>,
}

/// The lower KV tiers of each server.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct KvOffloadSpec {
    /// Host memory each server keeps evicted blocks in (`--kv-offload
    /// host=BYTES`); added to the pod's memory request (and to a memory
    /// limit the spec sets). GPU deployments only: on a CPU server the KV
    /// pool is host memory already.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_memory: Option<Quantity>,
    /// Files the servers keep evicted blocks in, on a volume mounted at
    /// `/var/cache/ferrox/kv`; they outlive a restart and scale to zero.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<KvDiskSpec>,
}

/// The disk tier's volume.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[x_kube(validation = Rule::new("has(self.storageClassName) != (has(self.emptyDir) && self.emptyDir)").message(DISK_VOLUME_MESSAGE))]
#[serde(rename_all = "camelCase")]
pub struct KvDiskSpec {
    /// The volume's size. With `storageClassName`, the one claim
    /// `<name>-kv-cache` every replica mounts (its files are content-addressed
    /// and written atomically, so sharing is safe): each server's tier is
    /// `size / maxReplicas` (`autoscaling.maxReplicas`, else `replicas`),
    /// rounded down, so that together they never outgrow the volume. With
    /// `emptyDir`, each pod's own volume's `sizeLimit` and its server's tier.
    /// Each server keeps 1/32 of its share free for the file system's own use.
    pub size: Quantity,
    /// The storage class of a PersistentVolumeClaim `<name>-kv-cache` the
    /// operator creates (owned by this ModelDeployment: deleted with it, kept
    /// across scaling, so the cache survives scale to zero).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub storage_class_name: Option<String>,
    /// The claim's access mode: `ReadWriteOnce` (the default: replicas on
    /// one node share it), `ReadWriteMany` (replicas on any node) or
    /// `ReadWriteOncePod`.
    #[serde(default = "default_access_mode")]
    #[x_kube(validation = Rule::new("self in ['ReadWriteOnce', 'ReadWriteMany', 'ReadWriteOncePod']").message("kvCache.offload.disk.accessMode must be ReadWriteOnce, ReadWriteMany or ReadWriteOncePod"))]
    pub access_mode: String,
    /// `true`: an `emptyDir` per pod instead of a claim (lost with the pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty_dir: Option<bool>,
}

fn default_access_mode() -> String {
    ACCESS_MODES[0].into()
}

impl KvDiskSpec {
    /// Whether each pod gets its own `emptyDir` rather than the shared claim.
    pub fn per_pod(&self) -> bool {
        self.empty_dir == Some(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_reads_with_its_default_access_mode() {
        let yaml =
            "offload:\n  hostMemory: 8Gi\n  disk:\n    size: 100Gi\n    storageClassName: fast\n";
        let read: KvCacheSpec = serde_yaml::from_str(yaml).unwrap();
        let offload = read.offload.unwrap();
        assert_eq!(offload.host_memory, Some(Quantity("8Gi".into())));
        let disk = offload.disk.unwrap();
        assert_eq!(disk.access_mode, "ReadWriteOnce");
        assert_eq!(disk.storage_class_name.as_deref(), Some("fast"));
        assert!(!disk.per_pod());
    }
}
