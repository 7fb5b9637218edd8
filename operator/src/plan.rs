//! The capacity plan of a `ModelDeployment`: ferrox-plan fed from the spec,
//! the memory it is planned into, and what the pod must reserve for it.

use ferrox_plan::{
    CacheKind, DEFAULT_MAX_BATCH_TOKENS, DeviceKind, DraftPlan, KvDtype, ModelGeometry, Plan,
    PlanConfig, PlanError, Task,
};

use crate::crd::{
    ModelDeploymentSpec, ObservedGeometry, PlanStatus, PoolPlanStatus, SpeculativeSpec,
};
use crate::gpu_nodes::GpuTarget;
use crate::lora_plan::lora_plan;
use crate::{Error, quantity};

/// The memory one replica is planned into, and where that figure came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Memory {
    /// Bytes (one device's on GPU; the container's on CPU).
    pub bytes: u64,
    /// `status.plan.memoryFrom`.
    pub from: String,
}

/// A plan with everything around it the status and the pods need.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    /// The numbers.
    pub plan: Plan,
    /// What it was planned into.
    pub memory: Memory,
    /// The device it was planned for.
    pub device: DeviceKind,
    /// The KV dtype it was planned with (the server is told the same).
    pub kv_dtype: KvDtype,
    /// The pod's memory request (CPU: also its limit), whole MiB.
    pub pod_memory_bytes: u64,
    /// Tokens per request `max_seqs` was counted for.
    pub typical_seq_len: u64,
    /// What the pods serve (a pooling task plans no KV pool).
    pub task: Task,
}

/// Host memory a GPU server keeps beyond its devices, besides the logits it
/// copies back: the CPU runtime (code, threads, allocator) and the
/// tokenizer's tables, as ferrox-plan counts them for a CPU server.
pub fn gpu_host_base_bytes(geometry: &ModelGeometry) -> u64 {
    let cpu = PlanConfig::for_device(DeviceKind::Cpu);
    cpu.overhead(geometry)
}

/// Why a spec cannot be planned at all, before any geometry: a condition
/// reason and a message.
pub fn unsupported(spec: &ModelDeploymentSpec) -> Option<(&'static str, String)> {
    if let Err(e) = ferrox_source::parse_spec(&spec.model.source) {
        return Some(("InvalidSpec", e.to_string()));
    }
    let count = spec.accelerator.as_ref().map_or(1, |a| a.count);
    if count > 1 {
        return Some((
            "TensorParallelUnsupported",
            format!(
                "accelerator.count is {count}, but ferrox-server runs a model on one device: \
                 it cannot shard a model across GPUs yet; use count 1 (a smaller or quantized model) \
                 and scale replicas instead"
            ),
        ));
    }
    if let Some(Err(e)) = spec.speculative.as_ref().map(SpeculativeSpec::config) {
        return Some(("InvalidSpec", format!("spec.speculative: {e}")));
    }
    let draft = spec
        .speculative
        .as_ref()
        .and_then(SpeculativeSpec::draft_source);
    if let Some(Err(e)) = draft.map(ferrox_source::parse_spec) {
        return Some(("InvalidSpec", format!("spec.speculative.model: {e}")));
    }
    None
}

/// The memory `spec` plans into: the GPU target's device, or the container's
/// memory limit (else request) on CPU.
pub fn memory(spec: &ModelDeploymentSpec, gpu: Option<&GpuTarget>) -> Result<Memory, Error> {
    if spec.accelerator.is_some() {
        let gpu = gpu.ok_or(Error::Missing("the GPU nodes to plan for"))?;
        let from = match gpu.memory_from {
            "spec" => "spec.accelerator.memoryPerDevice".to_string(),
            _ => format!(
                "the smallest {} label of {} matching nodes",
                crate::gpu_nodes::GPU_MEMORY_LABEL,
                gpu.nodes
            ),
        };
        return Ok(Memory {
            bytes: gpu.memory_per_device,
            from,
        });
    }
    let resources = spec.resources.as_ref();
    let pick = |limits: bool| {
        let map = resources.and_then(|r| {
            if limits {
                r.limits.as_ref()
            } else {
                r.requests.as_ref()
            }
        });
        map.and_then(|m| m.get("memory"))
    };
    let (q, from) = match (pick(true), pick(false)) {
        (Some(q), _) => (q, "spec.resources.limits.memory"),
        (None, Some(q)) => (q, "spec.resources.requests.memory"),
        (None, None) => {
            return Err(Error::InvalidSpec(
                "no accelerator and no resources.limits.memory to plan from".into(),
            ));
        }
    };
    Ok(Memory {
        bytes: quantity::bytes(q)?,
        from: from.into(),
    })
}

/// The ferrox-plan inputs the spec asks for, in `memory_bytes`.
pub fn plan_config(spec: &ModelDeploymentSpec, memory_bytes: u64) -> PlanConfig {
    let engine = &spec.engine;
    let defaults = PlanConfig::for_device(device_kind(spec));
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    PlanConfig {
        memory_bytes,
        utilization: engine.memory_utilization,
        block_size: n(i64::from(engine.block_size)),
        max_model_len: engine.max_model_len.map(n),
        // Absent, the server's own default for the device (one figure, in
        // ferrox-plan), so a pod and `ferrox-server serve` run the same.
        max_seqs_cap: engine
            .max_seqs
            .map(n)
            .or(Some(device_kind(spec).default_max_seqs())),
        prefill_chunk: engine
            .prefill_chunk
            .map_or(defaults.prefill_chunk, |v| n(v).max(1)),
        typical_seq_len: Some(n(engine.typical_seq_len).max(1)),
        speculative_tokens: (spec.speculative.as_ref())
            .map_or(0, |s| u64::from(s.num_speculative_tokens)),
        ..defaults
    }
}

/// The device the spec's pods serve on: a GPU when it asks for accelerators.
pub fn device_kind(spec: &ModelDeploymentSpec) -> DeviceKind {
    if spec.accelerator.is_some() {
        DeviceKind::Cuda
    } else {
        DeviceKind::Cpu
    }
}

/// What a deployment serves: `spec.task`, else the task its model's files
/// say (`inspect` records it with the geometry), else `generate`.
pub fn task(spec: &ModelDeploymentSpec, geometry: Option<&ObservedGeometry>) -> Task {
    spec.task
        .or_else(|| geometry.and_then(|g| g.task))
        .unwrap_or_default()
}

/// The plan for `spec` serving `task` with `geometry` (as held on the
/// spec's device) and a draft model's terms, in `memory`.
pub fn planned(
    spec: &ModelDeploymentSpec,
    task: Task,
    geometry: &ModelGeometry,
    draft: Option<DraftPlan>,
    memory: Memory,
) -> Result<Planned, PlanError> {
    let device = device_kind(spec);
    let lora = lora_plan(spec);
    let config = PlanConfig {
        adapter_bytes: lora.map_or(0, |l| l.device_bytes(geometry, device)),
        draft,
        ..plan_config(spec, memory.bytes)
    };
    let plan = match task {
        Task::Generate => ferrox_plan::plan(geometry, &config)?,
        // No pool: weights and one batch, as the server plans it.
        Task::Embed | Task::Score => {
            let tokens = spec
                .engine
                .max_batch_tokens
                .map_or(DEFAULT_MAX_BATCH_TOKENS, |t| u64::try_from(t).unwrap_or(1));
            ferrox_plan::plan_pooling(geometry, &config, tokens)?
        }
    };
    // A GPU server also keeps every adapter in host memory.
    let host_adapters = lora.map_or(0, |l| l.host_bytes(geometry, device));
    let pod_memory_bytes = pod_memory_bytes(device, &plan, geometry, memory.bytes)
        .saturating_add(host_adapters.div_ceil(1 << 20) << 20);
    let typical_seq_len = config
        .typical_seq_len
        .unwrap_or(plan.max_model_len)
        .clamp(1, plan.max_model_len);
    Ok(Planned {
        plan,
        memory,
        device,
        kv_dtype: geometry.kv_dtype,
        pod_memory_bytes,
        typical_seq_len,
        task,
    })
}

/// What the pod must reserve for the plan: on CPU the memory planned from
/// (`memory`, of which the plan uses `utilization`: the rest is the cgroup's
/// headroom for what the kernel charges it beyond the process, the model
/// file's page cache and kernel memory; a limit of exactly the plan's total
/// was OOM-killed on cgroup v1), never below the plan's total; on GPU what
/// stays on the host, [`gpu_host_base_bytes`] plus two host copies of the
/// logits of every row. Rounded up to a whole MiB.
pub fn pod_memory_bytes(
    device: DeviceKind,
    plan: &Plan,
    geometry: &ModelGeometry,
    memory: u64,
) -> u64 {
    let bytes = match device {
        DeviceKind::Cpu => plan.total_bytes().max(memory),
        DeviceKind::Cuda => gpu_host_base_bytes(geometry).saturating_add(
            plan.max_seqs
                .saturating_mul(geometry.vocab_size)
                .saturating_mul(4 * 2),
        ),
    };
    bytes.div_ceil(1 << 20).saturating_mul(1 << 20)
}

/// The plan for `spec` planned offline from what is known of its model
/// (and draft): the GPU memory must be in the spec.
pub fn plan_observed(spec: &ModelDeploymentSpec, g: &ObservedGeometry) -> Result<Planned, Error> {
    let device = device_kind(spec);
    let held = crate::geometry::held_on(g, device);
    let draft = (g.draft.as_ref()).map(|d| crate::geometry::draft_plan(d, device, held.kv_dtype));
    offline(spec, task(spec, Some(g)), &held, draft)
}

/// The plan for `spec` with `geometry` planned offline: the GPU memory must
/// be in the spec.
pub fn plan_offline(
    spec: &ModelDeploymentSpec,
    geometry: &ModelGeometry,
) -> Result<Planned, Error> {
    offline(spec, task(spec, None), geometry, None)
}

fn offline(
    spec: &ModelDeploymentSpec,
    task: Task,
    geometry: &ModelGeometry,
    draft: Option<DraftPlan>,
) -> Result<Planned, Error> {
    let gpu = match &spec.accelerator {
        Some(acc) => Some(crate::gpu_nodes::target(spec, acc, &[]).map_err(|_| {
            Error::InvalidSpec(
                "no cluster to read GPU nodes from: set spec.accelerator.memoryPerDevice".into(),
            )
        })?),
        None => None,
    };
    let memory = memory(spec, gpu.as_ref())?;
    planned(spec, task, geometry, draft, memory).map_err(|e| Error::InvalidSpec(e.to_string()))
}

/// A plan as the status reports it.
pub fn to_status(p: &Planned) -> PlanStatus {
    let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let plan = &p.plan;
    PlanStatus {
        kv_blocks: n(plan.blocks(CacheKind::Full)),
        block_size: n(plan.block_size),
        max_seqs: n(plan.max_seqs),
        kv_bytes_per_token: n(plan
            .pool(CacheKind::Full)
            .map_or(0, |f| f.block_bytes / plan.block_size.max(1))),
        weight_bytes: n(plan.weight_bytes),
        kv_budget_bytes: n(plan.kv_budget_bytes),
        activation_reserve_bytes: n(plan.activation_reserve_bytes),
        overhead_bytes: n(plan.overhead_bytes),
        adapter_bytes: n(plan.adapter_bytes),
        total_bytes: n(plan.total_bytes()),
        memory_bytes: n(p.memory.bytes),
        memory_from: p.memory.from.clone(),
        device: p.device.to_string(),
        pod_memory_bytes: n(p.pod_memory_bytes),
        max_model_len: n(plan.max_model_len),
        typical_seq_len: n(p.typical_seq_len),
        pools: plan
            .pools
            .iter()
            .map(|p| PoolPlanStatus {
                pool: p.kind.to_string(),
                layers: n(p.layers),
                blocks: n(p.blocks),
                block_bytes: n(p.block_bytes),
                blocks_per_seq: n(p.blocks_per_seq),
            })
            .collect(),
        params: (plan.params > 0).then(|| n(plan.params)),
        active_params: (plan.active_params > 0).then(|| n(plan.active_params)),
        draft_bytes: (plan.draft_bytes > 0).then(|| n(plan.draft_bytes)),
        task: p.task,
    }
}

#[cfg(test)]
mod tests;
