//! gpt-oss with MXFP4 experts, as released: the committed tiny model's
//! experts quantised to MXFP4 (`_blocks` and `_scales`, rows interleaved as
//! OpenAI's checkpoints hold them) serve the same tokens as the same values
//! widened to floats, on our kernels, and weigh what the plan counts.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::ggml_file::qtensor_from_ggml;
use candle_core::quantized::{GgmlDType, QTensor, gguf_file};
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
    // experts held as MXFP4: 17 bytes a block of 32 against 128 in f32.
    let (im, it) = (
        Source::open(&mx).unwrap().info().unwrap(),
        Source::open(&twin).unwrap().info().unwrap(),
    );
    assert_eq!(
        (im.facts.params, im.facts.active_params),
        (it.facts.params, it.facts.active_params)
    );
    let experts = 4 * 4 * (64 * 64 + 32 * 64) as u64; // layers x experts x (gate_up + down)
    let saved = experts * 4 - experts / 32 * 17;
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

/// llama.cpp's gpt-oss GGUF: the committed tiny model quantized by
/// `llama-quantize --allow-requantize model.gguf model-mxfp4.gguf MXFP4_MOE`
/// (experts MXFP4, the rest Q8_0).
fn mxfp4_gguf() -> std::path::PathBuf {
    dir("gpt_oss").join("model-mxfp4.gguf")
}

/// GGML's MXFP4 block as its published layout reads it (`block_mxfp4`:
/// an E8M0 scale `e`, then 16 bytes whose low nibbles are values 0..16 and
/// high nibbles 16..32; value = `kvalues_mxfp4[code] * 2^(e - 128)`).
fn ggml_block(b: &[u8]) -> [f32; 32] {
    const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];
    let d = 2f32.powi(i32::from(b[0]) - 128);
    std::array::from_fn(|i| {
        let code = if i < 16 {
            b[1 + i] & 15
        } else {
            b[1 + i - 16] >> 4
        };
        f32::from(KVALUES[usize::from(code)]) * d
    })
}

/// A tensor as the file stores it: `(name, dims, is MXFP4, bytes)`.
type Stored = (String, Vec<usize>, bool, Vec<u8>);

/// The file's tensors as stored, in file order.
fn stored(path: &Path) -> (gguf_file::Content, Vec<Stored>) {
    let bytes = std::fs::read(path).unwrap();
    let h = crate::gguf_header::read(&mut std::io::Cursor::new(&bytes)).unwrap();
    let mut out = Vec::new();
    for (name, t) in &h.content.tensor_infos {
        let dims = t.shape.dims().to_vec();
        let n: usize = dims.iter().product();
        let mx = h.mxfp4.contains(name);
        let size = match mx {
            true => n / 32 * 17,
            false => n / t.ggml_dtype.block_size() * t.ggml_dtype.type_size(),
        };
        let at = (h.content.tensor_data_offset + t.offset) as usize;
        out.push((name.clone(), dims, mx, bytes[at..at + size].to_vec()));
    }
    out.sort_by_key(|(name, ..)| h.content.tensor_infos[name].offset);
    (h.content, out)
}

#[test]
fn a_llama_cpp_mxfp4_gguf_serves_the_values_it_holds() {
    let tmp = tempfile::tempdir().unwrap();
    let twin = tmp.path().join("twin.gguf");
    // The twin: the experts widened to f32 by GGML's layout, the rest as
    // stored.
    let (content, tensors) = stored(&mxfp4_gguf());
    let mut q = Vec::new();
    for (name, dims, mx, bytes) in &tensors {
        let t = match mx {
            true => {
                let v: Vec<f32> = bytes.chunks_exact(17).flat_map(ggml_block).collect();
                let t = Tensor::from_vec(v, dims.as_slice(), &Device::Cpu).unwrap();
                QTensor::quantize(&t, GgmlDType::F32).unwrap()
            }
            false => {
                let ty = content.tensor_infos[name].ggml_dtype;
                qtensor_from_ggml(ty, bytes, dims.clone(), &Device::Cpu).unwrap()
            }
        };
        q.push((name.as_str(), t));
    }
    assert_eq!(
        tensors.iter().filter(|t| t.2).count(),
        4 * 3,
        "gate, up, down of 4 layers"
    );
    let md: Vec<_> = content
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let ts: Vec<_> = q.iter().map(|(k, v)| (*k, v)).collect();
    gguf_file::write(&mut std::fs::File::create(&twin).unwrap(), &md, &ts).unwrap();

    let r = reference("gpt_oss");
    let (mut a, mut b) = (open(&mxfp4_gguf(), None), open(&twin, None));
    let (pa, pb) = (Pools::of(&a), Pools::of(&b));
    for p in &r.runs[0].prompts {
        let got = greedy_alone(&mut a, &pa, &p.ids, 8, 16);
        let want = greedy_alone(&mut b, &pb, &p.ids, 8, 16);
        assert_eq!(
            got, want,
            "MXFP4 GGUF on the kernels vs its values as floats"
        );
    }
    // Held as stored (17 bytes a block of 32, the experts' rows whole
    // groups of 8) where the twin holds f32, as the plan counts.
    let info = Source::open(&mxfp4_gguf()).unwrap().info().unwrap();
    assert_eq!(info.devices.cpu.weight_bytes, a.decoder().held_bytes());
    let stored: usize = tensors.iter().filter(|t| t.2).map(|t| t.3.len()).sum();
    let twin_info = Source::open(&twin).unwrap().info().unwrap();
    assert_eq!(info.facts.params, twin_info.facts.params);
    assert_eq!(
        twin_info.devices.cpu.weight_bytes - info.devices.cpu.weight_bytes,
        (stored / 17 * 32 * 4 - stored) as u64
    );
    // A GPU holds them as the Q5_0 candle runs (22 bytes a block).
    let gpu = Source::open(&mxfp4_gguf())
        .unwrap()
        .decoder_held_as(&Device::Cpu, ferrox_plan::DeviceKind::Cuda)
        .unwrap();
    assert_eq!(info.devices.cuda.weight_bytes, gpu.held_bytes());
}

#[test]
fn a_truncated_or_out_of_range_mxfp4_tensor_is_refused_by_name() {
    let path = mxfp4_gguf();
    let bytes = std::fs::read(&path).unwrap();
    let (content, tensors) = stored(&path);
    let (name, _, mx, data) = tensors.iter().rev().find(|t| t.2).unwrap();
    assert!(*mx);
    let at = (content.tensor_data_offset + content.tensor_infos[name].offset) as usize;
    let tmp = tempfile::tempdir().unwrap();
    let load = |b: &[u8]| {
        let p = tmp.path().join("m.gguf");
        std::fs::write(&p, b).unwrap();
        match Source::open(&p).and_then(|mut s| s.decoder(&Device::Cpu)) {
            Ok(_) => panic!("a broken file loaded"),
            Err(e) => e.to_string(),
        }
    };
    let err = load(&bytes[..at + data.len() / 2]);
    assert!(
        err.contains(name.as_str()) && err.contains("truncated"),
        "{err}"
    );
    // A block's scale past f16 (the first block with a value that is not
    // 0): held exactly on CPU, refused by name where it must become Q5_0.
    let block = data
        .chunks_exact(17)
        .position(|b| b[1..].iter().any(|&c| c & 0x77 != 0))
        .unwrap();
    let mut bad = bytes.clone();
    bad[at + block * 17] = 250;
    let p = tmp.path().join("big.gguf");
    std::fs::write(&p, &bad).unwrap();
    assert!(
        Source::open(&p)
            .and_then(|mut s| s.decoder(&Device::Cpu))
            .is_ok()
    );
    let held_as_gpu = Source::open(&p)
        .and_then(|mut s| s.decoder_held_as(&Device::Cpu, ferrox_plan::DeviceKind::Cuda));
    let err = match held_as_gpu {
        Ok(_) => panic!("a scale past f16 became Q5_0"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains(name.as_str()) && err.contains("MXFP4"),
        "{err}"
    );
}
