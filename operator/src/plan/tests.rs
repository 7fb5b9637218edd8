//! Plans for real models, the spec's refusals, and the pod's memory.

use super::*;
use crate::crd::GeometrySpec;
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
            // (2 GiB * 0.9 - 94 MiB weights - 32 MiB runtime - activations)
            // / (16 * 46,080 B) = 2,349 blocks; 2,349 / (2,048 / 16) = 18.
            name: "SmolLM2-135M on CPU with 2Gi",
            spec: cpu_spec("2Gi"),
            geometry: fixtures::smollm2_135m(),
            // Memory holds 19 typical requests; the CPU default caps at 16
            // (and a smaller activation reserve leaves one more block).
            want: Ok((2_441, 16)),
        },
        Case {
            name: "SmolLM2-135M planned for full-length sequences",
            spec: {
                let mut s = cpu_spec("2Gi");
                s.engine.typical_seq_len = 8192;
                s
            },
            geometry: fixtures::smollm2_135m(),
            want: Ok((2_441, 4)),
        },
        Case {
            name: "Llama-3-8B geometry on one 80Gi GPU",
            spec: gpu_spec(1, "80Gi"),
            geometry: fixtures::llama3_8b(),
            want: Ok((28_820, 225)),
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
            name: "a typical length above maxModelLen counts as maxModelLen",
            spec: {
                let mut s = gpu_spec(1, "80Gi");
                s.engine.max_model_len = Some(1024);
                s.engine.typical_seq_len = 100_000;
                s
            },
            geometry: fixtures::llama3_8b(),
            want: Ok((28_820, 256)),
        },
        Case {
            name: "Llama-3-70B geometry on one 24Gi GPU is refused",
            spec: gpu_spec(1, "24Gi"),
            geometry: fixtures::llama3_70b(),
            want: Err(
                "insufficient memory: 25769803776 bytes x 0.9 utilization = 23192823398 usable; \
                 weights take 141107412992, activations, runtime and adapters 808452096, leaving 0 for KV, \
                 but one 8192-token sequence needs 2684354560 bytes of KV",
            ),
        },
    ];
    for case in cases {
        let got = plan_offline(&case.spec, &case.geometry)
            .map(|p| (p.plan.blocks(CacheKind::Full), p.plan.max_seqs))
            .map_err(|e| e.to_string().replace("invalid spec: ", ""));
        assert_eq!(got, case.want.map_err(String::from), "{}", case.name);
    }
}

#[test]
fn the_8b_plan_matches_the_formula_by_hand() {
    let p = plan_offline(&gpu_spec(1, "80Gi"), &fixtures::llama3_8b()).unwrap();
    let plan = &p.plan;
    // 2 * 32 layers * 8 kv heads * 128 dims * 2 bytes
    assert_eq!(to_status(&p).kv_bytes_per_token, 131_072);
    let usable = (80u64 << 30) as f64 * 0.9;
    // The fixture gives no hidden/MLP/vocab sizes: the estimate counts
    // the k and v projections of a 512 + 256 token step, in bf16.
    assert_eq!(plan.activation_reserve_bytes, (512 + 256) * 2048 * 2);
    assert_eq!(plan.overhead_bytes, 768 << 20);
    let budget = usable as u64 - 16_060_522_496 - (768 << 20) - plan.activation_reserve_bytes;
    assert_eq!(plan.blocks(CacheKind::Full), budget / (16 * 131_072));
    assert_eq!(plan.max_seqs, plan.blocks(CacheKind::Full) / (2048 / 16));
    assert_eq!(p.memory.from, "spec.accelerator.memoryPerDevice");
}

#[test]
fn unsupported_specs_are_refused_before_planning() {
    let mut bad_source = gpu_spec(1, "80Gi");
    bad_source.model.source = "s3://bucket/model".into();
    let cases = [
        (gpu_spec(1, "80Gi"), None),
        (cpu_spec("2Gi"), None),
        (gpu_spec(4, "80Gi"), Some("TensorParallelUnsupported")),
        (gpu_spec(2, "24Gi"), Some("TensorParallelUnsupported")),
        (bad_source, Some("InvalidSpec")),
    ];
    for (spec, want) in cases {
        let got = unsupported(&spec);
        assert_eq!(got.as_ref().map(|(r, _)| *r), want, "{got:?}");
        if let Some((_, message)) = got.filter(|(r, _)| *r == "TensorParallelUnsupported") {
            assert!(message.contains("cannot shard"), "{message}");
        }
    }
}

#[test]
fn memory_comes_from_limits_then_requests_then_the_gpu_target() {
    let mut requests_only = cpu_spec("2Gi");
    let r = requests_only.resources.as_mut().unwrap();
    r.requests = r.limits.take();
    let cases = [
        (cpu_spec("2Gi"), 2u64 << 30, "spec.resources.limits.memory"),
        (requests_only, 2 << 30, "spec.resources.requests.memory"),
    ];
    for (spec, bytes, from) in cases {
        assert_eq!(
            memory(&spec, None).unwrap(),
            Memory {
                bytes,
                from: from.into()
            }
        );
    }
    let mut none = cpu_spec("2Gi");
    none.resources = None;
    assert!(memory(&none, None).is_err());
    let gpu = gpu_spec(1, "80Gi");
    assert!(memory(&gpu, None).is_err(), "a GPU spec needs its target");
    let target = GpuTarget {
        product: Some("NVIDIA-L4".into()),
        memory_per_device: 23_034 << 20,
        memory_from: "nodes",
        nodes: 1,
    };
    let m = memory(&gpu, Some(&target)).unwrap();
    assert_eq!(m.bytes, 23_034 << 20);
    assert!(m.from.contains("nvidia.com/gpu.memory"), "{}", m.from);
}

#[test]
fn pods_reserve_what_the_plan_keeps_in_their_memory() {
    // CPU: the memory planned from (the plan uses 90% of it; the rest is
    // the cgroup's headroom), never below what the plan counts.
    let cpu = plan_offline(&cpu_spec("2Gi"), &fixtures::smollm2_135m()).unwrap();
    let total = cpu.plan.total_bytes();
    assert_eq!(cpu.pod_memory_bytes, 2 << 30, "what was given");
    assert!(
        total < cpu.pod_memory_bytes - (100 << 20),
        "{total}: headroom"
    );
    // GPU: the host's share only: the base plus two f32 copies of each row's logits.
    let g = ModelGeometry {
        vocab_size: 128_256,
        ..fixtures::llama3_8b()
    };
    let gpu = plan_offline(&gpu_spec(1, "80Gi"), &g).unwrap();
    let logits = gpu.plan.max_seqs * 128_256 * 8;
    // The base: the CPU runtime's 32 MiB and the tokenizer's 256 B a token.
    assert_eq!(gpu_host_base_bytes(&g), (32 << 20) + 128_256 * 256);
    let want = (gpu_host_base_bytes(&g) + logits).div_ceil(1 << 20) << 20;
    assert_eq!(gpu.pod_memory_bytes, want);
    assert!(gpu.pod_memory_bytes < 1 << 30);
}

#[test]
fn status_shows_every_part() {
    let p = plan_offline(&cpu_spec("2Gi"), &fixtures::smollm2_135m()).unwrap();
    let s = to_status(&p);
    assert_eq!(
        s.total_bytes,
        s.weight_bytes + s.kv_budget_bytes + s.activation_reserve_bytes + s.overhead_bytes
    );
    assert_eq!((s.memory_bytes, s.device.as_str()), (2 << 30, "cpu"));
    assert_eq!(s.memory_from, "spec.resources.limits.memory");
    assert_eq!(s.pod_memory_bytes as u64, p.pod_memory_bytes);
    assert_eq!(s.typical_seq_len, 2048);
    assert_eq!((s.params, s.active_params), (None, None), "unknown: absent");
}

#[test]
fn a_mixture_s_parameters_reach_the_status_from_the_crd_s_geometry() {
    // gpt-oss-20b: 20.9 B stored, 3.6 B a token.
    let mut spec = GeometrySpec::from(&fixtures::llama3_8b());
    (spec.facts.params, spec.facts.active_params) = (20_914_757_184, 3_606_562_560);
    let g = spec.for_device(DeviceKind::Cpu);
    let s = to_status(&plan_offline(&cpu_spec("64Gi"), &g).unwrap());
    assert_eq!(
        (s.params, s.active_params),
        (Some(20_914_757_184), Some(3_606_562_560))
    );
}

#[test]
fn a_hybrid_s_state_reaches_the_plan_and_status_from_the_crd_s_geometry() {
    let dense = GeometrySpec::from(&fixtures::llama3_8b());
    // 28 of its 32 layers recurrent, 4 MiB of state a sequence.
    let mut hybrid = dense.clone();
    (
        hybrid.facts.recurrent_layers,
        hybrid.facts.state_bytes_per_seq,
    ) = (28, 4 << 20);
    let status = |g: &GeometrySpec| {
        to_status(&plan_offline(&gpu_spec(1, "40Gi"), &g.for_device(DeviceKind::Cuda)).unwrap())
    };
    let (d, h) = (status(&dense), status(&hybrid));
    let state = |s: &PlanStatus| s.pools.iter().find(|p| p.pool == "state").cloned();
    assert_eq!(state(&d), None);
    let slots = state(&h).unwrap();
    assert_eq!(slots.block_bytes, 4 << 20);
    assert!(slots.blocks >= h.max_seqs, "{h:?}");
    assert!(
        h.max_seqs >= 3 * d.max_seqs && d.max_seqs > 1,
        "{} vs {}",
        h.max_seqs,
        d.max_seqs
    );
    assert_eq!(
        GeometrySpec::from(&hybrid.for_device(DeviceKind::Cpu)),
        hybrid
    );
}

/// The DeepSeek-V2-Lite example: latent attention planned at its latent
/// width in the `full` pool, which the pods are told and the status lists.
#[test]
fn a_latent_attention_deployment_plans_and_renders_its_latent_pool() {
    use crate::render::{read_manifest, render};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let yaml = std::fs::read_to_string(dir.join("deepseek-v2-lite-h100.yaml")).unwrap();
    let md = read_manifest(&yaml).unwrap();
    let r = render(&md, None, &crate::desired::DesiredConfig::default()).unwrap();
    let p = &r.plan.plan;
    let status = to_status(&r.plan);
    // 27 layers x (512 + 64) elements x 2 bytes a token, in 16-token blocks.
    assert_eq!(status.kv_bytes_per_token, 27 * 576 * 2);
    assert_eq!(p.pools.len(), 1);
    let full = p.pool(CacheKind::Full).unwrap();
    assert_eq!(full.block_bytes, 16 * 27 * 576 * 2);
    // Eight whole-context sequences at once (and 256 typical ones).
    assert_eq!(full.blocks / full.blocks_per_seq, 8, "{p:?}");
    assert_eq!(p.max_seqs, 256);
    let pod = r.desired.deployment.spec.unwrap().template.spec.unwrap();
    let args = pod.containers[0].args.clone().unwrap();
    let at = args.iter().position(|a| a == "--pool").unwrap();
    assert_eq!(args[at + 1], format!("full={}", full.blocks));
    assert_eq!(status.pools[0].block_bytes, 16 * 27 * 576 * 2);
    // Planned per head (16 x (192 + 128) of K and V) it would not fit.
    let mut per_head = md.spec.model.geometry.clone().unwrap();
    per_head.facts.kv_latent_dim = 0;
    let held = per_head.for_device(DeviceKind::Cuda);
    assert!(plan_offline(&md.spec, &held).is_err());
}

/// The Gemma 3 example: a window pool beside the KV pool, in the plan, the
/// pods' args, the status, and the servers' reports read back.
#[test]
fn a_gemma3_deployment_plans_renders_and_verifies_its_window_pool() {
    use crate::autoscaling::scrape::parse_metrics;
    use crate::observed_plan::{Expected, observe, verdict};
    use crate::render::{read_manifest, render};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let yaml = std::fs::read_to_string(dir.join("gemma-3-4b-gpu.yaml")).unwrap();
    let md = read_manifest(&yaml).unwrap();
    let r = render(&md, None, &crate::desired::DesiredConfig::default()).unwrap();
    // ferrox-plan's table has the arithmetic (Gemma 3 4B on 24 GiB, with the
    // CUDA reserve estimated here): the KV pool holds one whole 131,072-token
    // sequence, the window pool the rest, 97 blocks a sequence.
    let p = &r.plan.plan;
    let window = CacheKind::Window(1024);
    assert_eq!(p.blocks(CacheKind::Full), 8192);
    assert_eq!(p.pools.len(), 2);
    let w = p.pool(window).unwrap();
    assert_eq!((w.layers, w.blocks_per_seq), (29, 97));
    assert_eq!(p.max_seqs, w.blocks / 97);
    // Counted as 34 global layers it would not plan at all.
    let mut all_global = md.spec.model.geometry.clone().unwrap();
    all_global.facts.sliding_windows = Vec::new();
    let held = all_global.for_device(DeviceKind::Cuda);
    assert!(plan_offline(&md.spec, &held).is_err());
    // The pods are told both pools.
    let pod = r.desired.deployment.spec.unwrap().template.spec.unwrap();
    let args = pod.containers[0].args.clone().unwrap();
    let pools: Vec<String> = args
        .windows(2)
        .filter(|a| a[0] == "--pool")
        .map(|a| a[1].clone())
        .collect();
    assert_eq!(
        pools,
        ["full=8192".to_string(), format!("window:1024={}", w.blocks)]
    );
    // The status lists the same pools, by kind.
    let status = to_status(&r.plan);
    let listed: Vec<(&str, i64, i64)> = status
        .pools
        .iter()
        .map(|p| (p.pool.as_str(), p.layers, p.blocks))
        .collect();
    assert_eq!(
        listed,
        [("full", 5, 8192), ("window:1024", 29, w.blocks as i64)]
    );
    assert_eq!(status.pools[1].block_bytes, 16 * 29 * 4096);
    // What a server running these args exports (ferrox-engine's series,
    // named by the contract), read back into observedPlan: PlanVerified.
    let exposition = |window_blocks: u64| {
        format!(
            "# TYPE ferrox_requests_waiting gauge\nferrox_requests_waiting 0\n\
             # TYPE vllm:cache_config_info gauge\n\
             vllm:cache_config_info{{block_size=\"16\",cache_dtype=\"bf16\",enable_prefix_caching=\"False\",\
             gpu_memory_utilization=\"0.9\",num_gpu_blocks=\"8192\",sliding_window=\"1024\"}} 1\n\
             # TYPE ferrox_plan_max_seqs gauge\nferrox_plan_max_seqs {}\n\
             # TYPE ferrox_plan_pool_blocks gauge\n\
             ferrox_plan_pool_blocks{{pool=\"full\"}} 8192\n\
             ferrox_plan_pool_blocks{{pool=\"window:1024\"}} {window_blocks}\n",
            p.max_seqs
        )
    };
    let expected = Expected {
        plan: &status,
        kv_dtype: "bf16",
    };
    let agree = parse_metrics(&exposition(w.blocks)).unwrap().plan.unwrap();
    let observed = observe(&[agree], &expected).unwrap();
    let seen: Vec<(&str, i64)> = observed
        .pools
        .iter()
        .map(|p| (p.pool.as_str(), p.blocks))
        .collect();
    assert_eq!(seen, [("full", 8192), ("window:1024", w.blocks as i64)]);
    let (status_, reason, message) = verdict(Some(&observed), &expected);
    assert_eq!((status_, reason), ("True", "ServersAgree"), "{message}");
    assert!(
        message.contains(&format!("and pools window:1024={}", w.blocks)),
        "{message}"
    );
    // A server with half the window pool disagrees, and says where.
    let half = parse_metrics(&exposition(w.blocks / 2))
        .unwrap()
        .plan
        .unwrap();
    let observed = observe(&[half], &expected).unwrap();
    let (status_, _, message) = verdict(Some(&observed), &expected);
    assert_eq!(status_, "False");
    assert!(
        message.contains("blocks in the window:1024 pool, planned"),
        "{message}"
    );
}

/// Gemma 4 31B: the `full` pool at its global layers' 4 x 512 and the
/// `window:1024` pool at its sliding layers' 16 x 256, in the plan, the
/// status and the pods' args.
#[test]
fn a_gemma4_deployment_renders_both_pools_at_their_own_shapes() {
    use crate::render::render;
    let mut spec = gpu_spec(1, "141Gi");
    spec.model.source = "hf://google/gemma-4-31B-it".into();
    spec.model.geometry = Some(GeometrySpec::from(&fixtures::gemma4_31b()));
    let md = fixtures::md("gemma-4-31b", spec);
    let r = render(&md, None, &crate::desired::DesiredConfig::default()).unwrap();
    let p = &r.plan.plan;
    let (full, w) = (
        p.pool(CacheKind::Full).unwrap(),
        p.pool(CacheKind::Window(1024)).unwrap(),
    );
    // 16-token blocks of 10 x 2 x 4 x 512 and 50 x 2 x 16 x 256 bf16 values.
    assert_eq!(
        (full.layers, full.block_bytes),
        (10, 16 * 10 * 2 * 4 * 512 * 2)
    );
    assert_eq!((w.layers, w.block_bytes), (50, 16 * 50 * 2 * 16 * 256 * 2));
    assert_eq!(
        p.kv_budget_bytes,
        full.blocks * full.block_bytes + w.blocks * w.block_bytes
    );
    // The pods are told both pools.
    let pod = r.desired.deployment.spec.unwrap().template.spec.unwrap();
    let args = pod.containers[0].args.clone().unwrap();
    let pools: Vec<String> = args
        .windows(2)
        .filter(|a| a[0] == "--pool")
        .map(|a| a[1].clone())
        .collect();
    assert_eq!(
        pools,
        [
            format!("full={}", full.blocks),
            format!("window:1024={}", w.blocks)
        ]
    );
    // The status lists them with their blocks' bytes.
    let status = to_status(&r.plan);
    let listed: Vec<(&str, i64, i64)> = status
        .pools
        .iter()
        .map(|p| (p.pool.as_str(), p.layers, p.block_bytes))
        .collect();
    assert_eq!(
        listed,
        [
            ("full", 10, 16 * 10 * 8192),
            ("window:1024", 50, 16 * 50 * 16_384)
        ]
    );
    assert_eq!(status.kv_bytes_per_token, 10 * 8192);
    // The full pool holds one whole 262,144-token sequence, the window pool
    // the rest. Counted at the sliding layers' shape, the global layers'
    // blocks would be twice as large, leaving the windows less.
    assert_eq!((full.blocks, full.blocks_per_seq), (16_384, 16_384));
    let mut one_shape = md.spec.model.geometry.clone().unwrap();
    (one_shape.facts.full_kv_heads, one_shape.facts.full_head_dim) = (0, 0);
    let q = plan_offline(&md.spec, &one_shape.for_device(DeviceKind::Cuda)).unwrap();
    let (q_full, q_w) = (
        q.plan.pool(CacheKind::Full).unwrap(),
        q.plan.pool(CacheKind::Window(1024)).unwrap(),
    );
    assert_eq!(q_full.block_bytes, 2 * full.block_bytes);
    assert!(q_w.blocks < w.blocks, "{q_w:?} {w:?}");
}

/// A geometry whose KV kinds contradict each other is refused, naming the
/// field (the CRD's CEL rules refuse the same at apply time).
#[test]
fn contradictory_kv_kinds_are_refused_naming_the_field() {
    let g = fixtures::gemma4_31b();
    let cases = [
        (
            ModelGeometry {
                kv_shared_layers: 60,
                ..g.clone()
            },
            "kvSharedLayers (60) must be fewer than the 60 attention layers",
        ),
        (
            ModelGeometry {
                kv_shared_layers: 11,
                ..g.clone()
            },
            "slidingWindows (50 layers) and kvSharedLayers (11)",
        ),
        (
            ModelGeometry {
                kv_latent_dim: 576,
                full_kv_heads: 0,
                ..g.clone()
            },
            "fullHeadDim must be absent",
        ),
        (
            ModelGeometry {
                kv_latent_dim: 576,
                full_head_dim: 0,
                ..g.clone()
            },
            "fullKvHeads must be absent",
        ),
    ];
    for (geometry, want) in cases {
        let err = plan_offline(&gpu_spec(1, "141Gi"), &geometry)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("invalid spec: "), "{err}");
        assert!(err.contains(want), "{err} lacks {want}");
    }
    // Ten shared layers (every global one) leave the windows' 50.
    let shared = ModelGeometry {
        kv_shared_layers: 10,
        ..g
    };
    let p = plan_offline(&gpu_spec(1, "141Gi"), &shared).unwrap().plan;
    let kinds: Vec<CacheKind> = p.pools.iter().map(|p| p.kind).collect();
    assert_eq!(kinds, [CacheKind::Window(1024)]);
}

/// Every memory kind reaches the status and the pods' flags as the same
/// list of pools, by kind: dense, windowed beside full attention, every
/// layer windowed, a hybrid, every layer recurrent.
#[test]
fn the_status_and_the_pod_args_list_the_plans_pools_by_kind() {
    use ferrox_plan::{SlidingWindow, contract::parse_pool_arg};
    let base = fixtures::llama3_8b();
    let sw = |window, layers| vec![SlidingWindow { window, layers }];
    let recurrent = |layers| ModelGeometry {
        recurrent_layers: layers,
        state_bytes_per_seq: layers * (1 << 20),
        ..base.clone()
    };
    let w = CacheKind::Window;
    let cases: [(&str, ModelGeometry, &[CacheKind]); 5] = [
        ("dense", base.clone(), &[CacheKind::Full]),
        (
            "windows",
            ModelGeometry {
                sliding_windows: sw(1024, 24),
                ..base.clone()
            },
            &[CacheKind::Full, w(1024)],
        ),
        (
            "every layer windowed",
            ModelGeometry {
                sliding_windows: sw(4096, 32),
                ..base.clone()
            },
            &[w(4096)],
        ),
        (
            "hybrid",
            recurrent(28),
            &[CacheKind::Full, CacheKind::State],
        ),
        ("every layer recurrent", recurrent(32), &[CacheKind::State]),
    ];
    for (name, geometry, kinds) in cases {
        let planned = plan_offline(&gpu_spec(1, "80Gi"), &geometry).unwrap();
        let plan = &planned.plan;
        let got: Vec<CacheKind> = plan.pools.iter().map(|p| p.kind).collect();
        assert_eq!(got, kinds, "{name}");
        let status = to_status(&planned);
        let listed: Vec<(String, i64)> = status
            .pools
            .iter()
            .map(|p| (p.pool.clone(), p.blocks))
            .collect();
        let want: Vec<(String, i64)> = plan
            .pools
            .iter()
            .map(|p| (p.kind.to_string(), p.blocks as i64))
            .collect();
        assert_eq!(listed, want, "{name}");
        assert_eq!(
            status.kv_blocks as u64,
            plan.blocks(CacheKind::Full),
            "{name}"
        );
        let md = fixtures::md("m", gpu_spec(1, "80Gi"));
        let source = crate::source::parse(&md.spec.model.source).unwrap();
        let args = crate::desired::deployment::server_args(&md, &planned, &source);
        let told: Vec<(CacheKind, u64)> = args
            .windows(2)
            .filter(|a| a[0] == "--pool")
            .map(|a| parse_pool_arg(&a[1]).unwrap())
            .collect();
        assert_eq!(told, plan.sizes(), "{name}");
    }
}

#[test]
fn the_task_is_the_specs_else_the_inspected_files_else_generate() {
    let inspected = |task: Option<Task>| ObservedGeometry {
        source: "hf://org/m".into(),
        geometry: GeometrySpec::from(&fixtures::smollm2_135m()),
        devices: None,
        task,
        draft: None,
    };
    let cases = [
        (None, None, Task::Generate),
        (None, Some(inspected(None)), Task::Generate),
        (None, Some(inspected(Some(Task::Embed))), Task::Embed),
        (None, Some(inspected(Some(Task::Score))), Task::Score),
        // The spec overrides what the files say.
        (
            Some(Task::Generate),
            Some(inspected(Some(Task::Embed))),
            Task::Generate,
        ),
        (Some(Task::Score), None, Task::Score),
    ];
    for (spec_task, g, want) in cases {
        let mut spec = cpu_spec("2Gi");
        spec.task = spec_task;
        assert_eq!(task(&spec, g.as_ref()), want, "{spec_task:?} {g:?}");
    }
}

#[test]
fn an_inspected_embedder_plans_no_kv_pool_and_reports_its_task() {
    let spec = cpu_spec("2Gi");
    let memory = memory(&spec, None).unwrap();
    let geometry = fixtures::smollm2_135m();
    let embed = planned(&spec, Task::Embed, &geometry, None, memory.clone()).unwrap();
    let generate = planned(&spec, Task::Generate, &geometry, None, memory).unwrap();
    assert!(embed.plan.pools.is_empty());
    assert!(!generate.plan.pools.is_empty());
    assert_eq!(
        (to_status(&embed).task, to_status(&generate).task),
        (Task::Embed, Task::Generate)
    );
}
