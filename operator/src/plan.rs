//! The capacity plan of a `ModelDeployment`: ferrox-plan fed from the spec.

use ferrox_plan::{DeviceKind, KvDtype, ModelGeometry, Plan, PlanConfig, PlanError};

use crate::crd::{GeometrySpec, KvDtypeSpec, ModelDeploymentSpec, PlanStatus};
use crate::{Error, quantity};

/// Memory one replica may plan into, summed over its devices (or its RAM on CPU).
pub fn memory_bytes(spec: &ModelDeploymentSpec) -> Result<u64, Error> {
    if let Some(acc) = &spec.accelerator {
        let per_device = quantity::bytes(&acc.memory_per_device)?;
        return Ok(per_device * acc.count.max(1) as u64);
    }
    let resources = spec.resources.as_ref();
    let memory = resources
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get("memory"))
        .or_else(|| {
            resources
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("memory"))
        })
        .ok_or_else(|| {
            Error::InvalidSpec("no accelerator and no resources.limits.memory to plan from".into())
        })?;
    quantity::bytes(memory)
}

/// The ferrox-plan inputs the spec asks for.
pub fn plan_config(spec: &ModelDeploymentSpec) -> Result<PlanConfig, Error> {
    let engine = &spec.engine;
    let defaults = PlanConfig::for_device(device_kind(spec));
    Ok(PlanConfig {
        memory_bytes: memory_bytes(spec)?,
        utilization: engine.memory_utilization,
        block_size: engine.block_size.max(0) as u64,
        max_model_len: engine.max_model_len.map(|n| n.max(0) as u64),
        max_seqs_cap: engine.max_seqs.map(|n| n.max(0) as u64),
        prefill_chunk: engine
            .prefill_chunk
            .map_or(defaults.prefill_chunk, |n| n.max(1) as u64),
        ..defaults
    })
}

/// The device the spec's pods serve on: a GPU when it asks for accelerators.
pub fn device_kind(spec: &ModelDeploymentSpec) -> DeviceKind {
    if spec.accelerator.is_some() {
        DeviceKind::Cuda
    } else {
        DeviceKind::Cpu
    }
}

/// The plan for `spec` with `geometry`: the numbers, or why it cannot run.
pub fn plan_for(spec: &ModelDeploymentSpec, geometry: &ModelGeometry) -> Result<Plan, PlanError> {
    let config = plan_config(spec).map_err(|e| PlanError::Invalid(e.to_string()))?;
    ferrox_plan::plan(geometry, &config)
}

/// The CRD's geometry as ferrox-plan's.
pub fn to_geometry(g: &GeometrySpec) -> ModelGeometry {
    let n = |v: i64| v.max(0) as u64;
    ModelGeometry {
        layers: n(g.layers),
        kv_heads: n(g.kv_heads),
        head_dim: n(g.head_dim),
        kv_dtype: match g.kv_dtype {
            KvDtypeSpec::F32 => KvDtype::F32,
            KvDtypeSpec::F16 => KvDtype::F16,
            KvDtypeSpec::Bf16 => KvDtype::Bf16,
            KvDtypeSpec::Fp8 => KvDtype::Fp8,
        },
        weight_bytes: n(g.weight_bytes),
        context_length: n(g.context_length),
        ..ModelGeometry::default()
    }
}

/// ferrox-plan's geometry as the CRD's.
pub fn from_geometry(g: &ModelGeometry) -> GeometrySpec {
    let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    GeometrySpec {
        layers: n(g.layers),
        kv_heads: n(g.kv_heads),
        head_dim: n(g.head_dim),
        kv_dtype: match g.kv_dtype {
            KvDtype::F32 => KvDtypeSpec::F32,
            KvDtype::F16 => KvDtypeSpec::F16,
            KvDtype::Bf16 => KvDtypeSpec::Bf16,
            KvDtype::Fp8 => KvDtypeSpec::Fp8,
        },
        weight_bytes: n(g.weight_bytes),
        context_length: n(g.context_length),
    }
}

/// A plan as the status reports it.
pub fn to_status(plan: &Plan) -> PlanStatus {
    let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    PlanStatus {
        kv_blocks: n(plan.kv_blocks),
        block_size: n(plan.block_size),
        max_seqs: n(plan.max_seqs),
        kv_bytes_per_token: n(plan.kv_bytes_per_token),
        weight_bytes: n(plan.weight_bytes),
        kv_budget_bytes: n(plan.kv_budget_bytes),
        max_model_len: n(plan.max_model_len),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, cpu_spec, gpu_spec};

    struct Case {
        name: &'static str,
        spec: ModelDeploymentSpec,
        geometry: ModelGeometry,
        want: Result<(u64, u64), &'static str>,
    }

    #[test]
    fn plans_for_real_models() {
        let cases = [
            Case {
                // (2 GiB * 0.9 - 94 MiB weights - 32 MiB runtime - 1.1 MiB
                // activations of a 768-token step) / (16 * 46,080 B).
                name: "SmolLM2-135M on CPU with 2Gi",
                spec: cpu_spec("2Gi"),
                geometry: fixtures::smollm2_135m(),
                want: Ok((2_440, 4)),
            },
            Case {
                name: "Llama-3-8B geometry on one 80Gi GPU",
                spec: gpu_spec(1, "80Gi"),
                geometry: fixtures::llama3_8b(),
                want: Ok((28_820, 56)),
            },
            Case {
                name: "Llama-3-8B with maxSeqs cap 32 and maxModelLen 4096",
                spec: {
                    let mut s = gpu_spec(1, "80Gi");
                    s.engine.max_seqs = Some(32);
                    s.engine.max_model_len = Some(4096);
                    s
                },
                geometry: fixtures::llama3_8b(),
                want: Ok((28_820, 32)),
            },
            Case {
                name: "Llama-3-70B geometry on one 24Gi GPU is refused",
                spec: gpu_spec(1, "24Gi"),
                geometry: fixtures::llama3_70b(),
                want: Err(
                    "insufficient memory: 25769803776 bytes x 0.9 utilization = 23192823398 usable; \
                     weights take 141107412992, activations and runtime 808452096, leaving 0 for KV, \
                     but one 8192-token sequence needs 2684354560 bytes of KV",
                ),
            },
            Case {
                name: "Llama-3-70B on four 80Gi GPUs fits",
                spec: gpu_spec(4, "80Gi"),
                geometry: fixtures::llama3_70b(),
                want: Ok((31_914, 62)),
            },
        ];
        for case in cases {
            let got = plan_for(&case.spec, &case.geometry)
                .map(|p| (p.kv_blocks, p.max_seqs))
                .map_err(|e| e.to_string());
            assert_eq!(got, case.want.map_err(String::from), "{}", case.name);
        }
    }

    #[test]
    fn the_8b_plan_matches_the_formula_by_hand() {
        let plan = plan_for(&gpu_spec(1, "80Gi"), &fixtures::llama3_8b()).unwrap();
        // 2 * 32 layers * 8 kv heads * 128 dims * 2 bytes
        assert_eq!(plan.kv_bytes_per_token, 131_072);
        let usable = (80u64 << 30) as f64 * 0.9;
        // The fixture gives no hidden/MLP/vocab sizes: the estimate counts
        // the k and v projections of a 512 + 256 token step, in bf16.
        assert_eq!(plan.activation_reserve_bytes, (512 + 256) * 2048 * 2);
        assert_eq!(plan.overhead_bytes, 768 << 20);
        let budget = usable as u64 - 16_060_522_496 - (768 << 20) - plan.activation_reserve_bytes;
        assert_eq!(plan.kv_blocks, budget / (16 * 131_072));
        assert_eq!(plan.max_seqs, plan.kv_blocks / (8192 / 16));
    }

    #[test]
    fn cpu_plan_needs_memory() {
        let mut spec = cpu_spec("2Gi");
        spec.resources = None;
        assert!(memory_bytes(&spec).is_err());
    }

    #[test]
    fn geometry_round_trips() {
        let g = fixtures::llama3_8b();
        assert_eq!(to_geometry(&from_geometry(&g)), g);
    }
}
