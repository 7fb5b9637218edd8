use super::*;
use crate::crd::{AdapterSpec, LoraSpec};
use crate::desired::DesiredConfig;
use crate::desired::deployment::deployment;
use crate::fixtures::{cpu_spec, gpu_spec, md, smollm2_135m};
use crate::lora_plan::lora_plan;
use crate::plan::plan_offline;

fn adapter(name: &str, source: &str) -> AdapterSpec {
    AdapterSpec {
        name: name.into(),
        source: source.into(),
    }
}

fn with_adapters(adapters: Vec<AdapterSpec>, lora: Option<LoraSpec>) -> ModelDeployment {
    let mut spec = cpu_spec("4Gi");
    spec.adapters = adapters;
    spec.lora = lora;
    md("smol", spec)
}

#[test]
fn two_adapters_render_into_the_args_with_their_claims_and_the_cache() {
    let m = with_adapters(
        vec![
            adapter("sql", "pvc://loras/sql/v2"),
            adapter("chat", "hf://org/chat-lora"),
        ],
        None,
    );
    let plan = plan_offline(&m.spec, &smollm2_135m()).unwrap();
    let d = deployment(&m, &plan, &DesiredConfig::default()).unwrap();
    let pod = d.spec.unwrap().template.spec.unwrap();
    let c = &pod.containers[0];
    let args = c.args.clone().unwrap();
    let at = args.iter().position(|a| a == "--lora-modules").unwrap();
    assert_eq!(
        args[at + 1..],
        ["sql=/adapters/loras/sql/v2", "chat=hf://org/chat-lora"]
    );
    for (flag, value) in [
        ("--max-loras", "2"),
        ("--max-lora-rank", "16"),
        ("--max-cpu-loras", "2"),
    ] {
        let i = args.iter().position(|a| a == flag).unwrap();
        assert_eq!(args[i + 1], value, "{flag}");
    }
    assert!(args.contains(&"--enable-lora".to_string()));
    assert!(!args.contains(&"--allow-runtime-lora-updating".to_string()));
    // The claim read-only at /adapters/loras, and a cache for the download
    // (the model itself is a local file).
    let vols: Vec<&str> = pod
        .volumes
        .iter()
        .flatten()
        .map(|v| v.name.as_str())
        .collect();
    assert!(
        vols.contains(&"adapter-loras") && vols.contains(&"model-cache"),
        "{vols:?}"
    );
    let mounts = c.volume_mounts.clone().unwrap();
    let m_loras = mounts.iter().find(|m| m.name == "adapter-loras").unwrap();
    assert_eq!(
        (m_loras.mount_path.as_str(), m_loras.read_only),
        ("/adapters/loras", Some(true))
    );
    let env = c.env.clone().unwrap();
    assert!(env.iter().any(|e| e.name == "HF_HOME"));
}

#[test]
fn no_adapters_no_flags_and_limits_from_spec_lora() {
    let none = with_adapters(Vec::new(), None);
    assert_eq!(lora_args(&none), None);
    assert_eq!(lora_plan(&none.spec), None);
    let lora = LoraSpec {
        max_loras: Some(1),
        max_lora_rank: 64,
        max_cpu_loras: None,
    };
    let three = with_adapters(
        ["a", "b", "c"].map(|n| adapter(n, "file:///l/x")).into(),
        Some(lora),
    );
    let args = lora_args(&three).unwrap();
    assert_eq!(
        (args.max_loras, args.max_lora_rank, args.max_cpu_loras),
        (1, 64, 3)
    );
    assert_eq!(args.modules[2], ("c".to_string(), "/l/x".to_string()));
}

#[test]
fn the_plan_counts_the_adapters_and_a_gpu_pod_holds_them_in_host_memory() {
    let g = ferrox_plan::ModelGeometry {
        heads: 9,
        hidden_size: 576,
        intermediate_size: 1536,
        vocab_size: 49152,
        ..smollm2_135m()
    };
    let plain = md("smol", cpu_spec("4Gi"));
    let two = with_adapters(
        vec![adapter("a", "file:///a"), adapter("b", "file:///b")],
        None,
    );
    let (p0, p2) = (
        plan_offline(&plain.spec, &g).unwrap(),
        plan_offline(&two.spec, &g).unwrap(),
    );
    let one = g.lora_adapter_bytes(16);
    assert_eq!(p2.plan.adapter_bytes, 2 * one);
    let full = ferrox_plan::CacheKind::Full;
    let fewer = p0.plan.blocks(full) - p2.plan.blocks(full);
    let exact = 2 * one / p0.plan.pool(full).unwrap().block_bytes;
    assert!(
        fewer == exact || fewer == exact + 1,
        "{fewer} blocks fewer for {exact}"
    );
    let mut gpu = gpu_spec(1, "80Gi");
    gpu.adapters = two.spec.adapters.clone();
    gpu.lora = Some(LoraSpec {
        max_loras: Some(1),
        ..LoraSpec::default()
    });
    let mut gpu_plain = gpu.clone();
    gpu_plain.adapters.clear();
    let (with, without) = (
        plan_offline(&gpu, &g).unwrap(),
        plan_offline(&gpu_plain, &g).unwrap(),
    );
    // One on the device, both in host memory.
    assert_eq!(with.plan.adapter_bytes, one);
    assert!(with.pod_memory_bytes >= without.pod_memory_bytes + 2 * one);
}

#[test]
fn an_adapter_named_as_the_model_or_with_a_bad_source_is_refused() {
    let mut spec = cpu_spec("4Gi");
    spec.model.served_name = None;
    spec.adapters = vec![adapter("smol", "file:///a")];
    let (reason, message) = refusal(&md("smol", spec.clone())).unwrap();
    assert_eq!(reason, "InvalidSpec");
    assert!(
        message.contains("\"smol\" has the model's served name"),
        "{message}"
    );
    spec.adapters = vec![adapter("ok", "http://insecure/a")];
    let (_, message) = refusal(&md("smol", spec.clone())).unwrap();
    assert!(message.contains("adapter \"ok\""), "{message}");
    spec.adapters = vec![adapter("ok", "hf://o/a")];
    assert_eq!(refusal(&md("smol", spec)), None);
}
