use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::*;
use crate::crd::{AutoscalingSpec, KvCacheSpec};
use crate::desired::{Desired, DesiredConfig, desired};
use crate::fixtures::{self, autoscaling, cpu_spec, gpu_spec, md};
use crate::plan::{Planned, plan_offline};

const GI: u64 = 1 << 30;

fn disk(size: &str, class: Option<&str>, empty_dir: Option<bool>) -> KvDiskSpec {
    KvDiskSpec {
        size: Quantity(size.into()),
        storage_class_name: class.map(str::to_string),
        access_mode: "ReadWriteOnce".into(),
        empty_dir,
    }
}

fn with(
    mut spec: ModelDeploymentSpec,
    host: Option<&str>,
    disk: Option<KvDiskSpec>,
) -> ModelDeploymentSpec {
    spec.kv_cache = Some(KvCacheSpec {
        offload: Some(KvOffloadSpec {
            host_memory: host.map(|h| Quantity(h.into())),
            disk,
        }),
    });
    spec
}

fn render(spec: ModelDeploymentSpec) -> (Desired, Planned) {
    let m = md("llama", spec);
    let geometry = match m.spec.accelerator {
        Some(_) => fixtures::llama3_8b(),
        None => fixtures::smollm2_135m(),
    };
    let plan = plan_offline(&m.spec, &geometry).unwrap();
    (desired(&m, &plan, &DesiredConfig::default()).unwrap(), plan)
}

fn pod(d: &Deployment) -> &PodSpec {
    d.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
}

/// The pod's KV tier volume.
fn kv_volume(p: &PodSpec) -> &k8s_openapi::api::core::v1::Volume {
    let mut volumes = p.volumes.iter().flatten();
    volumes
        .find(|v| v.name == VOLUME)
        .expect("the KV tier's volume")
}

fn server(d: &Deployment) -> &Container {
    &pod(d).containers[0]
}

/// Every `--kv-offload` value, in order.
fn offload_args(c: &Container) -> Vec<String> {
    let args = c.args.clone().unwrap();
    let at = args
        .iter()
        .enumerate()
        .filter(|(_, a)| *a == "--kv-offload");
    at.map(|(i, _)| args[i + 1].clone()).collect()
}

fn memory(r: &ResourceRequirements) -> [Option<String>; 2] {
    [&r.requests, &r.limits].map(|m| m.as_ref()?.get("memory").map(|q| q.0.clone()))
}

#[test]
fn a_host_tier_is_a_flag_and_more_pod_memory() {
    let (plain, planned) = render(gpu_spec(1, "80Gi"));
    assert!(offload_args(server(&plain.deployment)).is_empty());
    let (d, _) = render(with(gpu_spec(1, "80Gi"), Some("8Gi"), None));
    let c = server(&d.deployment);
    assert_eq!(offload_args(c), [format!("host={}", 8 * GI)]);
    let want = format!("{}Mi", (planned.pod_memory_bytes + 8 * GI) >> 20);
    assert_eq!(memory(c.resources.as_ref().unwrap()), [Some(want), None]);
    // A user's request and limit each grow by the tier.
    let mut spec = with(gpu_spec(1, "80Gi"), Some("8Gi"), None);
    spec.resources = Some(ResourceRequirements {
        requests: Some([("memory".to_string(), Quantity("64Gi".into()))].into()),
        limits: Some([("memory".to_string(), Quantity("96Gi".into()))].into()),
        ..Default::default()
    });
    let (d, _) = render(spec);
    let res = server(&d.deployment).resources.clone().unwrap();
    let mib = |gi: u64| Some(format!("{}Mi", gi * 1024));
    assert_eq!(memory(&res), [mib(72), mib(104)]);
    assert!(d.kv_cache_claim.is_none());
    assert!(
        pod(&d.deployment)
            .volumes
            .iter()
            .flatten()
            .all(|v| v.name != VOLUME)
    );
}

#[test]
fn an_emptydir_disk_tier_is_each_pod_s_own_volume() {
    let mut spec = with(cpu_spec("2Gi"), None, Some(disk("20Gi", None, Some(true))));
    spec.replicas = 3;
    let (d, _) = render(spec);
    let p = pod(&d.deployment);
    let v = kv_volume(p);
    let empty = v.empty_dir.as_ref().unwrap();
    assert_eq!(empty.size_limit, Some(Quantity("20Gi".into())));
    let mount = (p.containers[0].volume_mounts.iter().flatten())
        .find(|m| m.name == VOLUME)
        .unwrap();
    assert_eq!(
        (mount.mount_path.as_str(), mount.read_only),
        (KV_CACHE_DIR, None)
    );
    // Not shared: the whole volume is each server's, less 1/32 for the
    // file system's own use (an emptyDir past its sizeLimit is evicted).
    assert_eq!(
        offload_args(&p.containers[0]),
        [format!("disk={KV_CACHE_DIR}:{}", 20 * GI - 20 * GI / 32)]
    );
    assert!(d.kv_cache_claim.is_none());
}

#[test]
fn a_storage_class_disk_tier_is_one_owned_claim_shared_by_max_replicas_and_the_surge() {
    // (replicas, autoscaling, each server's share of 100Gi): one more
    // server than the replicas, the pod a rolling update adds.
    let cases = [
        (1, None, 100 * GI / 2),
        (3, None, 100 * GI / 4),
        // Autoscaled: the most replicas, whatever runs now, so that
        // scaling never rolls the pods with new args.
        (2, Some(autoscaling(1, 4)), 20 * GI),
        (0, Some(autoscaling(0, 3)), 25 * GI),
    ];
    for (replicas, auto, share) in cases {
        let mut spec = with(
            gpu_spec(1, "80Gi"),
            Some("4Gi"),
            Some(disk("100Gi", Some("fast-ssd"), None)),
        );
        spec.replicas = replicas;
        spec.autoscaling = auto.map(|a| AutoscalingSpec { enabled: true, ..a });
        let (d, _) = render(spec);
        let c = server(&d.deployment);
        let want = [
            format!("host={}", 4 * GI),
            format!("disk={KV_CACHE_DIR}:{}", share - share / 32),
        ];
        assert_eq!(offload_args(c), want, "replicas {replicas}");
        let claim = d.kv_cache_claim.expect("a claim");
        assert_eq!(claim.metadata.name.as_deref(), Some("llama-kv-cache"));
        let owner = &claim.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("ModelDeployment", Some(true))
        );
        let cs = claim.spec.unwrap();
        assert_eq!(cs.access_modes, Some(vec!["ReadWriteOnce".to_string()]));
        assert_eq!(cs.storage_class_name.as_deref(), Some("fast-ssd"));
        let storage = cs.resources.unwrap().requests.unwrap()["storage"].clone();
        assert_eq!(storage, Quantity("100Gi".into()));
        let p = pod(&d.deployment);
        let v = kv_volume(p);
        let pvc = v.persistent_volume_claim.as_ref().unwrap();
        assert_eq!(
            (pvc.claim_name.as_str(), pvc.read_only),
            ("llama-kv-cache", Some(false))
        );
        let mounts = c.volume_mounts.iter().flatten();
        assert_eq!(mounts.filter(|m| m.mount_path == KV_CACHE_DIR).count(), 1);
    }
}

#[test]
fn bad_offload_specs_are_refused_with_what_to_do() {
    let gpu = || gpu_spec(1, "80Gi");
    let mut many = with(gpu(), None, Some(disk("3", Some("fast"), None)));
    many.replicas = 4;
    let mut mode = disk("1Gi", Some("fast"), None);
    mode.access_mode = "ReadOnlyMany".into();
    let cases = [
        (
            with(cpu_spec("2Gi"), Some("1Gi"), None),
            "on a CPU server the KV pool is host memory already; use disk",
        ),
        (
            with(gpu(), Some("lots"), None),
            "kvCache.offload.hostMemory \"lots\" is not a quantity of bytes",
        ),
        (with(gpu(), Some("0"), None), "hostMemory is 0"),
        (
            with(gpu(), None, Some(disk("1Gi", Some("fast"), Some(true)))),
            DISK_VOLUME_MESSAGE,
        ),
        (
            with(gpu(), None, Some(disk("1Gi", None, None))),
            DISK_VOLUME_MESSAGE,
        ),
        (
            with(gpu(), None, Some(disk("1Gi", None, Some(false)))),
            DISK_VOLUME_MESSAGE,
        ),
        (
            with(gpu(), None, Some(mode)),
            "accessMode \"ReadOnlyMany\" must be one of",
        ),
        (
            with(gpu(), None, Some(disk("big", None, Some(true)))),
            "kvCache.offload.disk.size \"big\" is not a quantity",
        ),
        (
            many,
            "leaves nothing for each of 5 servers (4 replicas, and 1 more during a rollout)",
        ),
    ];
    for (spec, want) in cases {
        let (reason, message) = refusal(&spec).expect(want);
        assert_eq!(reason, "InvalidSpec");
        assert!(message.contains(want), "{message}");
    }
    // A disk tier on a CPU server, and no offload at all, are fine.
    let cpu_disk = with(cpu_spec("2Gi"), None, Some(disk("1Gi", None, Some(true))));
    for ok in [
        cpu_disk,
        gpu(),
        with(gpu(), Some("8Gi"), Some(disk("1Gi", Some("c"), None))),
    ] {
        assert_eq!(refusal(&ok), None);
    }
}

#[test]
fn a_refused_claim_change_names_the_claim_and_the_api_server_s_first_line() {
    let m = md("tiered", cpu_spec("2Gi"));
    let api = "PersistentVolumeClaim \"tiered-kv-cache\" is invalid: spec: Forbidden: spec is immutable after creation\n  core.PersistentVolumeClaimSpec{\n-  StorageClassName: \"fast\"\n}";
    let (reason, message) = claim_refusal(&m, api);
    assert_eq!(reason, "KvCacheClaimImmutable");
    assert!(
        message.contains("the claim tiered-kv-cache cannot take this change"),
        "{message}"
    );
    assert!(
        message.contains("spec is immutable after creation)"),
        "{message}"
    );
    assert!(
        !message.contains("StorageClassName"),
        "the diff is left out: {message}"
    );
}
