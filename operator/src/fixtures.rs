//! Test builders shared by the unit tests.

use std::collections::BTreeMap;

use ferrox_plan::{KvDtype, ModelGeometry, SlidingWindow};
use k8s_openapi::api::core::v1::{
    Node, NodeSpec, NodeStatus, ResourceRequirements, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::ObjectMeta;

use crate::crd::{
    AcceleratorSpec, AutoscalingMode, AutoscalingSpec, EngineSpec, ModelDeployment,
    ModelDeploymentSpec, ModelSpec, ServiceSpec, SpeculativeMethod, SpeculativeSpec,
};

/// SmolLM2-135M-Instruct, GGUF Q4_1 (the project's demo model).
pub fn smollm2_135m() -> ModelGeometry {
    ModelGeometry {
        layers: 30,
        kv_heads: 3,
        head_dim: 64,
        kv_dtype: KvDtype::F32,
        weight_bytes: 98_362_432,
        context_length: 8192,
        ..ModelGeometry::default()
    }
}

/// Llama-3-8B in bf16.
pub fn llama3_8b() -> ModelGeometry {
    ModelGeometry {
        layers: 32,
        kv_heads: 8,
        head_dim: 128,
        kv_dtype: KvDtype::Bf16,
        weight_bytes: 16_060_522_496,
        context_length: 8192,
        ..ModelGeometry::default()
    }
}

/// Llama-3-70B in bf16.
pub fn llama3_70b() -> ModelGeometry {
    ModelGeometry {
        layers: 80,
        kv_heads: 8,
        head_dim: 128,
        kv_dtype: KvDtype::Bf16,
        weight_bytes: 141_107_412_992,
        context_length: 8192,
        ..ModelGeometry::default()
    }
}

/// Gemma 4 31B in bf16: 60 layers, 50 sliding over 1024 tokens with 16 KV
/// heads of 256, the other 10 global with 4 KV heads of 512.
pub fn gemma4_31b() -> ModelGeometry {
    ModelGeometry {
        layers: 60,
        kv_heads: 16,
        head_dim: 256,
        full_kv_heads: 4,
        full_head_dim: 512,
        kv_dtype: KvDtype::Bf16,
        weight_bytes: 61_400_000_000,
        context_length: 262_144,
        sliding_windows: vec![SlidingWindow {
            window: 1024,
            layers: 50,
        }],
        ..ModelGeometry::default()
    }
}

fn base_spec(source: &str) -> ModelDeploymentSpec {
    ModelDeploymentSpec {
        model: ModelSpec {
            source: source.into(),
            served_name: Some("model".into()),
            geometry: None,
            cache: None,
        },
        task: None,
        accelerator: None,
        engine: EngineSpec::default(),
        replicas: 1,
        autoscaling: None,
        image: None,
        resources: None,
        node_selector: None,
        tolerations: None,
        affinity: None,
        env: None,
        image_pull_secrets: None,
        service_account_name: None,
        service: ServiceSpec::default(),
        inference_pool: None,
        auth: None,
        adapters: Vec::new(),
        lora: None,
        speculative: None,
        kv_cache: None,
    }
}

/// A spec with `count` GPUs of `memory` each.
pub fn gpu_spec(count: i32, memory: &str) -> ModelDeploymentSpec {
    ModelDeploymentSpec {
        accelerator: Some(AcceleratorSpec {
            resource_name: "nvidia.com/gpu".into(),
            count,
            memory_per_device: Some(Quantity(memory.into())),
            product: None,
        }),
        ..base_spec("hf://meta-llama/Meta-Llama-3-8B-Instruct")
    }
}

/// A CPU-only spec with `memory` as its limit.
pub fn cpu_spec(memory: &str) -> ModelDeploymentSpec {
    ModelDeploymentSpec {
        resources: Some(ResourceRequirements {
            limits: Some(BTreeMap::from([(
                "memory".to_string(),
                Quantity(memory.into()),
            )])),
            ..Default::default()
        }),
        ..base_spec("file:///models/SmolLM2-135M-Instruct.Q4_1.gguf")
    }
}

/// A GPU node as GPU Feature Discovery labels it: `gpus` devices of
/// `product`, `memory_mib` each, tainted `nvidia.com/gpu:NoSchedule`.
pub fn gpu_node(name: &str, product: &str, memory_mib: u64, gpus: u32) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([
                ("nvidia.com/gpu.product".to_string(), product.to_string()),
                ("nvidia.com/gpu.memory".to_string(), memory_mib.to_string()),
                ("nvidia.com/gpu.count".to_string(), gpus.to_string()),
            ])),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: Some(vec![Taint {
                key: "nvidia.com/gpu".into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            allocatable: Some(BTreeMap::from([(
                "nvidia.com/gpu".to_string(),
                Quantity(gpus.to_string()),
            )])),
            ..Default::default()
        }),
    }
}

/// The toleration GPU pods carry for [`gpu_node`]'s taint.
pub fn gpu_toleration() -> Toleration {
    Toleration {
        key: Some("nvidia.com/gpu".into()),
        operator: Some("Exists".into()),
        effect: Some("NoSchedule".into()),
        ..Default::default()
    }
}

/// Built-in autoscaling between `min` and `max`.
pub fn autoscaling(min: i32, max: i32) -> AutoscalingSpec {
    AutoscalingSpec {
        enabled: true,
        min_replicas: min,
        max_replicas: max,
        target_queue_per_replica: 4.0,
        target_kv_usage: 0.8,
        scale_up_stabilization_seconds: 30,
        scale_down_delay_seconds: 300,
        scale_to_zero_after_seconds: 600,
        mode: AutoscalingMode::Builtin,
    }
}

/// A stored ModelDeployment named `name` in `default`, generation 1.
pub fn md(name: &str, spec: ModelDeploymentSpec) -> ModelDeployment {
    let mut md = ModelDeployment::new(name, spec);
    md.metadata = ObjectMeta {
        name: Some(name.into()),
        namespace: Some("default".into()),
        uid: Some(format!("uid-{name}")),
        generation: Some(1),
        resource_version: Some("1".into()),
        ..Default::default()
    };
    md
}

/// Speculation by a draft model from `source`, 4 drafts a step.
pub fn draft(source: &str) -> SpeculativeSpec {
    SpeculativeSpec {
        method: SpeculativeMethod::DraftModel,
        num_speculative_tokens: 4,
        prompt_lookup_min: None,
        prompt_lookup_max: None,
        model: Some(source.into()),
        draft_geometry: None,
    }
}
