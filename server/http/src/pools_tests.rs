//! Every family's KV pools from the server's own flags: the plan's pools
//! (the KV pool and one window pool per sliding window, sized from the
//! memory, from `--kv-blocks` or from `--window-blocks`) are exactly the
//! decoder's KV groups, so the model is built with them and the worker
//! accepts it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use ferrox_core::{BatchModel, PoolSpec};
use ferrox_engine::{Metrics, Scheduler};
use ferrox_models::memory::{DeviceMemory, MemorySource};
use ferrox_models::{PagedModel, Source};
use ferrox_plan::DeviceKind;

use super::{Cli, Command};
use crate::load::model::size;

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

/// The pools the server runs `dir`'s model with under `flags`, after the
/// worker took the model built with them.
fn pools(dir: &Path, flags: &[&str]) -> Vec<PoolSpec> {
    let cfg = serve(dir, flags);
    let mut source = Source::open(dir).unwrap();
    let info = source.info().unwrap();
    let memory = DeviceMemory {
        bytes: 1 << 30,
        source: MemorySource::CgroupV2,
    };
    let sizing = size(&info, DeviceKind::Cpu, memory, None, &cfg).unwrap();
    let planned = sizing.engine.pools();
    let blocks: Vec<usize> = planned.iter().map(|p| p.blocks).collect();
    let decoder = source.decoder(&ferrox_models::Device::Cpu).unwrap();
    let mut model =
        PagedModel::with_pools(decoder, &blocks, sizing.engine.block_size, sizing.kv_dtype)
            .unwrap();
    // A model with recurrent layers: the plan's state slots too.
    if let Some(slots) = sizing.engine.state_slots {
        model.set_state_slots(slots).unwrap();
    }
    assert_eq!(model.kv_pools(), planned, "{}", dir.display());
    let metrics = Arc::new(Metrics::new().unwrap());
    Scheduler::new(model, sizing.engine, metrics, Instant::now()).unwrap();
    planned
}

fn windows(p: &[PoolSpec]) -> Vec<Option<usize>> {
    p.iter().map(|p| p.window).collect()
}

#[test]
fn every_family_runs_with_the_pools_its_plan_sizes() {
    // (family, the pools' windows: full attention first, then each window).
    let cases: [(&str, &[Option<usize>]); 7] = [
        ("llama", &[None]),
        ("qwen3", &[None]),
        ("phi3", &[None]),
        ("mistral", &[Some(8)]),
        ("qwen2", &[None, Some(12)]),
        ("gemma2", &[None, Some(8)]),
        ("gemma3", &[None, Some(8)]),
    ];
    for (family, want) in cases {
        let dir = families().join(family);
        let from_memory = pools(&dir, &[]);
        assert_eq!(windows(&from_memory), want, "{family}");
        // A window pool holds a sequence's window plus a chunk (16 + 8 - 1
        // = 23 positions: 7 blocks of 4 at most), never its whole length.
        let flags = ["--block-size", "4", "--max-model-len", "128"];
        let sized = pools(&dir, &flags);
        for p in sized.iter().filter(|p| p.window.is_some()) {
            assert!(p.blocks <= 4 * 8, "{family}: {p:?}");
        }
        // By hand: one pool given (the KV pool, or the window pool of a
        // model without one), the others derived; then both.
        let full = want.contains(&None);
        let windowed = want.iter().any(Option::is_some);
        let one = if full {
            ["--kv-blocks", "64"]
        } else {
            ["--window-blocks", "40"]
        };
        let given = pools(&dir, &[&flags[..], &one].concat());
        assert_eq!(windows(&given), want, "{family}");
        if full && windowed {
            let both = [&flags[..], &one, &["--window-blocks", "40"]].concat();
            let got = pools(&dir, &both);
            assert_eq!(got[0].blocks, 64, "{family}");
            assert_eq!(got[1].blocks, 40, "{family}");
        }
    }
}

/// A hybrid model (Mamba-2's or Gated DeltaNet's layers among attention
/// layers): the KV pool for its attention layers, and a state slot for
/// each sequence, both from the memory the plan sizes.
#[test]
fn a_hybrid_model_runs_with_its_kv_pool_and_state_slots() {
    for family in ["granitehybrid", "qwen35", "qwen3next"] {
        let dir = families().join(family);
        assert_eq!(windows(&pools(&dir, &[])), [None], "{family}");
        let cfg = serve(&dir, &[]);
        let info = Source::open(&dir).unwrap().info().unwrap();
        assert!(info.state_bytes_per_seq > 0, "{family}");
        let memory = DeviceMemory {
            bytes: 1 << 30,
            source: MemorySource::CgroupV2,
        };
        let sizing = size(&info, DeviceKind::Cpu, memory, None, &cfg).unwrap();
        let slots = sizing.engine.state_slots;
        assert_eq!(slots, Some(sizing.engine.max_seqs), "{family}");
    }
}

/// Phi-3 applies its `sliding_window` to every layer: a pool for it when it
/// slides in the trained context (Phi-3-mini-4k's 2047 of 4096), none when
/// it never does (Phi-4-mini's 262,144 of 131,072).
#[test]
fn phi3_gets_a_window_pool_only_where_its_window_slides() {
    let from = families().join("phi3");
    for (window, want) in [(100, vec![Some(100)]), (4096, vec![None])] {
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
        assert_eq!(windows(&pools(tmp.path(), &[])), want, "window {window}");
    }
}
