//! LoRA adapters through the decoder: an unmerged adapter equals its merged
//! model, the fused CPU path equals the op-by-op one, and a batch mixing
//! adapters and the base equals each row alone.

use std::path::Path;
use std::sync::Arc;

use candle_core::Device;
use candle_core::quantized::GgmlDType;
use ferrox_core::batch_model::PrefillChunk;
use ferrox_core::{AdapterRef, BatchModel, BlockLease, BlockPool, DecodeRow, Table};
use ferrox_plan::KvDtype;

use super::helpers::{argmax, full};
use crate::fixtures::{Tiny, random_weights, write_gguf, write_safetensors};
use crate::lora::fixtures::{LoraSpec, merged, random_peft, shapes, write_peft};
use crate::lora::{self, LoraAdapter};
use crate::{PagedModel, Source};

fn open(path: &Path) -> PagedModel {
    let llama = Source::open(path).unwrap().decoder(&Device::Cpu).unwrap();
    PagedModel::new(llama, 64, 4, KvDtype::F32).unwrap()
}

fn prompt(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 29 + seed * 13) % 96).collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// A PEFT adapter for `t`, written under `dir` and loaded as a request carries it.
fn adapter(dir: &Path, name: &str, t: &Tiny, spec: &LoraSpec) -> AdapterRef {
    let path = dir.join(name);
    write_peft(&path, spec, &random_peft(t, spec));
    let a: LoraAdapter = lora::load(name, &path, &shapes(t), 64).unwrap();
    AdapterRef::new(name, &a.cache_key(), Arc::new(a))
}

/// Logits after the whole prompt, run as one chunk with `adapter`.
fn prompt_logits(m: &mut PagedModel, p: &[u32], adapter: Option<&AdapterRef>) -> Vec<f32> {
    let pool = BlockPool::new(m.cache_pools()[0].blocks);
    let lease = pool.allocate(p.len().div_ceil(m.block_size())).unwrap();
    let chunk = PrefillChunk {
        tables: &full(&lease),
        tokens: p,
        pos: 0,
        want_logits: true,
        all_logits: false,
    };
    let out = m
        .step_with_adapters(&[chunk], &[], &[adapter.cloned()])
        .unwrap();
    out.prefill[0].clone().unwrap()
}

#[test]
fn an_unmerged_adapter_equals_its_merged_model() {
    for arch in ["llama", "qwen2"] {
        let t = Tiny {
            arch,
            ..Tiny::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let spec = LoraSpec::all(4, 21);
        let base = random_weights(&t, 5);
        let (base_dir, merged_dir) = (dir.path().join("base"), dir.path().join("merged"));
        std::fs::create_dir_all(&base_dir).unwrap();
        std::fs::create_dir_all(&merged_dir).unwrap();
        write_safetensors(&base_dir, &t, &base);
        let tensors = random_peft(&t, &spec);
        write_safetensors(&merged_dir, &t, &merged(&base, &spec, &tensors));
        write_peft(&dir.path().join("a"), &spec, &tensors);
        let a = lora::load("a", &dir.path().join("a"), &shapes(&t), 8).unwrap();
        let a = AdapterRef::new("a", &a.cache_key(), Arc::new(a));
        let p = prompt(21, 1);
        let with = prompt_logits(&mut open(&base_dir), &p, Some(&a));
        let want = prompt_logits(&mut open(&merged_dir), &p, None);
        let plain = prompt_logits(&mut open(&base_dir), &p, None);
        assert!(
            max_diff(&with, &want) < 1e-3,
            "{arch}: {}",
            max_diff(&with, &want)
        );
        assert!(
            max_diff(&plain, &want) > 1e-2,
            "{arch}: the adapter changed nothing"
        );
    }
}

#[test]
fn the_fused_cpu_path_equals_the_op_by_op_path_with_adapters() {
    let t = Tiny::default();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q8.gguf");
    write_gguf(&path, &t, &random_weights(&t, 8), GgmlDType::Q8_0);
    let a = adapter(dir.path(), "a", &t, &LoraSpec::all(4, 22));
    let b = adapter(
        dir.path(),
        "b",
        &t,
        &LoraSpec {
            targets: vec![lora::Target::V, lora::Target::Up],
            ..LoraSpec::all(2, 23)
        },
    );
    let (mut fused, mut ops) = (open(&path), open(&path));
    ops.decoder_mut().set_fused_layers(false);
    assert!(fused.decoder().fused_layers());
    let pool = BlockPool::new(64);
    let leases = [
        pool.allocate(8).unwrap(),
        pool.allocate(8).unwrap(),
        pool.allocate(8).unwrap(),
    ];
    let ps = [prompt(11, 1), prompt(7, 2), prompt(9, 3)];
    let adapters = [Some(a), None, Some(b)];
    let tables: Vec<[Table<'_>; 1]> = leases.iter().map(full).collect();
    let run = |m: &mut PagedModel| {
        let chunks: Vec<PrefillChunk<'_>> = ps
            .iter()
            .zip(&tables)
            .map(|(p, t)| PrefillChunk {
                tables: t,
                tokens: p,
                pos: 0,
                want_logits: true,
                all_logits: false,
            })
            .collect();
        m.step_with_adapters(&chunks, &[], &adapters)
            .unwrap()
            .prefill
    };
    let (x, y) = (run(&mut fused), run(&mut ops));
    for (i, (x, y)) in x.iter().zip(&y).enumerate() {
        let (x, y) = (x.as_ref().unwrap(), y.as_ref().unwrap());
        assert!(max_diff(x, y) < 1e-4, "row {i}: {}", max_diff(x, y));
    }
}

/// Greedy tokens of `prompts[i]` with `adapters[i]`, all in one batch
/// (`together`) or each alone.
fn greedy(
    m: &mut PagedModel,
    prompts: &[Vec<u32>],
    adapters: &[Option<AdapterRef>],
    n: usize,
    together: bool,
) -> Vec<Vec<u32>> {
    if !together {
        return (0..prompts.len())
            .flat_map(|i| greedy(m, &prompts[i..=i], &adapters[i..=i], n, true))
            .collect();
    }
    let pool = BlockPool::new(m.cache_pools()[0].blocks);
    let leases: Vec<BlockLease> = prompts
        .iter()
        .map(|p| {
            pool.allocate((p.len() + n).div_ceil(m.block_size()))
                .unwrap()
        })
        .collect();
    let tables: Vec<[Table<'_>; 1]> = leases.iter().map(full).collect();
    let chunks: Vec<PrefillChunk<'_>> = prompts
        .iter()
        .zip(&tables)
        .map(|(p, t)| PrefillChunk {
            tables: t,
            tokens: p,
            pos: 0,
            want_logits: true,
            all_logits: false,
        })
        .collect();
    let first = m.step_with_adapters(&chunks, &[], adapters).unwrap();
    let mut out: Vec<Vec<u32>> = first
        .prefill
        .iter()
        .map(|l| vec![argmax(l.as_ref().unwrap())])
        .collect();
    while out[0].len() < n {
        let rows: Vec<DecodeRow<'_>> = out
            .iter()
            .zip(prompts)
            .zip(&tables)
            .map(|((o, p), t)| DecodeRow {
                token: *o.last().unwrap(),
                pos: p.len() + o.len() - 1,
                tables: t,
            })
            .collect();
        let logits = m.step_with_adapters(&[], &rows, adapters).unwrap().decode;
        for (o, l) in out.iter_mut().zip(&logits) {
            o.push(argmax(l));
        }
    }
    out
}

#[test]
fn a_batch_mixing_three_adapters_and_the_base_equals_each_row_alone() {
    let t = Tiny::default();
    let dir = tempfile::tempdir().unwrap();
    for ty in [GgmlDType::Q8_0, GgmlDType::F32] {
        let path = dir.path().join(format!("{ty:?}.gguf"));
        write_gguf(&path, &t, &random_weights(&t, 9), ty);
        let ads: Vec<Option<AdapterRef>> = (0..3)
            .map(|i| {
                Some(adapter(
                    dir.path(),
                    &format!("a{i}"),
                    &t,
                    &LoraSpec::all(2 + 2 * i, 30 + i as u64),
                ))
            })
            .chain([None])
            .collect();
        // The same prompt for every row: only the adapter tells them apart.
        let prompts = vec![prompt(10, 4); 4];
        let mut m = open(&path);
        let together = greedy(&mut m, &prompts, &ads, 8, true);
        let alone = greedy(&mut m, &prompts, &ads, 8, false);
        assert_eq!(together, alone, "{ty:?}");
        let distinct: std::collections::HashSet<_> = together.iter().collect();
        assert!(
            distinct.len() >= 3,
            "{ty:?}: adapters made no difference: {together:?}"
        );
    }
}

#[test]
fn a_model_without_adapter_support_refuses_a_step_naming_one() {
    let t = Tiny::default();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    write_gguf(&path, &t, &random_weights(&t, 1), GgmlDType::F32);
    let mut m = open(&path);
    let pool = BlockPool::new(64);
    let l = pool.allocate(2).unwrap();
    let p = prompt(3, 1);
    let chunk = PrefillChunk {
        tables: &full(&l),
        tokens: &p,
        pos: 0,
        want_logits: true,
        all_logits: false,
    };
    let alien = AdapterRef::new("x", "x@0", Arc::new(1u8));
    let err = m
        .step_with_adapters(&[chunk], &[], &[Some(alien)])
        .unwrap_err();
    assert!(
        err.to_string().contains("\"x\" is not a loaded LoRA"),
        "{err}"
    );
    let err = m
        .step_with_adapters(&[chunk], &[], &[None, None])
        .unwrap_err();
    assert!(
        err.to_string().contains("2 adapters for a step of 1 rows"),
        "{err}"
    );
}
