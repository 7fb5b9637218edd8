//! The operator's side of the contract parsed by the server's real CLI:
//! what the operator writes into a pod is what the server runs with.

use clap::Parser;
use ferrox_models::device::DeviceChoice;
use ferrox_plan::contract::ServeArgs as PodArgs;
use ferrox_plan::{DeviceKind, KvDtype};

use super::{Cli, Command};
use crate::load::config::KvSizing;

/// The sizing `--kv-blocks` and `--window-blocks` ask for.
fn pools(kv_blocks: Option<u64>, window_blocks: Option<Vec<u64>>) -> KvSizing {
    KvSizing::Pools(ferrox_plan::PoolSizes {
        kv_blocks,
        window_blocks,
    })
}

#[test]
fn the_operators_pod_args_parse_into_its_plan() {
    let dir = std::env::temp_dir().join(format!("ferrox-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("m.gguf");
    std::fs::write(&model, b"not read by the parse").unwrap();
    // (device, KV dtype, prefill chunk, waiting line, window pools) as
    // specs set them.
    let cases = [
        (DeviceKind::Cpu, KvDtype::F16, None, None, vec![]),
        (DeviceKind::Cuda, KvDtype::Bf16, Some(256), Some(64), vec![]),
        (DeviceKind::Cuda, KvDtype::Bf16, None, None, vec![5719]),
        (DeviceKind::Cuda, KvDtype::Bf16, None, None, vec![300, 40]),
    ];
    for (device, kv_dtype, prefill_chunk, max_queue, window_blocks) in cases {
        let pod = PodArgs {
            model: model.display().to_string(),
            host: "0.0.0.0".into(),
            port: 8000,
            served_model_name: "smollm2".into(),
            kv_blocks: 2441,
            window_blocks: window_blocks.clone(),
            block_size: 16,
            max_seqs: 19,
            max_model_len: 8192,
            drain_timeout_seconds: 45,
            device,
            kv_dtype,
            prefill_chunk,
            max_queue,
        };
        let argv = std::iter::once("ferrox-server".to_string()).chain(pod.to_args());
        let Command::Serve(args) = Cli::try_parse_from(argv).unwrap().command else {
            panic!("not serve");
        };
        let c = args.into_config().unwrap();
        let windows = (!window_blocks.is_empty()).then_some(window_blocks);
        assert_eq!(c.kv, pools(Some(2441), windows));
        assert_eq!(
            (c.max_seqs, c.block_size, c.max_model_len),
            (Some(19), 16, Some(8192))
        );
        assert_eq!((c.host.as_str(), c.port), ("0.0.0.0", 8000));
        assert_eq!(c.served_model_name, "smollm2");
        assert_eq!(c.drain_timeout.as_secs(), 45);
        let want_device = match device {
            DeviceKind::Cpu => DeviceChoice::Cpu,
            DeviceKind::Cuda => DeviceChoice::Cuda(0),
        };
        assert_eq!(c.device, want_device);
        assert_eq!(c.kv_dtype, Some(kv_dtype));
        // Unset in the spec, the server's own defaults (ferrox-plan's).
        assert_eq!(
            c.prefill_chunk as u64,
            prefill_chunk.unwrap_or(ferrox_plan::DEFAULT_PREFILL_CHUNK)
        );
        assert_eq!(c.max_queue as u64, max_queue.unwrap_or(256));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn kv_dtype_auto_and_absent_are_none() {
    let dir = std::env::temp_dir().join(format!("ferrox-cli-auto-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("m.gguf");
    std::fs::write(&model, b"not read by the parse").unwrap();
    let model = model.display().to_string();
    for (extra, want) in [
        (vec![], None),
        (vec!["--kv-dtype", "auto"], None),
        (vec!["--kv-dtype", "f32"], Some(KvDtype::F32)),
    ] {
        let argv = ["ferrox-server", "serve", "--model", &model]
            .into_iter()
            .chain(extra.iter().copied());
        let Command::Serve(args) = Cli::try_parse_from(argv).unwrap().command else {
            panic!("not serve");
        };
        assert_eq!(args.into_config().unwrap().kv_dtype, want, "{extra:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Each example ModelDeployment's pod args, as the operator renders them
/// (kept current by the operator's `the_examples_pod_args_are_the_committed_ones`).
const EXAMPLES_POD_ARGS: &str = include_str!("../../../tests/contract/examples-pod-args.json");

#[test]
fn each_examples_pod_args_parse_into_the_operators_plan() {
    let dir = std::env::temp_dir().join(format!("ferrox-cli-ex-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("m.gguf");
    std::fs::write(&model, b"not read by the parse").unwrap();
    let examples: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(EXAMPLES_POD_ARGS).unwrap();
    assert_eq!(examples.len(), 5, "one entry per example");
    for (name, ex) in &examples {
        let plan = &ex["plan"];
        let mut args: Vec<String> = serde_json::from_value(ex["args"].clone()).unwrap();
        // The pod's model path (or hf:// source) is not here: parse a local file.
        let at = args.iter().position(|a| a == "--model").unwrap() + 1;
        args[at] = model.display().to_string();
        let argv = std::iter::once("ferrox-server".to_string()).chain(args);
        let Command::Serve(args) = Cli::try_parse_from(argv).unwrap().command else {
            panic!("{name}: not serve");
        };
        let c = args.into_config().unwrap();
        let n = |k: &str| plan[k].as_u64().unwrap();
        // A plan without a KV pool (every layer windowed) names none.
        let kv = Some(n("kvBlocks")).filter(|&b| b > 0);
        let windows: Option<Vec<u64>> = plan
            .get("windowBlocks")
            .map(|w| serde_json::from_value(w.clone()).unwrap());
        assert_eq!(c.kv, pools(kv, windows), "{name}");
        assert_eq!(c.block_size as u64, n("blockSize"), "{name}");
        assert_eq!(c.max_seqs.map(|s| s as u64), Some(n("maxSeqs")), "{name}");
        assert_eq!(
            c.max_model_len.map(|l| l as u64),
            Some(n("maxModelLen")),
            "{name}"
        );
        assert_eq!(c.served_model_name, plan["servedModelName"], "{name}");
        let device: DeviceKind = serde_json::from_value(plan["device"].clone()).unwrap();
        let want_device = match device {
            DeviceKind::Cpu => DeviceChoice::Cpu,
            DeviceKind::Cuda => DeviceChoice::Cuda(0),
        };
        assert_eq!(c.device, want_device, "{name}");
        let kv_dtype: KvDtype = serde_json::from_value(plan["kvDtype"].clone()).unwrap();
        assert_eq!(c.kv_dtype, Some(kv_dtype), "{name}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
