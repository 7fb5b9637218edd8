//! Every family's pools from the server's own flags, by kind: the plan's
//! pools (full attention, one per sliding window, the state slots; sized from
//! the memory or by `--pool` and its aliases) are exactly the decoder's
//! cache kinds, the model is built with them and the worker accepts it, and
//! each pool's bytes as the plan counts them are the bytes the server
//! allocates for it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use ferrox_core::{BatchModel, Pool};
use ferrox_engine::{Metrics, Scheduler};
use ferrox_models::memory::{DeviceMemory, MemorySource};
use ferrox_models::{PagedModel, Source};
use ferrox_plan::{CacheKind, DeviceKind, Plan};

use super::{Cli, Command};
use crate::load::model::size;
use crate::load::sizing::Sizing;

fn families() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/testdata/families")
}

/// `ferrox-server serve --model <dir> <flags>` as the server parses it.
fn serve(dir: &Path, flags: &[&str]) -> crate::load::config::ServeConfig {
    let model = dir.display().to_string();
    let argv = [
        "ferrox-server",
        "serve",
        "--model",
        &model,
        "--device",
        "cpu",
    ]
    .into_iter()
    .chain(["--max-seqs", "4", "--prefill-chunk", "16"])
    .chain(flags.iter().copied());
    let Command::Serve(args) = Cli::try_parse_from(argv).unwrap().command else {
        panic!("not serve");
    };
    args.into_config().unwrap()
}

/// The plan for `dir`'s model under `flags`, in 1 GiB of a container.
fn sizing(dir: &Path, flags: &[&str]) -> anyhow::Result<Sizing> {
    let cfg = serve(dir, flags);
    let info = Source::open(dir).unwrap().info().unwrap();
    let memory = DeviceMemory {
        bytes: 1 << 30,
        source: MemorySource::CgroupV2,
    };
    size(&info, DeviceKind::Cpu, memory, None, &cfg)
}

/// The model built with the plan's pools, after the worker took it.
fn built(dir: &Path, sizing: &Sizing) -> Vec<(CacheKind, u64)> {
    let decoder = Source::open(dir)
        .unwrap()
        .decoder(&ferrox_models::Device::Cpu)
        .unwrap();
    let e = &sizing.engine;
    let model = PagedModel::with_pools(decoder, &e.pools, e.block_size, sizing.kv_dtype).unwrap();
    assert_eq!(model.cache_pools(), e.pools, "{}", dir.display());
    let bytes = model.pool_bytes();
    let metrics = Arc::new(Metrics::new().unwrap());
    Scheduler::new(model, e.clone(), metrics, Instant::now()).unwrap();
    bytes
}

/// The pools the server runs `dir`'s model with under `flags`.
fn pools(dir: &Path, flags: &[&str]) -> Vec<Pool> {
    let sizing = sizing(dir, flags).unwrap();
    built(dir, &sizing);
    sizing.engine.pools
}

fn kinds(p: &[Pool]) -> Vec<CacheKind> {
    p.iter().map(|p| p.kind).collect()
}

/// Each pool's bytes as the plan counts them.
fn planned_bytes(plan: &Plan) -> Vec<(CacheKind, u64)> {
    plan.pools.iter().map(|p| (p.kind, p.bytes())).collect()
}

#[test]
fn every_family_fixture_allocates_the_bytes_its_plan_counts_per_pool() {
    let dirs = std::fs::read_dir(families()).unwrap();
    let mut seen = 0;
    for dir in dirs.map(|d| d.unwrap().path()).filter(|d| d.is_dir()) {
        for flags in [&[][..], &["--block-size", "4", "--max-model-len", "128"]] {
            let sizing = sizing(&dir, flags).unwrap();
            let allocated = built(&dir, &sizing);
            assert_eq!(
                allocated,
                planned_bytes(&sizing.plan),
                "{} {flags:?}",
                dir.display()
            );
            let total: u64 = allocated.iter().map(|(_, b)| b).sum();
            assert_eq!(total, sizing.plan.kv_budget_bytes, "{}", dir.display());
        }
        seen += 1;
    }
    assert!(seen >= 16, "{seen} family fixtures");
}

#[test]
fn every_family_runs_with_the_pools_its_plan_sizes() {
    let full = CacheKind::Full;
    let w = CacheKind::Window;
    // (family, its pools' kinds)
    let cases: [(&str, &[CacheKind]); 7] = [
        ("llama", &[full]),
        ("qwen3", &[full]),
        ("phi3", &[full]),
        ("mistral", &[w(8)]),
        ("qwen2", &[full, w(12)]),
        ("gemma2", &[full, w(8)]),
        ("gemma3", &[full, w(8)]),
    ];
    for (family, want) in cases {
        let dir = families().join(family);
        let from_memory = pools(&dir, &[]);
        assert_eq!(kinds(&from_memory), want, "{family}");
        // A window pool holds a sequence's window plus a chunk (16 + 8 - 1
        // = 23 positions: 7 blocks of 4 at most), never its whole length.
        let flags = ["--block-size", "4", "--max-model-len", "128"];
        let sized = pools(&dir, &flags);
        for p in sized.iter().filter(|p| p.kind.window().is_some()) {
            assert!(p.blocks <= 4 * 8, "{family}: {p:?}");
        }
        // By hand: --kv-blocks sizes the attention pool (the full one, or
        // the one window pool of a model whose every layer slides), the
        // others derived; the kind form does the same.
        let given = pools(&dir, &[&flags[..], &["--kv-blocks", "64"]].concat());
        assert_eq!(kinds(&given), want, "{family}");
        assert_eq!(given[0].blocks, 64, "{family}");
        let by_kind = format!("{}=64", want[0]);
        let same = pools(&dir, &[&flags[..], &["--pool", &by_kind]].concat());
        assert_eq!(same, given, "{family}");
        if want.len() == 2 {
            let both = [&flags[..], &["--kv-blocks", "64", "--window-blocks", "40"]].concat();
            let got = pools(&dir, &both);
            assert_eq!((got[0].blocks, got[1].blocks), (64, 40), "{family}");
            let pool = format!("full=64,{}=40", want[1]);
            assert_eq!(pools(&dir, &[&flags[..], &["--pool", &pool]].concat()), got);
        }
    }
}

/// A hybrid model (Mamba-2's, Gated DeltaNet's or LFM2's short
/// convolutions among attention layers, with experts or MLP layers of
/// their own): the KV pool for its attention layers, and a state slot for
/// each sequence, both from the memory the plan sizes, or by kind.
#[test]
fn a_hybrid_model_runs_with_its_kv_pool_and_state_slots() {
    let hybrids = [
        "granitehybrid",
        "granitehybrid_moe",
        "qwen35",
        "qwen3next",
        "lfm2",
        "nemotron_h",
    ];
    for family in hybrids {
        let dir = families().join(family);
        let from_memory = pools(&dir, &[]);
        assert_eq!(
            kinds(&from_memory),
            [CacheKind::Full, CacheKind::State],
            "{family}"
        );
        let s = sizing(&dir, &[]).unwrap();
        assert_eq!(s.plan.blocks(CacheKind::State), s.engine.max_seqs as u64);
        let info = Source::open(&dir).unwrap().info().unwrap();
        assert!(info.facts.state_bytes_per_seq > 0, "{family}");
        let given = pools(&dir, &["--pool", "state=3", "--kv-blocks", "4096"]);
        let want = [(CacheKind::Full, 4096), (CacheKind::State, 3)];
        let got: Vec<(CacheKind, usize)> = given.iter().map(|p| (p.kind, p.blocks)).collect();
        assert_eq!(got, want, "{family}");
    }
}

/// Mamba-2 keeps no KV: its one pool is the state slots; `--kv-blocks`
/// names a pool it does not have and is refused with the pools it has.
#[test]
fn a_model_without_attention_refuses_a_kv_pool_and_names_its_pools() {
    let dir = families().join("mamba2");
    assert_eq!(kinds(&pools(&dir, &[])), [CacheKind::State]);
    let slots = pools(&dir, &["--pool", "state=5"]);
    assert_eq!(slots[0].blocks, 5);
    for flags in [&["--kv-blocks", "256"][..], &["--pool", "full=256"]] {
        let err = format!("{:#}", sizing(&dir, flags).unwrap_err());
        assert!(err.contains("but this model's pools are: state"), "{err}");
    }
}

/// Phi-3 applies its `sliding_window` to every layer: a pool for it when it
/// slides in the trained context (Phi-3-mini-4k's 2047 of 4096), none when
/// it never does (Phi-4-mini's 262,144 of 131,072).
#[test]
fn phi3_gets_a_window_pool_only_where_its_window_slides() {
    let from = families().join("phi3");
    for (window, want) in [(100, CacheKind::Window(100)), (4096, CacheKind::Full)] {
        let tmp = tempfile::tempdir().unwrap();
        for f in [
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
        ] {
            std::fs::copy(from.join(f), tmp.path().join(f)).unwrap();
        }
        let text = std::fs::read_to_string(from.join("config.json")).unwrap();
        let mut config: serde_json::Value = serde_json::from_str(&text).unwrap();
        config["sliding_window"] = window.into();
        std::fs::write(tmp.path().join("config.json"), config.to_string()).unwrap();
        assert_eq!(kinds(&pools(tmp.path(), &[])), [want], "window {window}");
    }
}
