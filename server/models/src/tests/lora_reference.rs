//! LoRA against the reference: a tiny random Llama and adapters made with
//! PyPI peft (`scripts/lora-reference` wrote them and the merged models'
//! outputs into `tests/fixtures/lora`); our base plus each unmerged adapter,
//! PEFT's files and llama.cpp's GGUF conversion alike, gives peft's merged
//! model's greedy tokens and top-5 log-probabilities up to the first
//! near-tie.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::Device;
use ferrox_core::batch_model::PrefillChunk;
use ferrox_core::{AdapterRef, BatchModel, BlockPool, DecodeRow};

use super::helpers::full;
use ferrox_plan::KvDtype;
use serde_json::Value;

use crate::lora::{self, LoraShapes};
use crate::{PagedModel, Source};

/// Reference top-1 and top-2 closer than this are a near-tie: the order
/// may flip on rounding, and everything after it may differ.
const NEAR_TIE: f64 = 1e-3;
/// Log-probabilities agree to this.
const TOLERANCE: f64 = 2e-3;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lora")
}

fn log_softmax(l: &[f32]) -> Vec<f64> {
    let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = l.iter().map(|&x| (x as f64 - max).exp()).sum();
    l.iter().map(|&x| x as f64 - max - sum.ln()).collect()
}

/// Steps compared against `want` (one prompt's reference), greedy on our
/// side, stopping at the first near-tie of the reference.
fn compare(m: &mut PagedModel, adapter: Option<&AdapterRef>, want: &Value, what: &str) -> usize {
    let prompt: Vec<u32> = serde_json::from_value(want["prompt"].clone()).unwrap();
    let top5 = want["top5"].as_array().unwrap();
    let pool = BlockPool::new(m.cache_pools()[0].blocks);
    let lease = pool
        .allocate((prompt.len() + top5.len()).div_ceil(m.block_size()))
        .unwrap();
    let chunk = PrefillChunk {
        tables: &full(&lease),
        tokens: &prompt,
        pos: 0,
        want_logits: true,
        all_logits: false,
    };
    let adapters = [adapter.cloned()];
    let first = m.step_with_adapters(&[chunk], &[], &adapters).unwrap();
    let mut logits = first.prefill[0].clone().unwrap();
    for (step, ref_top) in top5.iter().enumerate() {
        let ref_top: Vec<(u32, f64)> = serde_json::from_value(ref_top.clone()).unwrap();
        if ref_top[0].1 - ref_top[1].1 < NEAR_TIE {
            return step;
        }
        let ours = log_softmax(&logits);
        for &(id, lp) in &ref_top {
            let got = ours[id as usize];
            assert!(
                (got - lp).abs() < TOLERANCE,
                "{what} step {step} token {id}: {got} vs {lp}"
            );
        }
        let best = (0..ours.len())
            .max_by(|&a, &b| ours[a].total_cmp(&ours[b]))
            .unwrap() as u32;
        assert_eq!(best, ref_top[0].0, "{what} step {step}");
        let row = DecodeRow {
            token: best,
            pos: prompt.len() + step,
            tables: &full(&lease),
        };
        logits = m
            .step_with_adapters(&[], &[row], &adapters)
            .unwrap()
            .decode
            .remove(0);
    }
    top5.len()
}

#[test]
fn base_and_adapters_match_peft_merged_models() {
    let dir = fixtures();
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let llama = Source::open(&dir.join("base"))
        .unwrap()
        .decoder(&Device::Cpu)
        .unwrap();
    let shapes = LoraShapes::of(llama.spec());
    let mut m = PagedModel::new(llama, 64, 4, KvDtype::F32).unwrap();
    let mut compared = 0;
    for want in reference["base"].as_array().unwrap() {
        compared += compare(&mut m, None, want, "base");
    }
    // PEFT's files of every adapter, and llama.cpp's GGUF of the one it
    // converts faithfully (it scales by alpha / rank, not rsLoRA's).
    let mut sources: Vec<(String, PathBuf)> = reference["adapters"]
        .as_object()
        .unwrap()
        .keys()
        .map(|name| (name.clone(), dir.join(name)))
        .collect();
    sources.push(("all-r4".into(), dir.join("all-r4.gguf")));
    for (name, path) in sources {
        let a = lora::load(&name, &path, &shapes, 16).unwrap();
        let a = AdapterRef::new(&name, &a.cache_key(), Arc::new(a));
        for want in reference["adapters"][&name].as_array().unwrap() {
            let what = format!("{} {}", name, path.display());
            compared += compare(&mut m, Some(&a), want, &what);
        }
    }
    // 3 prompts x 10 steps for the base and each of 3 adapter files: most
    // steps are compared, not cut short by near-ties.
    assert!(compared >= 90, "only {compared} steps compared");
}
