//! The `ModelDeployment` custom resource (`ferrox.dev/v1alpha1`).
//!
//! The Rust types are the source of truth: `ferrox-operator crdgen` renders them
//! to `crds/modeldeployment.yaml`, and a test fails when that file drifts.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, EnvVar, LocalObjectReference, ResourceRequirements, SecretKeySelector, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What the user asks for: one model, served by ferrox-server pods.
// Several printer columns share a type; clippy reads that as a duplicate.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "ferrox.dev",
    version = "v1alpha1",
    kind = "ModelDeployment",
    namespaced,
    shortname = "md",
    status = "ModelDeploymentStatus",
    derive = "PartialEq",
    doc = "A model served by ferrox-server, sized from its geometry and the accelerator's memory.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "Model", type_ = "string", json_path = ".status.servedName"),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(
        name = "Max Seqs",
        type_ = "integer",
        json_path = ".status.plan.maxSeqs"
    ),
    printcolumn(
        name = "KV Blocks",
        type_ = "integer",
        json_path = ".status.plan.kvBlocks"
    ),
    printcolumn(
        name = "Server KV",
        type_ = "integer",
        json_path = ".status.observedPlan.kvBlocks"
    ),
    printcolumn(
        name = "Verified",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"PlanVerified\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new(
    "!has(self.adapters) || !has(self.model.servedName) || self.adapters.all(a, a.name != self.model.servedName)"
).message("an adapter's name must not be the model's servedName"))]
#[x_kube(validation = Rule::new(
    "has(self.accelerator) || (has(self.resources) && ((has(self.resources.limits) && 'memory' in self.resources.limits) || (has(self.resources.requests) && 'memory' in self.resources.requests)))"
).message("without spec.accelerator, spec.resources.limits.memory (or requests.memory) is needed to plan the KV cache"))]
#[x_kube(validation = Rule::new(
    "has(self.accelerator) || !has(self.kvCache) || !has(self.kvCache.offload) || !has(self.kvCache.offload.hostMemory)"
).message(CPU_HOST_TIER_MESSAGE))]
#[serde(rename_all = "camelCase")]
pub struct ModelDeploymentSpec {
    /// The model to serve.
    pub model: ModelSpec,
    /// What it serves: `generate` (completions and chat; the default),
    /// `embed` (`/v1/embeddings`: planned with no KV pool, weights plus one
    /// batch of `engine.maxBatchTokens`) or `score`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<ferrox_plan::Task>,
    /// Accelerators per replica; absent means CPU-only, planned from `resources` memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator: Option<AcceleratorSpec>,
    /// Engine tuning passed to ferrox-server.
    #[serde(default)]
    pub engine: EngineSpec,
    /// Desired replicas; the scale subresource (and so any autoscaler) writes this field.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0))]
    pub replicas: i32,
    /// Scaling on queue depth and KV usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<AutoscalingSpec>,
    /// ferrox-server image; the operator's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Container resources (CPU-only plans read `limits.memory`, else `requests.memory`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Node selector for the server pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Tolerations for the server pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Affinity for the server pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Extra environment for the server container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<EnvVar>>,
    /// Pull secrets for the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,
    /// Service account of the server pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// The Service in front of the replicas.
    #[serde(default)]
    pub service: ServiceSpec,
    /// Also render a Gateway API Inference Extension `InferencePool`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inference_pool: Option<InferencePoolSpec>,
    /// Who may call the servers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthSpec>,
    /// LoRA adapters served on the model (rendered into the pods' args:
    /// adding or removing one rolls the pods).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("self.all(a, self.exists_one(b, b.name == a.name))").message("adapters[].name must be unique"))]
    pub adapters: Vec<AdapterSpec>,
    /// How the servers hold the adapters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraSpec>,
    /// Speculative decoding (`--speculative-config`); off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculative: Option<SpeculativeSpec>,
    /// The KV cache beyond the device pool (lower tiers); none when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<KvCacheSpec>,
}

/// Access to the servers' OpenAI routes (`/health`, `/ready` and `/metrics`
/// stay open for probes and scraping).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[x_kube(validation = Rule::new("self.apiKeySecretRef.name != '' && self.apiKeySecretRef.key != ''").message("auth.apiKeySecretRef needs the Secret's name and key"))]
#[serde(rename_all = "camelCase")]
pub struct AuthSpec {
    /// A key of a Secret in this namespace holding the API keys clients send
    /// as `Authorization: Bearer <key>` (several: comma-separated). Passed to
    /// the server as `FERROX_API_KEY`; a changed Secret takes effect when the
    /// pods restart.
    pub api_key_secret_ref: SecretKeySelector,
}

fn default_replicas() -> i32 {
    1
}

/// Where the model comes from and what it is called on the API.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelSpec {
    /// `hf://org/name[@rev][/file.gguf]`, `pvc://claim/path`, `file:///path` or `https://...`.
    #[x_kube(validation = Rule::new(ferrox_source::cel_rule()).message(SOURCE_MESSAGE))]
    // A bound on the length keeps the regex within the API server's CEL cost budget.
    #[schemars(length(min = 1, max = 2048))]
    pub source: String,
    /// Model name clients send in requests; `metadata.name` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub served_name: Option<String>,
    /// Geometry to plan with, instead of inspecting the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub geometry: Option<GeometrySpec>,
    /// A shared, writable cache for downloaded models (`hf://`, `https://`),
    /// so that replicas download once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<ModelCacheSpec>,
}

/// The CEL message for a source the grammar refuses.
pub const SOURCE_MESSAGE: &str = "model.source must be hf://org/name[@rev][/file], pvc://claim/path, file:///path or https://host/file";

/// A PersistentVolumeClaim that holds downloaded models across replicas.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelCacheSpec {
    /// The claim's name (ReadWriteMany when replicas share nodes' models).
    #[schemars(length(min = 1, max = 253))]
    pub claim_name: String,
}

/// Accelerators per replica.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AcceleratorSpec {
    /// Extended resource name.
    #[serde(default = "default_gpu_resource")]
    pub resource_name: String,
    /// Devices per replica; more than 1 is refused until the server can shard a model.
    #[serde(default = "default_one")]
    #[schemars(range(min = 1, max = 64))]
    pub count: i32,
    /// Memory of one device, e.g. `80Gi`; absent means the smallest
    /// `nvidia.com/gpu.memory` label among the nodes the pods can land on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_per_device: Option<Quantity>,
    /// Value of the `nvidia.com/gpu.product` node label to schedule on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub product: Option<String>,
}

fn default_gpu_resource() -> String {
    "nvidia.com/gpu".into()
}

fn default_one() -> i32 {
    1
}

/// Engine flags of ferrox-server.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct EngineSpec {
    /// Tokens per KV block.
    #[serde(default = "default_block_size")]
    #[schemars(range(min = 1, max = 1024))]
    pub block_size: i32,
    /// Fraction of memory the server may use.
    #[serde(default = "default_utilization")]
    #[x_kube(validation = Rule::new("self > 0.0 && self <= 1.0").message("engine.memoryUtilization must be in (0, 1]"))]
    pub memory_utilization: f64,
    /// Longest sequence served; the model's context length when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_model_len: Option<i64>,
    /// Upper bound on concurrent sequences.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_seqs: Option<i64>,
    /// Tokens (prompt + completion) of a typical request: `maxSeqs` is
    /// planned as the pool's blocks over this many tokens' blocks.
    #[serde(default = "default_typical_seq_len")]
    #[schemars(range(min = 1))]
    pub typical_seq_len: i64,
    /// Prompt tokens per prefill chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub prefill_chunk: Option<i64>,
    /// Bound on the waiting line before requests are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_queue: Option<i64>,
    /// Most tokens in one batch of an embedding model (`task: embed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_batch_tokens: Option<i64>,
    /// Seconds the server drains in-flight requests on shutdown.
    #[serde(default = "default_drain")]
    #[schemars(range(min = 0, max = 3600))]
    pub drain_timeout_seconds: i64,
    /// Extra arguments appended to `ferrox-server serve`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_args: Vec<String>,
}

fn default_block_size() -> i32 {
    ferrox_plan::DEFAULT_BLOCK_SIZE as i32
}

fn default_utilization() -> f64 {
    ferrox_plan::DEFAULT_UTILIZATION
}

/// The default `engine.typicalSeqLen`: a chat turn's prompt and answer.
pub const DEFAULT_TYPICAL_SEQ_LEN: i64 = ferrox_plan::DEFAULT_TYPICAL_SEQ_LEN as i64;

fn default_typical_seq_len() -> i64 {
    DEFAULT_TYPICAL_SEQ_LEN
}

fn default_drain() -> i64 {
    30
}

impl Default for EngineSpec {
    fn default() -> Self {
        EngineSpec {
            block_size: default_block_size(),
            memory_utilization: default_utilization(),
            max_model_len: None,
            max_seqs: None,
            typical_seq_len: default_typical_seq_len(),
            prefill_chunk: None,
            max_queue: None,
            max_batch_tokens: None,
            drain_timeout_seconds: default_drain(),
            extra_args: Vec::new(),
        }
    }
}

/// Who scales the replicas, and on what.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[x_kube(validation = Rule::new("self.minReplicas <= self.maxReplicas").message("autoscaling.minReplicas must not exceed autoscaling.maxReplicas"))]
#[x_kube(validation = Rule::new("!self.enabled || self.minReplicas >= 1 || self.mode != 'hpa'").message(MIN_ZERO_MESSAGE))]
#[serde(rename_all = "camelCase")]
pub struct AutoscalingSpec {
    /// Whether replicas follow load.
    #[serde(default)]
    pub enabled: bool,
    /// Fewest replicas; 0 (scale from zero through ferrox-router) with
    /// `mode: builtin` or `keda`, not `hpa` (CEL).
    #[serde(default = "default_one")]
    #[schemars(range(min = 0))]
    pub min_replicas: i32,
    /// Most replicas.
    #[schemars(range(min = 1))]
    pub max_replicas: i32,
    /// Waiting requests one replica should carry.
    #[serde(default = "default_target_queue")]
    #[x_kube(validation = Rule::new("self > 0.0").message("autoscaling.targetQueuePerReplica must be positive"))]
    pub target_queue_per_replica: f64,
    /// Mean KV usage ratio to hold, in (0, 1].
    #[serde(default = "default_target_kv")]
    #[x_kube(validation = Rule::new("self > 0.0 && self <= 1.0").message("autoscaling.targetKvUsage must be in (0, 1]"))]
    pub target_kv_usage: f64,
    /// A higher recommendation must hold this long before scaling up.
    #[serde(default = "default_up_window")]
    #[schemars(range(min = 0, max = 3600))]
    pub scale_up_stabilization_seconds: i64,
    /// A lower recommendation must hold this long before scaling down.
    #[serde(default = "default_down_delay")]
    #[schemars(range(min = 0, max = 86400))]
    pub scale_down_delay_seconds: i64,
    /// With `minReplicas: 0`, seconds without requests and without running
    /// or waiting work before the built-in autoscaler scales to zero.
    #[serde(default = "default_scale_to_zero_after")]
    #[schemars(range(min = 1, max = 604800))]
    pub scale_to_zero_after_seconds: i64,
    /// `builtin` (this operator), `hpa` or `keda`.
    #[serde(default)]
    pub mode: AutoscalingMode,
}

/// Why `minReplicas: 0` is refused with an HPA.
pub const MIN_ZERO_MESSAGE: &str = "autoscaling.minReplicas 0 needs mode builtin or keda: an HPA reads load from running pods, so from zero replicas it could never scale up (the built-in autoscaler and KEDA wake on the requests waiting in ferrox-router)";

fn default_scale_to_zero_after() -> i64 {
    600
}

fn default_target_queue() -> f64 {
    4.0
}

fn default_target_kv() -> f64 {
    0.8
}

fn default_up_window() -> i64 {
    30
}

fn default_down_delay() -> i64 {
    300
}

/// Which autoscaler acts.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AutoscalingMode {
    /// The operator scrapes the pods and writes the scale subresource.
    #[default]
    Builtin,
    /// A HorizontalPodAutoscaler on `ferrox_requests_waiting`.
    Hpa,
    /// A KEDA ScaledObject with a Prometheus trigger.
    Keda,
}

/// The Service in front of the replicas.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    /// Service type.
    #[serde(default = "default_service_type", rename = "type")]
    #[x_kube(validation = Rule::new("self in ['ClusterIP', 'NodePort', 'LoadBalancer']").message("service.type must be ClusterIP, NodePort or LoadBalancer"))]
    pub type_: String,
    /// Service port.
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
}

fn default_service_type() -> String {
    "ClusterIP".into()
}

fn default_port() -> i32 {
    8000
}

impl Default for ServiceSpec {
    fn default() -> Self {
        ServiceSpec {
            type_: default_service_type(),
            port: default_port(),
        }
    }
}

/// An `InferencePool` (`inference.networking.k8s.io/v1`) over the pods, so a
/// GAIE-enabled gateway routes on the servers' vLLM-named gauges.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferencePoolSpec {
    /// The endpoint picker (EPP) Service the gateway consults.
    pub endpoint_picker: EndpointPickerSpec,
}

/// A reference to an endpoint picker Service.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointPickerSpec {
    /// Service name, in the ModelDeployment's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Its gRPC port.
    #[serde(default = "default_epp_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// `FailClose` (default) or `FailOpen` when the picker does not answer.
    #[serde(default = "default_failure_mode")]
    #[x_kube(validation = Rule::new("self in ['FailOpen', 'FailClose']").message("inferencePool.endpointPicker.failureMode must be FailOpen or FailClose"))]
    pub failure_mode: String,
}

fn default_epp_port() -> i32 {
    9002
}

fn default_failure_mode() -> String {
    "FailClose".into()
}

impl ModelDeployment {
    /// The autoscaling block when the built-in autoscaler owns the replica count.
    pub fn builtin_autoscaling(&self) -> Option<&AutoscalingSpec> {
        self.spec
            .autoscaling
            .as_ref()
            .filter(|a| a.enabled && a.mode == AutoscalingMode::Builtin)
    }
}

/// The CRD as YAML, exactly as committed under `crds/`.
pub fn crd_yaml() -> String {
    let crd = ModelDeployment::crd();
    format!(
        "# Generated by `ferrox-operator crdgen`; do not edit.\n{}",
        serde_yaml::to_string(&crd).expect("CRD serialises")
    )
}

mod adapters;
mod geometry;
mod kv_cache;
mod speculative;
mod status;

pub use adapters::*;
pub use geometry::*;
pub use kv_cache::*;
pub use speculative::*;
pub use status::*;

#[cfg(test)]
mod tests;
