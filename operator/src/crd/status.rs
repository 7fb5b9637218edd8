//! The `ModelDeployment` status: what the operator observed and decided.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use ferrox_plan::KvDtype;

use super::{AdapterStatus, GeometrySpec};

/// What the operator observed and decided.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelDeploymentStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ready, Progressing, Degraded, Planned and PlanVerified.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Pods of the server Deployment.
    #[serde(default)]
    pub replicas: i32,
    /// Ready pods of the server Deployment.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Label selector of the pods, for the scale subresource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The model name clients send (`spec.model.servedName`, else `metadata.name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_name: Option<String>,
    /// Where clients reach the model: ferrox-router's Service when the
    /// operator knows one, else the model's own Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The accelerators planned for: from the nodes, or the spec's override.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator: Option<AcceleratorStatus>,
    /// The geometry planned with, and the source it was inspected from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub geometry: Option<ObservedGeometry>,
    /// The capacity plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanStatus>,
    /// What the ready servers report they run with (written by the scraper).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_plan: Option<ObservedPlanStatus>,
    /// The built-in autoscaler's last decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaler: Option<AutoscalerStatus>,
    /// The LoRA adapters, and how many ready replicas serve each (written
    /// by the scraper).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adapters: Vec<AdapterStatus>,
    /// The lower KV tiers' blocks, hits and misses, summed over the ready
    /// servers (written by the scraper).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kv_tiers: Vec<KvTierStatus>,
}

/// One lower KV tier, summed over the ready servers' `/metrics`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KvTierStatus {
    /// `host` or `disk`.
    pub tier: String,
    /// Blocks it holds.
    pub blocks: i64,
    /// Blocks it can hold.
    pub capacity_blocks: i64,
    /// Lookups it answered since the servers started.
    pub hits: i64,
    /// Lookups that fell through it since the servers started.
    pub misses: i64,
}

/// The GPUs a plan was made for.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AcceleratorStatus {
    /// `nvidia.com/gpu.product` of the matching nodes (comma-separated when mixed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub product: Option<String>,
    /// Bytes of one device planned with.
    pub memory_per_device_bytes: i64,
    /// `nodes` (the smallest `nvidia.com/gpu.memory` label) or `spec` (`memoryPerDevice`).
    pub memory_from: String,
    /// Nodes the pods can be scheduled on.
    pub nodes: i32,
}

/// The plan the servers report on `/metrics` (`vllm:cache_config_info` and
/// the `ferrox_plan_*` gauges), from the reporting pod with the fewest blocks.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedPlanStatus {
    /// Ready pods that reported a plan.
    pub pods: i32,
    /// Pods whose plan differs from the operator's.
    pub disagreeing_pods: i32,
    /// KV blocks in the pool.
    pub kv_blocks: i64,
    /// Tokens per block.
    pub block_size: i64,
    /// KV cache element type.
    pub kv_dtype: String,
    /// Concurrent sequences, if reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_seqs: Option<i64>,
    /// Bytes of weights, if reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_bytes: Option<i64>,
    /// Memory the server planned from, if reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<i64>,
    /// Where that figure came from (`cgroup-v2`, `cuda`, `kv-blocks`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_source: Option<String>,
    /// Every pool's blocks, by kind, if the server reports them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<ObservedPoolStatus>,
    /// Speculative decoding: of the draft tokens the reporting servers
    /// verified since they started, the percent accepted (rounded); absent
    /// when none verified any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_acceptance_percent: Option<i32>,
}

/// One pool a server reports it runs with.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedPoolStatus {
    /// The pool's cache kind: `full`, `window:TOKENS` or `state`.
    pub pool: String,
    /// Blocks in it (a state pool's: its slots).
    pub blocks: i64,
}

/// Geometry as learnt, with where it came from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedGeometry {
    /// `spec` or the inspected source.
    pub source: String,
    /// The numbers planned with (weights and KV dtype as held on the device).
    pub geometry: GeometrySpec,
    /// How the model is held on each kind of device, as inspected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<DeviceFootprints>,
    /// What the model's files say it serves, as inspected (`spec.task`
    /// overrides it; absent: `generate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<ferrox_plan::Task>,
    /// The draft model's (`spec.speculative.model`), when one is named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft: Option<DraftGeometry>,
}

/// A draft model's geometry as learnt, with where it came from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DraftGeometry {
    /// `spec` or the inspected draft source.
    pub source: String,
    /// Its numbers (weights and KV dtype as held on the device).
    pub geometry: GeometrySpec,
    /// How it is held on each kind of device, as inspected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<DeviceFootprints>,
}

/// `ferrox-server inspect --json`'s `devices`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct DeviceFootprints {
    /// On CPU.
    pub cpu: FootprintStatus,
    /// On CUDA.
    pub cuda: FootprintStatus,
}

/// A model's bytes as held on one kind of device.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FootprintStatus {
    /// Bytes of weights resident there.
    pub weight_bytes: i64,
    /// KV element type used there.
    pub kv_dtype: KvDtype,
    /// KV bytes per token in that type.
    pub kv_bytes_per_token: i64,
}

/// The plan's numbers.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanStatus {
    /// Blocks in each replica's full-attention pool (0 when the model has
    /// none; every pool by kind is in `pools`).
    pub kv_blocks: i64,
    /// Tokens per block.
    pub block_size: i64,
    /// Concurrent sequences per replica.
    pub max_seqs: i64,
    /// KV bytes per token in the full-attention pool.
    pub kv_bytes_per_token: i64,
    /// Weight bytes.
    pub weight_bytes: i64,
    /// Bytes of every pool together.
    pub kv_budget_bytes: i64,
    /// Bytes held back for one step's activations.
    pub activation_reserve_bytes: i64,
    /// Bytes held back for the runtime.
    pub overhead_bytes: i64,
    /// Bytes held for LoRA adapters (`spec.lora.maxLoras` of
    /// `maxLoraRank`; every adapter on CPU).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub adapter_bytes: i64,
    /// Weights + KV + activations + overhead.
    pub total_bytes: i64,
    /// Memory planned from (per replica; `utilization` of it is used).
    pub memory_bytes: i64,
    /// Where that figure came from.
    pub memory_from: String,
    /// `cpu` or `cuda`.
    pub device: String,
    /// The pod's memory request (and on CPU its limit), in bytes.
    pub pod_memory_bytes: i64,
    /// Longest sequence served.
    pub max_model_len: i64,
    /// Tokens per request `maxSeqs` was planned for.
    pub typical_seq_len: i64,
    /// Every pool of the plan, by kind: full attention, each sliding
    /// window, the recurrent state slots (the server's `--pool` flags).
    #[serde(default)]
    pub pools: Vec<PoolPlanStatus>,
    /// The model's parameters, every expert counted (absent if unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<i64>,
    /// Parameters one token runs through (absent if unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_params: Option<i64>,
    /// Bytes of the draft model's weights and its KV pool (absent without
    /// one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_bytes: Option<i64>,
    /// What the pods serve: `spec.task`, else what inspection found.
    #[serde(default)]
    pub task: ferrox_plan::Task,
}

/// One pool of the plan: the blocks of one kind of cache.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolPlanStatus {
    /// The cache kind, which names the pool: `full`, `window:TOKENS` or
    /// `state`.
    pub pool: String,
    /// Layers it serves.
    pub layers: i64,
    /// Blocks in it (a state pool's: its slots, one a sequence).
    pub blocks: i64,
    /// Bytes of one block (`blockSize` tokens in every layer; a state
    /// pool's: one sequence's state over every recurrent layer).
    pub block_bytes: i64,
    /// The most blocks one `maxModelLen` sequence holds here: its length's
    /// (full), its window plus a prefill chunk, page-aligned (window), one
    /// (state).
    pub blocks_per_seq: i64,
}

/// The built-in autoscaler's last decision.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalerStatus {
    /// Replicas it wants.
    pub desired_replicas: i32,
    /// When it last changed `spec.replicas` (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<String>,
    /// When it last scaled from zero on requests waiting in ferrox-router (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_wake_time: Option<String>,
    /// Why.
    pub reason: String,
    /// Waiting requests summed over ready pods.
    pub observed_queue: f64,
    /// Requests waiting in ferrox-router for a ready replica.
    #[serde(default)]
    pub observed_pending: f64,
    /// Mean KV usage ratio over ready pods.
    pub observed_kv_usage: f64,
    /// Pods scraped.
    pub observed_pods: i32,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}
