//! The GPU's way of holding weights (half matrices through a dense matmul,
//! quantized ones through candle's `QMatMul`, dense embedding tables, KV in
//! the model's half type) run on the CPU: the decoder path a CUDA server
//! takes, minus the device, checked against the CPU's own and against the
//! plan's count of GPU bytes.

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device};
use ferrox_plan::{DeviceKind, KvDtype};

use super::helpers::{Pools, argmax, decode, prefill};
use crate::fixtures::{Tiny, random_weights, write_gguf, write_safetensors};
use crate::{PagedModel, Source};

/// Logits of the prompt's last token, then of each teacher-forced token.
fn logits_along(m: &mut PagedModel, prompt: &[u32], forced: &[u32]) -> Vec<Vec<f32>> {
    let pools = Pools::of(m);
    let mut kv = pools.seq(prompt.len() + forced.len(), 5);
    let mut out = vec![prefill(m, &mut kv, prompt, 5)];
    for (i, &token) in forced.iter().enumerate() {
        out.push(decode(m, &mut kv, token, prompt.len() + i));
    }
    out
}

/// The gap between the best and the second-best logit.
fn margin(v: &[f32]) -> f32 {
    let best = argmax(v) as usize;
    let second = v
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != best)
        .map(|(_, x)| *x)
        .fold(f32::NEG_INFINITY, f32::max);
    v[best] - second
}

fn models(dir: &std::path::Path) -> Vec<(PathBuf, &'static str)> {
    let t = Tiny::default();
    let w = random_weights(&t, 21);
    let half: HashMap<_, _> = w
        .iter()
        .map(|(k, v)| (k.clone(), v.to_dtype(DType::BF16).unwrap()))
        .collect();
    let st = dir.join("bf16");
    std::fs::create_dir(&st).unwrap();
    write_safetensors(&st, &t, &half);
    let mut out = vec![(st, "bf16 safetensors")];
    for (ty, name) in [(GgmlDType::Q8_0, "q8_0"), (GgmlDType::Q4_1, "q4_1")] {
        let p = dir.join(format!("{name}.gguf"));
        write_gguf(&p, &t, &w, ty);
        out.push((p, name));
    }
    out
}

#[test]
fn the_gpu_holding_tracks_the_cpu_one_and_holds_what_the_plan_counts() {
    let dir = tempfile::tempdir().unwrap();
    for (path, name) in models(dir.path()) {
        let mut src = Source::open(&path).unwrap();
        let info = src.info().unwrap();
        let gpu = src.decoder_held_as(&Device::Cpu, DeviceKind::Cuda).unwrap();
        assert_eq!(
            gpu.held_bytes(),
            info.devices.cuda.weight_bytes,
            "{name}: held as on a GPU vs the plan's GPU count"
        );
        let cpu = Source::open(&path).unwrap().decoder(&Device::Cpu).unwrap();
        assert!(
            !gpu.fused_layers(),
            "{name}: the GPU path is the generic one"
        );
        let kv = info.devices.cuda.kv_dtype;
        let mut gpu = PagedModel::new(gpu, 16, 4, kv).unwrap();
        let mut cpu = PagedModel::new(cpu, 16, 4, KvDtype::F32).unwrap();
        let prompt: Vec<u32> = (0..13).map(|i| (i * 29 + 5) % 96).collect();
        let want = logits_along(&mut cpu, &prompt, &[]);
        let forced: Vec<u32> = (0..8).map(|i| (i * 17 + 3) % 96).collect();
        let want = [want, logits_along(&mut cpu, &prompt, &forced)[1..].to_vec()].concat();
        let got = logits_along(&mut gpu, &prompt, &forced);
        for (step, (a, b)) in want.iter().zip(&got).enumerate() {
            let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
            let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            // bf16 matrices and KV round to 8 bits of mantissa; the
            // quantized ones differ from our kernels only in summation order
            // and in the activations' quantisation.
            assert!(diff < 0.05 * scale, "{name} step {step}: {diff} of {scale}");
            if margin(a) > 0.1 * scale {
                assert_eq!(argmax(a), argmax(b), "{name} step {step}");
            }
        }
    }
}
