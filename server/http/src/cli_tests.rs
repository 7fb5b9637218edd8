//! The operator's side of the contract parsed by the server's real CLI:
//! what the operator writes into a pod is what the server runs with.

use clap::Parser;
use ferrox_models::device::DeviceChoice;
use ferrox_plan::contract::ServeArgs as PodArgs;
use ferrox_plan::{CacheKind, DeviceKind, KvDtype, PoolSizes};

use super::{Cli, Command};
use crate::load::adapters::LoraConfig;
use crate::load::config::KvSizing;
use ferrox_plan::contract::LoraArgs as PodLora;

/// `serve --model <a file> <flags>` parsed by the server's CLI.
fn parse(flags: &[&str]) -> Result<crate::load::config::ServeConfig, String> {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.gguf");
    std::fs::write(&model, b"not read by the parse").unwrap();
    let model = model.display().to_string();
    let argv = ["ferrox-server", "serve", "--model", &model]
        .into_iter()
        .chain(flags.iter().copied());
    let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
    let Command::Serve(args) = cli.command else {
        panic!("not serve");
    };
    args.into_config().map_err(|e| e.to_string())
}

#[test]
fn pool_flags_name_pools_by_kind_and_the_aliases_parse_to_the_same_sizes() {
    let w = CacheKind::Window(4096);
    // (flags, what they ask for)
    let cases: [(&[&str], PoolSizes); 5] = [
        (
            &[
                "--pool",
                "full=2048",
                "--pool",
                "window:4096=512",
                "--pool",
                "state=16",
            ],
            PoolSizes::of(&[(CacheKind::Full, 2048), (w, 512), (CacheKind::State, 16)]),
        ),
        (
            &["--pool", "full=2048,window:4096=512"],
            PoolSizes::of(&[(CacheKind::Full, 2048), (w, 512)]),
        ),
        (
            &["--kv-blocks", "2048", "--window-blocks", "512"],
            PoolSizes {
                kv_blocks: Some(2048),
                window_blocks: Some(vec![512]),
                ..PoolSizes::default()
            },
        ),
        (
            &["--kv-blocks", "2048", "--pool", "state=4"],
            PoolSizes {
                kv_blocks: Some(2048),
                ..PoolSizes::of(&[(CacheKind::State, 4)])
            },
        ),
        (&[], PoolSizes::default()),
    ];
    for (flags, want) in cases {
        let got = parse(flags).unwrap().kv;
        let want = match want.is_empty() {
            true => KvSizing::Device,
            false => KvSizing::Pools(want),
        };
        assert_eq!(got, want, "{flags:?}");
    }
    // The aliases resolve to the same pools as the kind form (for a model
    // with a full pool and a 4096-token window pool).
    let kinds = [CacheKind::Full, w];
    let resolved = |flags: &[&str]| match parse(flags).unwrap().kv {
        KvSizing::Pools(sizes) => sizes.resolve(&kinds).unwrap(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        resolved(&["--pool", "full=2048,window:4096=512"]),
        resolved(&["--kv-blocks", "2048", "--window-blocks", "512"])
    );
    for (bad, why) in [
        (&["--pool", "kv=3"][..], "not a cache pool"),
        (&["--pool", "full"], "is not KIND=BLOCKS"),
        (
            &["--pool", "full=1", "--kv-cache-memory", "1GiB"],
            "cannot be used with",
        ),
    ] {
        let err = parse(bad).unwrap_err();
        assert!(err.contains(why), "{bad:?}: {err}");
    }
}

#[test]
fn the_operators_pod_args_parse_into_its_plan() {
    let dir = std::env::temp_dir().join(format!("ferrox-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("m.gguf");
    std::fs::write(&model, b"not read by the parse").unwrap();
    // (device, KV dtype, prefill chunk, waiting line, pools beside the
    // full one, adapters) as specs set them.
    let lora = PodLora {
        modules: vec![
            ("sql".into(), "/adapters/sql".into()),
            ("chat".into(), "hf://o/chat".into()),
        ],
        max_loras: 2,
        max_lora_rank: 32,
        max_cpu_loras: 3,
        runtime_updates: true,
    };
    let cases = [
        (DeviceKind::Cpu, KvDtype::F16, None, None, vec![], None),
        (
            DeviceKind::Cuda,
            KvDtype::Bf16,
            Some(256),
            Some(64),
            vec![],
            Some(lora.clone()),
        ),
        (
            DeviceKind::Cuda,
            KvDtype::Bf16,
            None,
            None,
            vec![(CacheKind::Window(1024), 5719)],
            None,
        ),
        (
            DeviceKind::Cuda,
            KvDtype::Bf16,
            None,
            None,
            vec![(CacheKind::Window(128), 300), (CacheKind::State, 40)],
            Some(lora),
        ),
    ];
    for (device, kv_dtype, prefill_chunk, max_queue, others, lora) in cases {
        let pools: Vec<(CacheKind, u64)> = std::iter::once((CacheKind::Full, 2441))
            .chain(others)
            .collect();
        // Speculation in the cases with a prefill chunk: by a draft model
        // (the model itself, a file that exists) where a queue is set too.
        let speculative = prefill_chunk.map(|_| ferrox_plan::SpeculativeFlag {
            config: match max_queue {
                Some(_) => ferrox_plan::SpeculativeConfig::drafting(3).unwrap(),
                None => ferrox_plan::SpeculativeConfig::ngram(5, Some(2), Some(4)).unwrap(),
            },
            draft_model: max_queue.map(|_| model.display().to_string()),
        });
        let pod = PodArgs {
            model: model.display().to_string(),
            host: "0.0.0.0".into(),
            port: 8000,
            served_model_name: "smollm2".into(),
            pools: pools.clone(),
            block_size: 16,
            max_seqs: 19,
            max_model_len: 8192,
            drain_timeout_seconds: 45,
            device,
            kv_dtype,
            prefill_chunk,
            max_queue,
            lora: lora.clone(),
            speculative: speculative.clone(),
            task: ferrox_plan::Task::Generate,
            max_batch_tokens: None,
            kv_offload: Vec::new(),
        };
        let argv = std::iter::once("ferrox-server".to_string()).chain(pod.to_args());
        let Command::Serve(args) = Cli::try_parse_from(argv).unwrap().command else {
            panic!("not serve");
        };
        let c = args.into_config().unwrap();
        assert_eq!(c.kv, KvSizing::Pools(PoolSizes::of(&pools)));
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
        assert_eq!(c.speculative, speculative.as_ref().map(|f| f.config));
        let draft = speculative.and_then(|f| f.draft_model);
        assert_eq!(c.draft_model, draft.map(std::path::PathBuf::from));
        let want = lora.map(|l| LoraConfig {
            modules: l.modules,
            max_loras: l.max_loras as usize,
            max_lora_rank: l.max_lora_rank as usize,
            max_cpu_loras: l.max_cpu_loras as usize,
            allow_runtime_updates: l.runtime_updates,
        });
        assert_eq!(c.lora, want);
        assert_eq!(
            (c.task, c.max_batch_tokens as u64),
            (None, ferrox_plan::DEFAULT_MAX_BATCH_TOKENS)
        );
    }
    // An embedding model's pod: its task and batch budget, and no pool.
    let pod = PodArgs {
        model: model.display().to_string(),
        host: "0.0.0.0".into(),
        port: 8000,
        served_model_name: "bge".into(),
        pools: Vec::new(),
        block_size: 16,
        max_seqs: 16,
        max_model_len: 512,
        drain_timeout_seconds: 30,
        device: DeviceKind::Cpu,
        kv_dtype: KvDtype::F32,
        prefill_chunk: None,
        max_queue: None,
        lora: None,
        speculative: None,
        task: ferrox_plan::Task::Embed,
        max_batch_tokens: Some(4096),
        kv_offload: Vec::new(),
    };
    let argv = std::iter::once("ferrox-server".to_string()).chain(pod.to_args());
    let Command::Serve(args) = Cli::try_parse_from(argv).unwrap().command else {
        panic!("not serve");
    };
    let c = args.into_config().unwrap();
    assert_eq!(
        (c.task, c.max_batch_tokens),
        (Some(ferrox_plan::Task::Embed), 4096)
    );
    assert_eq!(c.kv, KvSizing::Device);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn lora_flags_take_vllms_forms_and_check_their_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.gguf");
    std::fs::write(&model, b"not read by the parse").unwrap();
    let model = model.display().to_string();
    let parse = |extra: &[&str]| {
        let argv = ["ferrox-server", "serve", "--model", &model]
            .into_iter()
            .chain(extra.iter().copied());
        let Command::Serve(args) = Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .command
        else {
            panic!("not serve");
        };
        args.into_config()
            .map(|c| c.lora)
            .map_err(|e| e.to_string())
    };
    assert_eq!(parse(&[]), Ok(None));
    let json = r#"{"name": "b", "path": "/x/b", "base_model_name": "m"}"#;
    let two = parse(&["--lora-modules", "a=/x/a", json]).unwrap().unwrap();
    assert_eq!(
        two.modules,
        [("a".into(), "/x/a".into()), ("b".into(), "/x/b".into())]
    );
    // vLLM's defaults: one adapter a step, rank 16; every module kept loaded.
    assert_eq!(
        (two.max_loras, two.max_lora_rank, two.max_cpu_loras),
        (1, 16, 2)
    );
    assert!(!two.allow_runtime_updates);
    let on = parse(&["--enable-lora", "--max-loras", "4"])
        .unwrap()
        .unwrap();
    assert_eq!((on.max_loras, on.max_cpu_loras), (4, 4));
    let runtime = parse(&["--allow-runtime-lora-updating"]).unwrap().unwrap();
    assert!(runtime.allow_runtime_updates && runtime.modules.is_empty());
    for (bad, why) in [
        (&["--lora-modules", "noequals"][..], "is not name=source"),
        (&["--lora-modules", "=src"], "is not name=source"),
        (
            &["--lora-modules", r#"{"name": "x"}"#],
            "is not name=source",
        ),
        (
            &["--enable-lora", "--max-loras", "0"],
            "--max-loras must be at least 1",
        ),
        (
            &["--enable-lora", "--max-lora-rank", "0"],
            "--max-lora-rank must be at least 1",
        ),
        (
            &["--enable-lora", "--max-loras", "3", "--max-cpu-loras", "2"],
            "--max-cpu-loras (2) must be at least --max-loras (3)",
        ),
    ] {
        let err = parse(bad).unwrap_err();
        assert!(err.contains(why), "{bad:?}: {err}");
    }
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
    let dir_examples = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension() == Some("yaml".as_ref()))
        .count();
    assert_eq!(examples.len(), dir_examples, "one entry per example");
    for (name, ex) in &examples {
        let plan = &ex["plan"];
        let mut args: Vec<String> = serde_json::from_value(ex["args"].clone()).unwrap();
        // The pod's model path (or hf:// source) is not here: parse a local file.
        let at = args.iter().position(|a| a == "--model").unwrap() + 1;
        args[at] = model.display().to_string();
        // So is a draft model's: the flag's `model` becomes the local file.
        let spec_flag = format!("--{}", ferrox_plan::contract::flag::SPECULATIVE_CONFIG);
        let drafted = match args.iter().position(|a| *a == spec_flag) {
            Some(at) => {
                let mut flag: serde_json::Value = serde_json::from_str(&args[at + 1]).unwrap();
                let named = flag.get("model").is_some();
                if named {
                    flag["model"] = model.display().to_string().into();
                    args[at + 1] = flag.to_string();
                }
                named
            }
            None => false,
        };
        let tiers: Vec<String> = (args.windows(2))
            .filter(|w| w[0] == format!("--{}", ferrox_plan::contract::flag::KV_OFFLOAD))
            .map(|w| w[1].clone())
            .collect();
        let argv = std::iter::once("ferrox-server".to_string()).chain(args);
        let Command::Serve(args) = Cli::try_parse_from(argv).unwrap().command else {
            panic!("{name}: not serve");
        };
        let c = args.into_config().unwrap();
        assert_eq!(c.draft_model.is_some(), drafted, "{name}");
        assert_eq!(name.contains("draft"), drafted, "{name}");
        // The lower KV tiers, as the operator wrote them.
        let read: Vec<String> = c.kv_offload.iter().map(|t| t.to_arg()).collect();
        assert_eq!(read, tiers, "{name}");
        assert_eq!(name.contains("kv-tier"), !tiers.is_empty(), "{name}");
        let n = |k: &str| plan[k].as_u64().unwrap();
        // Every pool of the plan, by kind, as the server reads its flags.
        let pools: Vec<String> = serde_json::from_value(plan["pools"].clone()).unwrap();
        let pools: Vec<(CacheKind, u64)> = pools
            .iter()
            .map(|p| ferrox_plan::contract::parse_pool_arg(p).unwrap())
            .collect();
        assert!(!pools.is_empty(), "{name}");
        assert_eq!(c.kv, KvSizing::Pools(PoolSizes::of(&pools)), "{name}");
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
        let adapters: Vec<String> = serde_json::from_value(plan["adapters"].clone()).unwrap();
        let served: Vec<String> = (c.lora.iter())
            .flat_map(|l| l.modules.iter().map(|m| m.0.clone()))
            .collect();
        assert_eq!(served, adapters, "{name}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn speculative_config_takes_vllms_json_and_refuses_what_it_cannot_serve() {
    let ngram = |k, min, max| ferrox_plan::SpeculativeConfig {
        num_speculative_tokens: k,
        prompt_lookup_min: min,
        prompt_lookup_max: max,
    };
    let vllm = r#"{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}"#;
    assert_eq!(
        parse(&["--speculative-config", vllm]).unwrap().speculative,
        Some(ngram(5, 2, 4))
    );
    assert_eq!(parse(&[]).unwrap().speculative, None);
    // A draft model: its path (resolved as a model's source is), and its
    // draft count.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("draft.gguf");
    std::fs::write(&file, b"not read by the parse").unwrap();
    for given in [
        file.display().to_string(),
        format!("file://{}", file.display()),
    ] {
        let draft = format!(r#"{{"model": "{given}", "num_speculative_tokens": 4}}"#);
        let c = parse(&["--speculative-config", &draft]).unwrap();
        assert_eq!(
            c.speculative.map(|s| s.num_speculative_tokens),
            Some(4),
            "{draft}"
        );
        assert_eq!(c.draft_model.as_deref(), Some(file.as_path()));
    }
    let missing = r#"{"model": "/m/draft.gguf", "num_speculative_tokens": 4}"#;
    let err = parse(&["--speculative-config", missing]).unwrap_err();
    assert!(err.contains("draft model /m/draft.gguf"), "{err}");
    assert_eq!(
        parse(&["--speculative-config", vllm]).unwrap().draft_model,
        None
    );
    // Refused at start, with the reason, before the model is read.
    for (value, why) in [
        (
            r#"{"method": "ngram", "num_speculative_tokens": 0}"#,
            "num_speculative_tokens must be 1 to 16, not 0",
        ),
        (
            r#"{"method": "ngram", "num_speculative_tokens": 64}"#,
            "num_speculative_tokens must be 1 to 16, not 64",
        ),
        (
            r#"{"model": "draft.gguf", "num_speculative_tokens": 0}"#,
            "num_speculative_tokens must be 1 to 16, not 0",
        ),
        (
            r#"{"model": "draft.gguf", "num_speculative_tokens": 4, "prompt_lookup_min": 2}"#,
            "unknown key `prompt_lookup_min` with a draft model",
        ),
    ] {
        let err = parse(&["--speculative-config", value]).unwrap_err();
        assert!(
            err.contains("--speculative-config") && err.contains(why),
            "{value}: {err}"
        );
    }
}

#[test]
fn matryoshka_sizes_parse_sorted_or_as_any_and_a_bad_size_is_refused() {
    let sizes = |v: &str| parse(&["--matryoshka-dimensions", v]).map(|c| c.matryoshka);
    assert_eq!(parse(&[]).unwrap().matryoshka, None);
    assert_eq!(
        sizes("768,128, 256,128").unwrap(),
        Some(vec![128, 256, 768])
    );
    assert_eq!(sizes("any").unwrap(), Some(vec![]));
    for bad in ["0", "16,x", "8.5", "16,,32"] {
        let err = sizes(bad).unwrap_err();
        assert!(
            err.contains("--matryoshka-dimensions") && err.contains("above zero"),
            "{bad}: {err}"
        );
    }
}
