//! gpt-oss with MXFP4 experts, as released: the committed tiny model's
//! experts quantised to MXFP4 (`_blocks` and `_scales`, rows interleaved as
//! OpenAI's checkpoints hold them) serve the same tokens as the same values
//! widened to floats, on our kernels, and weigh what the plan counts.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::helpers::{Pools, greedy_alone};
use super::reference::{dir, open, reference};
use crate::Source;
use crate::mxfp4::{BLOCK, DOUBLED};

/// MXFP4 of the rows of `m` (`rows x cols`): blocks and scales, each value
/// the nearest of its block's grid; and the values it holds.
fn quantize(m: &[f32], cols: usize) -> (Vec<u8>, Vec<u8>, Vec<f32>) {
    let (mut blocks, mut scales, mut held) = (Vec::new(), Vec::new(), Vec::new());
    for block in m.chunks_exact(BLOCK) {
        let max = block.iter().fold(0f32, |a, v| a.max(v.abs()));
        // 6 x 2^(s - 127) covers the block's largest value.
        let s = (127 + (max / 6.0).log2().ceil() as i32).clamp(110, 140);
        let unit = 2f32.powi(s - 128);
        let codes: Vec<u8> = block
            .iter()
            .map(|&v| {
                (0..16u8)
                    .min_by(|&a, &b| {
                        let d = |c: u8| (f32::from(DOUBLED[c as usize]) * unit - v).abs();
                        d(a).total_cmp(&d(b))
                    })
                    .unwrap_or(0)
            })
            .collect();
        held.extend(codes.iter().map(|&c| f32::from(DOUBLED[c as usize]) * unit));
        blocks.extend(codes.chunks_exact(2).map(|p| p[0] | (p[1] << 4)));
        scales.push(s as u8);
    }
    assert_eq!(m.len() % cols, 0);
    (blocks, scales, held)
}

/// Writes `to` (an MXFP4 checkpoint) and `twin` (the values it holds, as
/// floats) from the committed tiny gpt-oss.
fn write_pair(to: &Path, twin: &Path) {
    let from = dir("gpt_oss");
    let tensors =
        candle_core::safetensors::load(from.join("model.safetensors"), &Device::Cpu).unwrap();
    let (mut mx, mut fl): (HashMap<String, Tensor>, HashMap<String, Tensor>) = Default::default();
    for (name, t) in tensors {
        let stacked = name.ends_with("experts.gate_up_proj") || name.ends_with("experts.down_proj");
        if !stacked {
            mx.insert(name.clone(), t.clone());
            fl.insert(name, t);
            continue;
        }
        // `[experts, in, out]` applied as `x @ W`: rows are its columns.
        let (e, cols, rows) = t.dims3().unwrap();
        let rowwise = t
            .to_dtype(DType::F32)
            .unwrap()
            .transpose(1, 2)
            .unwrap()
            .contiguous()
            .unwrap();
        let v: Vec<f32> = rowwise.flatten_all().unwrap().to_vec1().unwrap();
        let (blocks, scales, held) = quantize(&v, cols);
        let nb = cols / BLOCK;
        let b = Tensor::from_vec(blocks, (e, rows, nb, 16), &Device::Cpu).unwrap();
        mx.insert(format!("{name}_blocks"), b);
        mx.insert(
            format!("{name}_scales"),
            Tensor::from_vec(scales, (e, rows, nb), &Device::Cpu).unwrap(),
        );
        let back = Tensor::from_vec(held, (e, rows, cols), &Device::Cpu).unwrap();
        fl.insert(name, back.transpose(1, 2).unwrap().contiguous().unwrap());
    }
    for (d, ts) in [(to, mx), (twin, fl)] {
        std::fs::create_dir_all(d).unwrap();
        std::fs::copy(from.join("config.json"), d.join("config.json")).unwrap();
        candle_core::safetensors::save(&ts, d.join("model.safetensors")).unwrap();
    }
}

#[test]
fn mxfp4_experts_serve_the_values_they_hold_on_our_kernels() {
    let tmp = tempfile::tempdir().unwrap();
    let (mx, twin) = (tmp.path().join("mxfp4"), tmp.path().join("twin"));
    write_pair(&mx, &twin);
    let r = reference("gpt_oss");
    let (mut a, mut b) = (open(&mx, None), open(&twin, None));
    let (pa, pb) = (Pools::of(&a), Pools::of(&b));
    for p in &r.runs[0].prompts {
        let n = 8;
        let got = greedy_alone(&mut a, &pa, &p.ids, n, 16);
        let want = greedy_alone(&mut b, &pb, &p.ids, n, 16);
        assert_eq!(got, want, "MXFP4 on the kernels vs its values as floats");
    }
    // Parameters as stored (two a byte, scales not counted), and the
    // experts held as Q5_0: 22 bytes a block of 32 against 128 in f32.
    let (im, it) = (
        Source::open(&mx).unwrap().info().unwrap(),
        Source::open(&twin).unwrap().info().unwrap(),
    );
    assert_eq!((im.params, im.active_params), (it.params, it.active_params));
    let experts = 4 * 4 * (64 * 64 + 32 * 64) as u64; // layers x experts x (gate_up + down)
    let saved = experts * 4 - experts / 32 * 22;
    assert_eq!(
        it.devices.cpu.weight_bytes - im.devices.cpu.weight_bytes,
        saved
    );
    assert_eq!(im.devices.cpu.weight_bytes, a.decoder().held_bytes());
    let gpu = Source::open(&mx)
        .unwrap()
        .decoder_held_as(&Device::Cpu, ferrox_plan::DeviceKind::Cuda)
        .unwrap();
    assert_eq!(
        im.devices.cuda.weight_bytes,
        gpu.held_bytes(),
        "widened to bf16"
    );
    // The twin's experts were written in f32, and a GPU holds them so.
    assert_eq!(
        it.devices.cuda.weight_bytes - im.devices.cuda.weight_bytes,
        experts * 2
    );
}

#[test]
fn an_mxfp4_gguf_is_refused_by_name() {
    // GGUF v3: one tensor `[32]` of type 39, no metadata.
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(1u64.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    let name = b"blk.0.ffn_down_exps.weight";
    b.extend((name.len() as u64).to_le_bytes());
    b.extend(name);
    b.extend(1u32.to_le_bytes());
    b.extend(32u64.to_le_bytes());
    b.extend(39u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.resize(b.len().next_multiple_of(32) + 17, 0);
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("gpt-oss-mxfp4.gguf");
    std::fs::write(&path, b).unwrap();
    let err = Source::open(&path).err().expect("refused").to_string();
    assert!(
        err.contains("MXFP4") && err.contains("safetensors"),
        "{err}"
    );
}
