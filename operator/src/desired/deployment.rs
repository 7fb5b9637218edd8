//! The ferrox-server Deployment.

use std::collections::BTreeMap;

use ferrox_plan::{SpeculativeFlag, contract};
use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, Lifecycle, LifecycleHandler, PersistentVolumeClaimVolumeSource,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile,
    SecurityContext, SleepAction, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use kube::api::ObjectMeta;

use super::{DesiredConfig, MODEL_CACHE_DIR, SERVER_PORT, child_meta, kv_offload, selector_labels};
use crate::crd::ModelDeployment;
use crate::gpu_nodes::GPU_PRODUCT_LABEL;
use crate::plan::Planned;
use crate::served_name::served_name;
use crate::source::{self, ModelSource, PVC_MOUNT, downloads};
use crate::{Error, quantity};

/// Seconds of grace beyond the drain timeout before the kubelet kills the pod.
const GRACE_MARGIN_SECONDS: i64 = 15;
/// Seconds a deleted pod keeps serving before SIGTERM starts its drain: the
/// time kube-proxies and routers take to stop sending it new connections
/// (without it a rollout refuses connections on the old pods' closed port).
pub const PRE_STOP_SLEEP_SECONDS: i64 = 5;
/// UID/GID the server runs as (no root in the image is needed).
const RUN_AS: i64 = 65532;

/// The Deployment running ferrox-server for `md` under `plan`.
pub fn deployment(
    md: &ModelDeployment,
    plan: &Planned,
    config: &DesiredConfig,
) -> Result<Deployment, Error> {
    let source = source::parse(&md.spec.model.source)?;
    Ok(Deployment {
        metadata: child_meta(md, md.name_any())?,
        spec: Some(DeploymentSpec {
            // From spec.replicas, which only the scale subresource's writers change.
            replicas: Some(md.spec.replicas),
            selector: LabelSelector {
                match_labels: Some(selector_labels(md)),
                ..Default::default()
            },
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(super::MAX_SURGE)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(selector_labels(md)),
                    annotations: Some(scrape_annotations()),
                    ..Default::default()
                }),
                spec: Some(pod_spec(md, plan, config, &source)),
            },
            ..Default::default()
        }),
        status: None,
    })
}

fn scrape_annotations() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("prometheus.io/scrape".into(), "true".into()),
        ("prometheus.io/port".into(), SERVER_PORT.to_string()),
        ("prometheus.io/path".into(), "/metrics".into()),
    ])
}

fn pod_spec(
    md: &ModelDeployment,
    plan: &Planned,
    config: &DesiredConfig,
    source: &ModelSource,
) -> PodSpec {
    let spec = &md.spec;
    PodSpec {
        containers: vec![server_container(md, plan, config, source)],
        volumes: Some(
            [
                volumes(md, source),
                super::side_sources::volumes(md, source),
                kv_offload::volumes(md),
            ]
            .concat(),
        ),
        security_context: Some(pod_security_context()),
        termination_grace_period_seconds: Some(
            PRE_STOP_SLEEP_SECONDS + spec.engine.drain_timeout_seconds + GRACE_MARGIN_SECONDS,
        ),
        node_selector: node_selector(md),
        tolerations: spec.tolerations.clone(),
        affinity: spec.affinity.clone(),
        image_pull_secrets: spec.image_pull_secrets.clone(),
        service_account_name: spec.service_account_name.clone(),
        automount_service_account_token: Some(false),
        ..Default::default()
    }
}

fn server_container(
    md: &ModelDeployment,
    plan: &Planned,
    config: &DesiredConfig,
    source: &ModelSource,
) -> Container {
    Container {
        name: "server".into(),
        image: Some(image(md, config)),
        image_pull_policy: Some("IfNotPresent".into()),
        args: Some(server_args(md, plan, source)),
        env: Some(env(md, source)),
        ports: Some(vec![ContainerPort {
            name: Some("http".into()),
            container_port: SERVER_PORT,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        resources: Some(resources(md, plan)),
        volume_mounts: Some(
            [
                volume_mounts(source),
                super::side_sources::mounts(md, source),
                kv_offload::mounts(md),
            ]
            .concat(),
        ),
        liveness_probe: Some(http_probe("/health", 10, 3)),
        readiness_probe: Some(http_probe("/ready", 5, 3)),
        // Model download and load can take long; liveness waits for this.
        startup_probe: Some(http_probe("/health", 10, 180)),
        security_context: Some(container_security_context()),
        // The kubelet's own sleep: the image has no shell to run one.
        lifecycle: Some(Lifecycle {
            pre_stop: Some(LifecycleHandler {
                sleep: Some(SleepAction {
                    seconds: PRE_STOP_SLEEP_SECONDS,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `--device` for pods planned for `device`.
/// The ferrox-server image for `md`: the spec's, else the operator's CUDA
/// image for a spec with accelerators, else its CPU image.
pub fn image(md: &ModelDeployment, config: &DesiredConfig) -> String {
    let default = match md.spec.accelerator {
        Some(_) => &config.cuda_image,
        None => &config.default_image,
    };
    md.spec.image.clone().unwrap_or_else(|| default.clone())
}

/// `ferrox-server serve` arguments carrying the plan (the contract's typed
/// value, so a flag the server renames fails to compile here), then the
/// spec's extra arguments.
pub fn server_args(md: &ModelDeployment, planned: &Planned, source: &ModelSource) -> Vec<String> {
    let spec = &md.spec;
    let plan = &planned.plan;
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    let mut args = contract::ServeArgs {
        model: source::server_arg(source, &spec.model.source),
        host: "0.0.0.0".into(),
        port: u16::try_from(SERVER_PORT).unwrap_or(8000),
        served_model_name: served_name(md),
        pools: plan.sizes(),
        block_size: plan.block_size,
        max_seqs: plan.max_seqs,
        max_model_len: plan.max_model_len,
        drain_timeout_seconds: n(spec.engine.drain_timeout_seconds),
        device: planned.device,
        kv_dtype: planned.kv_dtype,
        prefill_chunk: spec.engine.prefill_chunk.map(n),
        max_queue: spec.engine.max_queue.map(n),
        lora: super::adapters::lora_args(md),
        // Refused before rendering when it cannot be served.
        speculative: (spec.speculative.as_ref())
            .and_then(|s| s.config().ok())
            .map(|config| SpeculativeFlag {
                config,
                draft_model: super::side_sources::draft_server_path(md),
            }),
        task: planned.task,
        max_batch_tokens: spec.engine.max_batch_tokens.map(n),
        // Refused before rendering when it cannot be served.
        kv_offload: kv_offload::tiers(spec),
    }
    .to_args();
    args.extend(spec.engine.extra_args.iter().cloned());
    args
}

/// The server's API keys, read from the Secret the spec names.
pub const API_KEY_ENV: &str = "FERROX_API_KEY";

/// The user's env, plus where downloads are cached (an env var rather than a
/// flag, so that a server without `--model-cache` still starts) and the API
/// keys from their Secret (an env var, so the keys never appear in args).
pub fn env(md: &ModelDeployment, source: &ModelSource) -> Vec<EnvVar> {
    let mut env = md.spec.env.clone().unwrap_or_default();
    if let Some(auth) = &md.spec.auth {
        // Ours wins over a user's own FERROX_API_KEY: one source of keys.
        env.retain(|e| e.name != API_KEY_ENV);
        env.push(EnvVar {
            name: API_KEY_ENV.into(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(auth.api_key_secret_ref.clone()),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    if downloads(source) || super::side_sources::downloads_some(md) {
        for name in ["FERROX_MODEL_CACHE", "HF_HOME"] {
            env.push(EnvVar {
                name: name.into(),
                value: Some(MODEL_CACHE_DIR.into()),
                ..Default::default()
            });
        }
    }
    env
}

/// The user's resources, with the memory the plan needs: on CPU the request
/// and the limit are the memory planned from (the server checks its plan
/// against the cgroup limit, and the kubelet protects what the plan
/// admitted); on GPU a host-memory request, never below the user's, plus
/// the host KV tier's bytes (on a memory limit the user set, too).
fn resources(md: &ModelDeployment, plan: &Planned) -> ResourceRequirements {
    let mut resources = md.spec.resources.clone().unwrap_or_default();
    add_host_tier(&mut resources, plan, kv_offload::host_bytes(&md.spec));
    let memory = Quantity(format!("{}Mi", plan.pod_memory_bytes >> 20));
    if md.spec.accelerator.is_none() {
        for map in [&mut resources.limits, &mut resources.requests] {
            map.get_or_insert_with(BTreeMap::new)
                .insert("memory".into(), memory.clone());
        }
    } else {
        let requests = resources.requests.get_or_insert_with(BTreeMap::new);
        let user = requests
            .get("memory")
            .and_then(|q| quantity::bytes(q).ok())
            .unwrap_or(0);
        if user < plan.pod_memory_bytes {
            requests.insert("memory".into(), memory);
        }
    }
    if let Some(acc) = &md.spec.accelerator {
        let count = Quantity(acc.count.to_string());
        // Extended resources must have requests equal to limits.
        for map in [&mut resources.limits, &mut resources.requests] {
            map.get_or_insert_with(BTreeMap::new)
                .insert(acc.resource_name.clone(), count.clone());
        }
    }
    resources
}

/// Adds a host KV tier's `bytes` to a GPU pod's memory request (at least
/// the plan's) and to a memory limit the user set, in whole MiB rounded up;
/// nothing without a tier. A CPU spec has none (refused before rendering).
fn add_host_tier(resources: &mut ResourceRequirements, plan: &Planned, bytes: u64) {
    if bytes == 0 {
        return;
    }
    let mib = |b: u64| Quantity(format!("{}Mi", b.div_ceil(1 << 20)));
    let user = |map: &Option<BTreeMap<String, Quantity>>| {
        let q = map.as_ref().and_then(|m| m.get("memory"));
        q.and_then(|q| quantity::bytes(q).ok())
    };
    let request = user(&resources.requests)
        .unwrap_or(0)
        .max(plan.pod_memory_bytes);
    (resources.requests.get_or_insert_with(BTreeMap::new))
        .insert("memory".into(), mib(request.saturating_add(bytes)));
    if let (Some(limit), Some(map)) = (user(&resources.limits), resources.limits.as_mut()) {
        map.insert("memory".into(), mib(limit.saturating_add(bytes)));
    }
}

fn node_selector(md: &ModelDeployment) -> Option<BTreeMap<String, String>> {
    let mut selector = md.spec.node_selector.clone().unwrap_or_default();
    if let Some(product) = md.spec.accelerator.as_ref().and_then(|a| a.product.clone()) {
        selector.insert(GPU_PRODUCT_LABEL.into(), product);
    }
    (!selector.is_empty()).then_some(selector)
}

fn http_probe(path: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("http".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        timeout_seconds: Some(2),
        ..Default::default()
    }
}

/// The restricted pod security context (Pod Security Standards `restricted`).
pub fn pod_security_context() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(RUN_AS),
        run_as_group: Some(RUN_AS),
        fs_group: Some(RUN_AS),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The restricted container security context.
pub fn container_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Volumes the server needs for `source` (a writable /tmp always); a
/// downloading source caches into `spec.model.cache`'s claim when given.
pub fn volumes(md: &ModelDeployment, source: &ModelSource) -> Vec<Volume> {
    let empty = |name: &str| Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    };
    let mut volumes = vec![empty("tmp")];
    match source {
        ModelSource::Pvc { claim, .. } => volumes.push(Volume {
            name: "model".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.clone(),
                read_only: Some(true),
            }),
            ..Default::default()
        }),
        s if downloads(s) => volumes.push(match &md.spec.model.cache {
            Some(cache) => Volume {
                name: "model-cache".into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: cache.claim_name.clone(),
                    read_only: Some(false),
                }),
                ..Default::default()
            },
            None => empty("model-cache"),
        }),
        _ => {}
    }
    volumes
}

/// Mounts matching [`volumes`].
pub fn volume_mounts(source: &ModelSource) -> Vec<VolumeMount> {
    let mount = |name: &str, path: &str, read_only: bool| VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..Default::default()
    };
    let mut mounts = vec![mount("tmp", "/tmp", false)];
    match source {
        ModelSource::Pvc { .. } => mounts.push(mount("model", PVC_MOUNT, true)),
        s if downloads(s) => mounts.push(mount("model-cache", MODEL_CACHE_DIR, false)),
        _ => {}
    }
    mounts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, cpu_spec, gpu_spec, md};
    use crate::plan::plan_offline;

    fn render_md(md: &ModelDeployment) -> (Deployment, Planned) {
        let geometry = if md.spec.accelerator.is_some() {
            ferrox_plan::ModelGeometry {
                vocab_size: 128_256,
                ..fixtures::llama3_8b()
            }
        } else {
            fixtures::smollm2_135m()
        };
        let plan = plan_offline(&md.spec, &geometry).unwrap();
        (
            deployment(md, &plan, &DesiredConfig::default()).unwrap(),
            plan,
        )
    }

    fn render(spec: crate::crd::ModelDeploymentSpec) -> (Deployment, Planned) {
        render_md(&md("llama", spec))
    }

    fn memory(r: &ResourceRequirements) -> [Option<String>; 2] {
        [&r.requests, &r.limits].map(|m| {
            m.as_ref()
                .and_then(|m| m.get("memory"))
                .map(|q| q.0.clone())
        })
    }

    fn pod(d: &Deployment) -> &PodSpec {
        d.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
    }

    fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
        args.iter()
            .position(|a| a == name)
            .map(|i| args[i + 1].as_str())
    }

    #[test]
    fn a_pooling_deployment_plans_no_kv_pool_and_tells_the_server_its_task() {
        // An embedder and a cross-encoder are planned alike.
        for (task, name) in [
            (ferrox_plan::Task::Embed, "embed"),
            (ferrox_plan::Task::Score, "score"),
        ] {
            let mut spec = cpu_spec("2Gi");
            spec.task = Some(task);
            spec.engine.max_batch_tokens = Some(4096);
            let (d, plan) = render(spec.clone());
            assert!(plan.plan.pools.is_empty(), "{name}");
            assert_eq!(plan.plan.kv_budget_bytes, 0);
            let geometry = fixtures::smollm2_135m();
            let want = ferrox_plan::pooling_activation_bytes(
                &geometry,
                4096,
                4096.min(plan.plan.max_model_len),
                4,
            );
            assert_eq!(plan.plan.activation_reserve_bytes, want, "{name}");
            let args = pod(&d).containers[0].args.clone().unwrap();
            assert_eq!(flag(&args, "--task"), Some(name));
            assert_eq!(flag(&args, "--max-batch-tokens"), Some("4096"));
            assert_eq!(flag(&args, "--pool"), None);
            let status = crate::plan::to_status(&plan);
            assert!(status.pools.is_empty() && status.kv_blocks == 0);
        }
        // A generating deployment says nothing of a task.
        let (d, _) = render(cpu_spec("2Gi"));
        let args = pod(&d).containers[0].args.clone().unwrap();
        assert_eq!(flag(&args, "--task"), None);
    }

    #[test]
    fn the_device_decides_image_device_flag_and_kv_dtype() {
        let defaults = DesiredConfig::default();
        let mut own = cpu_spec("2Gi");
        own.image = Some("mine:1".into());
        // (spec, image, --device, --kv-dtype): the geometry fixtures' KV
        // dtype (bf16 for the 8B, f32 for SmolLM2) is what the plan counted,
        // and what the server is told.
        let cases = [
            (
                gpu_spec(1, "80Gi"),
                defaults.cuda_image.as_str(),
                "cuda",
                "bf16",
            ),
            (
                cpu_spec("2Gi"),
                defaults.default_image.as_str(),
                "cpu",
                "f32",
            ),
            (own, "mine:1", "cpu", "f32"),
        ];
        for (spec, image, device, kv) in cases {
            let (d, planned) = render(spec);
            let c = &pod(&d).containers[0];
            let args = c.args.clone().unwrap();
            assert_eq!(c.image.as_deref(), Some(image));
            assert_eq!(flag(&args, "--device"), Some(device));
            assert_eq!(flag(&args, "--kv-dtype"), Some(kv));
            assert_eq!(planned.kv_dtype.name(), kv);
        }
    }

    #[test]
    fn api_keys_come_from_the_named_secret_and_never_from_args() {
        use k8s_openapi::api::core::v1::SecretKeySelector;
        let mut spec = cpu_spec("2Gi");
        // A user's own FERROX_API_KEY is replaced, not duplicated.
        spec.env = Some(vec![
            EnvVar {
                name: "OTHER".into(),
                value: Some("1".into()),
                ..Default::default()
            },
            EnvVar {
                name: API_KEY_ENV.into(),
                value: Some("plain".into()),
                ..Default::default()
            },
        ]);
        let open = render(spec.clone()).0;
        let env = pod(&open).containers[0].env.clone().unwrap();
        assert!(
            env.iter().any(|e| e.value.as_deref() == Some("plain")),
            "no auth: untouched"
        );
        spec.auth = Some(crate::crd::AuthSpec {
            api_key_secret_ref: SecretKeySelector {
                name: "llama-keys".into(),
                key: "keys".into(),
                optional: None,
            },
        });
        let (d, _) = render(spec);
        let c = &pod(&d).containers[0];
        let env = c.env.clone().unwrap();
        let keys: Vec<&EnvVar> = env.iter().filter(|e| e.name == API_KEY_ENV).collect();
        assert_eq!(keys.len(), 1, "{env:?}");
        let selector = keys[0]
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap();
        assert_eq!(
            (selector.name.as_str(), selector.key.as_str()),
            ("llama-keys", "keys")
        );
        assert!(keys[0].value.is_none());
        assert!(env.iter().any(|e| e.name == "OTHER"));
        assert!(
            !c.args
                .clone()
                .unwrap()
                .iter()
                .any(|a| a.contains("api-key"))
        );
        // The probes stay on the routes that need no key.
        let probe = |p: &Option<Probe>| p.as_ref().unwrap().http_get.as_ref().unwrap().path.clone();
        assert_eq!(probe(&c.liveness_probe).as_deref(), Some("/health"));
        assert_eq!(probe(&c.readiness_probe).as_deref(), Some("/ready"));
    }

    #[test]
    fn args_carry_the_plan() {
        let (d, planned) = render(gpu_spec(1, "80Gi"));
        let plan = &planned.plan;
        let args = pod(&d).containers[0].args.clone().unwrap();
        let cases = [
            (
                "--pool",
                format!("full={}", plan.blocks(ferrox_plan::CacheKind::Full)),
            ),
            ("--max-seqs", plan.max_seqs.to_string()),
            ("--block-size", "16".to_string()),
            ("--max-model-len", "8192".to_string()),
            (
                "--model",
                "hf://meta-llama/Meta-Llama-3-8B-Instruct".to_string(),
            ),
            ("--served-model-name", "model".to_string()),
            ("--port", "8000".to_string()),
        ];
        assert_eq!(args[0], "serve");
        for (name, want) in cases {
            assert_eq!(flag(&args, name), Some(want.as_str()), "{name}");
        }
        assert_eq!(flag(&args, "--prefill-chunk"), None);
        let env = pod(&d).containers[0].env.clone().unwrap();
        assert!(
            env.iter()
                .any(|e| e.name == "FERROX_MODEL_CACHE"
                    && e.value.as_deref() == Some(MODEL_CACHE_DIR))
        );
    }

    #[test]
    fn served_name_defaults_to_the_resource_name() {
        let mut spec = gpu_spec(1, "80Gi");
        spec.model.served_name = None;
        let (d, _) = render(spec);
        let args = pod(&d).containers[0].args.clone().unwrap();
        assert_eq!(flag(&args, "--served-model-name"), Some("llama"));
    }

    #[test]
    fn cpu_pods_carry_the_plans_memory_as_request_and_limit() {
        // The user's 2Gi is what the plan fits into (90% of it) and the pod's
        // request and limit: the rest is the cgroup's headroom.
        let mut spec = cpu_spec("2Gi");
        spec.resources.as_mut().unwrap().requests =
            Some([("cpu".to_string(), Quantity("2".into()))].into());
        let (d, planned) = render(spec);
        let want = format!("{}Mi", planned.pod_memory_bytes >> 20);
        assert_eq!(want, "2048Mi");
        assert!(planned.plan.total_bytes() < 2 << 30);
        let res = pod(&d).containers[0].resources.clone().unwrap();
        assert_eq!(memory(&res), [Some(want.clone()), Some(want)]);
        assert_eq!(
            res.requests.unwrap()["cpu"],
            Quantity("2".into()),
            "the user's other resources are kept"
        );
    }

    #[test]
    fn gpu_pods_request_their_host_memory() {
        let (d, planned) = render(gpu_spec(1, "80Gi"));
        let res = pod(&d).containers[0].resources.clone().unwrap();
        let want = format!("{}Mi", planned.pod_memory_bytes >> 20);
        assert_eq!(memory(&res), [Some(want), None]);
        // A larger request of the user's stands.
        let mut spec = gpu_spec(1, "80Gi");
        spec.resources = Some(ResourceRequirements {
            requests: Some([("memory".to_string(), Quantity("64Gi".into()))].into()),
            ..Default::default()
        });
        let (d, _) = render(spec);
        let res = pod(&d).containers[0].resources.clone().unwrap();
        assert_eq!(memory(&res), [Some("64Gi".into()), None]);
    }

    #[test]
    fn a_model_cache_claim_replaces_the_emptydir() {
        let mut spec = gpu_spec(1, "80Gi");
        spec.model.cache = Some(crate::crd::ModelCacheSpec {
            claim_name: "hf-cache".into(),
        });
        let (d, _) = render(spec);
        let vol = pod(&d).volumes.clone().unwrap();
        let cache = vol.iter().find(|v| v.name == "model-cache").unwrap();
        let pvc = cache.persistent_volume_claim.as_ref().unwrap();
        assert_eq!(
            (pvc.claim_name.as_str(), pvc.read_only),
            ("hf-cache", Some(false))
        );
        assert!(cache.empty_dir.is_none());
    }

    #[test]
    fn gpu_resources_and_product_selector() {
        let mut spec = gpu_spec(1, "80Gi");
        spec.accelerator.as_mut().unwrap().product = Some("NVIDIA-H100-80GB-HBM3".into());
        let (d, _) = render(spec);
        let pod = pod(&d);
        let res = pod.containers[0].resources.as_ref().unwrap();
        for map in [&res.limits, &res.requests] {
            assert_eq!(
                map.as_ref().unwrap()["nvidia.com/gpu"],
                Quantity("1".into())
            );
        }
        assert_eq!(
            pod.node_selector.as_ref().unwrap()[GPU_PRODUCT_LABEL],
            "NVIDIA-H100-80GB-HBM3"
        );
    }

    #[test]
    fn restricted_security_and_probes() {
        let (d, _) = render(cpu_spec("2Gi"));
        let pod = pod(&d);
        let c = &pod.containers[0];
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop,
            Some(vec!["ALL".to_string()])
        );
        assert_eq!(
            pod.security_context.as_ref().unwrap().run_as_non_root,
            Some(true)
        );
        let path = |p: &Option<Probe>| p.as_ref().unwrap().http_get.as_ref().unwrap().path.clone();
        assert_eq!(path(&c.liveness_probe).as_deref(), Some("/health"));
        assert_eq!(path(&c.readiness_probe).as_deref(), Some("/ready"));
        assert_eq!(path(&c.startup_probe).as_deref(), Some("/health"));
        // The grace period covers the pre-stop sleep, then the whole drain.
        let pre_stop = c.lifecycle.as_ref().unwrap().pre_stop.as_ref().unwrap();
        assert_eq!(
            pre_stop.sleep.as_ref().unwrap().seconds,
            PRE_STOP_SLEEP_SECONDS
        );
        assert!(
            pod.termination_grace_period_seconds.unwrap()
                > PRE_STOP_SLEEP_SECONDS + cpu_spec("2Gi").engine.drain_timeout_seconds
        );
        assert!(pod.node_selector.is_none());
        assert!(
            c.resources
                .as_ref()
                .unwrap()
                .limits
                .as_ref()
                .unwrap()
                .get("nvidia.com/gpu")
                .is_none()
        );
    }

    #[test]
    fn volumes_per_source() {
        let cases = [
            ("pvc://models/llama", vec!["tmp", "model"], Some(true)),
            ("hf://org/m", vec!["tmp", "model-cache"], None),
            ("https://h/m.gguf", vec!["tmp", "model-cache"], None),
            ("file:///m.gguf", vec!["tmp"], None),
        ];
        let md = md("llama", gpu_spec(1, "80Gi"));
        for (src, names, second_read_only) in cases {
            let source = source::parse(src).unwrap();
            let vols: Vec<_> = volumes(&md, &source).into_iter().map(|v| v.name).collect();
            assert_eq!(vols, names, "{src}");
            let mounts = volume_mounts(&source);
            assert_eq!(mounts.len(), names.len());
            assert_eq!(
                mounts.get(1).and_then(|m| m.read_only),
                second_read_only,
                "{src}"
            );
        }
    }

    #[test]
    fn replicas_come_from_the_spec() {
        let mut spec = gpu_spec(1, "80Gi");
        spec.replicas = 3;
        let (d, _) = render(spec);
        assert_eq!(d.spec.unwrap().replicas, Some(3));
    }
}
