//! The update's arithmetic, grouping and loading, against plain references.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};

use super::fixtures::{LoraSpec, random_peft, shapes, write_gguf_lora, write_peft};
use super::*;
use crate::fixtures::Tiny;

fn adapter(dir: &Path, name: &str, t: &Tiny, spec: &LoraSpec) -> LoraAdapter {
    let path = dir.join(name);
    write_peft(&path, spec, &random_peft(t, spec));
    load(name, &path, &shapes(t), 64).unwrap()
}

/// `out + scale * B @ (A @ x)`, one row, the obvious way.
fn reference(p: &LoraPair, x: &[f32], out: &[f32]) -> Vec<f32> {
    let (rows, cols) = p.dims();
    let t: Vec<f32> = (0..p.rank())
        .map(|j| (0..cols).map(|c| p.a()[j * cols + c].to_f32() * x[c]).sum())
        .collect();
    (0..rows)
        .map(|o| {
            out[o]
                + p.scale()
                    * (0..p.rank())
                        .map(|j| p.b_t()[j * rows + o].to_f32() * t[j])
                        .sum::<f32>()
        })
        .collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn each_row_gets_its_own_adapters_update_and_the_base_rows_none() {
    let t = Tiny::default();
    let dir = tempfile::tempdir().unwrap();
    let a = adapter(dir.path(), "a", &t, &LoraSpec::all(4, 1));
    let b = adapter(dir.path(), "b", &t, &LoraSpec::all(8, 2));
    // Spans: a (2 rows), base (1), b (3), a (1).
    let spans = [(Some(&a), 2), (None, 1), (Some(&b), 3), (Some(&a), 1)];
    let step = LoraStep::new(spans).unwrap();
    assert_eq!((step.tokens(), step.adapters()), (7, 2));
    let owner = [
        Some(&a),
        Some(&a),
        None,
        Some(&b),
        Some(&b),
        Some(&b),
        Some(&a),
    ];
    let (hidden, layer) = (t.hidden, 1);
    for target in Target::ALL {
        let (rows, cols) = shapes(&t).dims(target);
        let x: Vec<f32> = (0..7 * cols)
            .map(|i| ((i * 7919) % 113) as f32 / 113.0 - 0.5)
            .collect();
        let base: Vec<f32> = (0..7 * rows).map(|i| (i % 5) as f32).collect();
        let mut out = base.clone();
        step.apply(target, layer, &x, &mut out).unwrap();
        for (r, who) in owner.iter().enumerate() {
            let (xr, br) = (
                &x[r * cols..(r + 1) * cols],
                &base[r * rows..(r + 1) * rows],
            );
            let want = match who {
                Some(ad) => reference(ad.pair(layer, target).unwrap(), xr, br),
                None => br.to_vec(),
            };
            let got = &out[r * rows..(r + 1) * rows];
            assert!(max_diff(got, &want) < 1e-5, "{target:?} row {r}");
        }
    }
    assert_eq!(shapes(&t).dims(Target::O), (hidden, hidden));
    assert!(LoraStep::new([(None, 3)]).is_none(), "no adapter, no step");
}

#[test]
fn a_rows_update_does_not_depend_on_its_neighbours() {
    let t = Tiny::default();
    let dir = tempfile::tempdir().unwrap();
    let a = adapter(dir.path(), "a", &t, &LoraSpec::all(4, 3));
    let b = adapter(dir.path(), "b", &t, &LoraSpec::all(4, 4));
    let (rows, cols) = shapes(&t).dims(Target::Gate);
    let x: Vec<f32> = (0..3 * cols).map(|i| (i % 17) as f32 / 17.0).collect();
    let mut mixed = vec![0f32; 3 * rows];
    let step = LoraStep::new([(Some(&b), 1), (Some(&a), 1), (None, 1)]).unwrap();
    step.apply(Target::Gate, 0, &x, &mut mixed).unwrap();
    let mut alone = vec![0f32; rows];
    let one = LoraStep::new([(Some(&a), 1)]).unwrap();
    one.apply(Target::Gate, 0, &x[cols..2 * cols], &mut alone)
        .unwrap();
    assert_eq!(&mixed[rows..2 * rows], alone.as_slice(), "bit for bit");
}

#[test]
fn the_tensor_hook_on_host_and_on_a_device_equals_the_slice_hook() {
    let t = Tiny::default();
    let dir = tempfile::tempdir().unwrap();
    // One adapter without k: its section of [q | k | v] stays the base's.
    let spec = LoraSpec {
        targets: vec![Target::Q, Target::V, Target::Down],
        ..LoraSpec::all(4, 5)
    };
    let a = adapter(dir.path(), "a", &t, &spec);
    let b = adapter(dir.path(), "b", &t, &LoraSpec::all(2, 6));
    let s = shapes(&t);
    let widths: Vec<usize> = [Target::Q, Target::K, Target::V]
        .iter()
        .map(|&t| s.dims(t).0)
        .collect();
    let (n, hidden, total) = (5, t.hidden, widths.iter().sum::<usize>());
    let x: Vec<f32> = (0..n * hidden)
        .map(|i| ((i * 31) % 29) as f32 / 29.0 - 0.5)
        .collect();
    let out: Vec<f32> = (0..n * total).map(|i| (i % 3) as f32).collect();
    let spans = [(Some(&a), 2), (None, 1), (Some(&b), 2)];
    let xt = Tensor::from_slice(&x, (n, hidden), &Device::Cpu).unwrap();
    let ot = Tensor::from_slice(&out, (n, total), &Device::Cpu).unwrap();
    let qkv = [Target::Q, Target::K, Target::V];
    let host = LoraStep::new(spans).unwrap();
    let got_host = host.add(&qkv, 0, &xt, ot.clone()).unwrap();
    let slots = DeviceSlots::new(2);
    let dev = LoraStep::new(spans)
        .unwrap()
        .on_device(&Device::Cpu, &slots)
        .unwrap();
    let got_dev = dev.add(&qkv, 0, &xt, ot).unwrap();
    assert_eq!(slots.held(), 2);
    // The reference: each section through the slice hook.
    let mut want = out.clone();
    let mut off = 0;
    for (&target, &w) in qkv.iter().zip(&widths) {
        let mut sec: Vec<f32> = (0..n)
            .flat_map(|r| want[r * total + off..r * total + off + w].to_vec())
            .collect();
        host.apply(target, 0, &x, &mut sec).unwrap();
        for r in 0..n {
            want[r * total + off..r * total + off + w].copy_from_slice(&sec[r * w..(r + 1) * w]);
        }
        off += w;
    }
    let flat = |t: Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert!(max_diff(&flat(got_host), &want) < 1e-5);
    assert!(max_diff(&flat(got_dev), &want) < 1e-4);
    // a has no k: row 0's k section is untouched.
    let k0 = &want[widths[0]..widths[0] + widths[1]];
    assert_eq!(k0, &out[widths[0]..widths[0] + widths[1]]);
}

#[test]
fn device_slots_keep_the_most_recently_used() {
    let t = Tiny::default();
    let dir = tempfile::tempdir().unwrap();
    let ads: Vec<LoraAdapter> = (0..3)
        .map(|i| adapter(dir.path(), &format!("a{i}"), &t, &LoraSpec::all(2, 10 + i)))
        .collect();
    let slots = DeviceSlots::new(2);
    let first = slots.get(&ads[0], &Device::Cpu).unwrap();
    slots.get(&ads[1], &Device::Cpu).unwrap();
    let again = slots.get(&ads[0], &Device::Cpu).unwrap();
    assert!(
        std::sync::Arc::ptr_eq(&first, &again),
        "a hit is not uploaded again"
    );
    slots.get(&ads[2], &Device::Cpu).unwrap();
    assert_eq!(slots.held(), 2);
    let evicted = slots.get(&ads[1], &Device::Cpu).unwrap();
    let kept = slots.get(&ads[2], &Device::Cpu).unwrap();
    assert!(evicted.pair(0, Target::Q).is_some() && kept.pair(0, Target::Q).is_some());
}

#[test]
fn peft_and_gguf_files_of_one_adapter_load_alike() {
    for arch in ["llama", "qwen2"] {
        let t = Tiny {
            arch,
            ..Tiny::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let spec = LoraSpec::all(4, 7);
        let tensors = random_peft(&t, &spec);
        write_peft(&dir.path().join("peft"), &spec, &tensors);
        let gguf = dir.path().join("lora.gguf");
        write_gguf_lora(&gguf, &t, &spec, &tensors);
        let s = shapes(&t);
        let p = load("x", &dir.path().join("peft"), &s, 16).unwrap();
        let g = load("x", &gguf, &s, 16).unwrap();
        assert_eq!(p.digest(), g.digest(), "{arch}: same weights, same digest");
        assert_ne!(p.id(), g.id());
        assert_eq!((p.rank(), p.targets().len()), (4, 7));
        assert_eq!(p.pair(1, Target::Q).unwrap().scale(), 2.0);
        assert_eq!(p.cache_key(), format!("x@{}", p.digest()));
        let bytes: u64 = (0..t.layers)
            .flat_map(|_| Target::ALL)
            .map(|t| {
                let (o, i) = s.dims(t);
                2 * 4 * (o + i) as u64
            })
            .sum();
        assert_eq!(p.bytes(), bytes);
        // The plan counts what the server holds.
        let g = ferrox_plan::ModelGeometry {
            layers: t.layers as u64,
            kv_heads: t.kv_heads as u64,
            head_dim: (t.hidden / t.heads) as u64,
            kv_dtype: ferrox_plan::KvDtype::F16,
            weight_bytes: 0,
            context_length: t.context as u64,
            heads: t.heads as u64,
            hidden_size: t.hidden as u64,
            intermediate_size: t.intermediate as u64,
            vocab_size: t.vocab as u64,
            ..ferrox_plan::ModelGeometry::default()
        };
        assert_eq!(g.lora_adapter_bytes(4), p.bytes());
    }
}

/// Writes `tensors` as a PEFT directory, then `edit`s its files.
fn refused(tensors: &HashMap<String, Tensor>, spec: &LoraSpec, edit: impl FnOnce(&Path)) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad");
    write_peft(&path, spec, tensors);
    edit(&path);
    let err = load("bad-one", &path, &shapes(&Tiny::default()), 8).unwrap_err();
    err.to_string()
}

#[test]
fn bad_adapters_are_refused_with_their_name_and_reason() {
    let t = Tiny::default();
    let spec = LoraSpec::all(4, 9);
    let good = random_peft(&t, &spec);
    let big = LoraSpec::all(16, 9);
    let wide = Tiny {
        hidden: 32,
        heads: 2,
        kv_heads: 1,
        ..t
    };
    let mut unknown = good.clone();
    unknown.insert(
        "base_model.model.lm_head.lora_A.weight".into(),
        Tensor::zeros((4, 64), candle_core::DType::F32, &Device::Cpu).unwrap(),
    );
    let mut half = good.clone();
    half.remove("base_model.model.model.layers.1.mlp.up_proj.lora_B.weight");
    let mut deep = good.clone();
    let extra = Tensor::zeros((4, 64), candle_core::DType::F32, &Device::Cpu).unwrap();
    deep.insert(
        "base_model.model.model.layers.5.self_attn.q_proj.lora_A.weight".into(),
        extra.clone(),
    );
    deep.insert(
        "base_model.model.model.layers.5.self_attn.q_proj.lora_B.weight".into(),
        extra.t().unwrap(),
    );
    let truncate = |p: &Path| {
        let f = p.join("adapter_model.safetensors");
        let len = std::fs::metadata(&f).unwrap().len();
        let file = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
        file.set_len(len / 2).unwrap();
    };
    let cases: Vec<(String, &str)> = vec![
        (
            refused(&random_peft(&t, &big), &big, |_| {}),
            "rank 16 is above --max-lora-rank 8",
        ),
        (
            refused(&random_peft(&wide, &spec), &spec, |_| {}),
            "the base model's is",
        ),
        (refused(&good, &spec, truncate), "unreadable"),
        (
            refused(&unknown, &spec, |_| {}),
            "unknown target: tensor base_model.model.lm_head",
        ),
        (refused(&half, &spec, |_| {}), "only one of lora_A, lora_B"),
        (
            refused(&deep, &spec, |_| {}),
            "it updates layer 5, the base has 2",
        ),
        (
            refused(&good, &spec, |p| {
                std::fs::remove_file(p.join("adapter_model.safetensors")).unwrap()
            }),
            "is missing",
        ),
    ];
    for (err, why) in cases {
        assert!(
            err.contains("\"bad-one\"") && err.contains(why),
            "{err} lacks {why}"
        );
    }
}

#[test]
fn bad_gguf_adapters_are_refused_with_their_name_and_reason() {
    let t = Tiny::default();
    let spec = LoraSpec::all(4, 11);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.gguf");
    write_gguf_lora(&path, &t, &spec, &random_peft(&t, &spec));
    let len = std::fs::metadata(&path).unwrap().len();
    let short = dir.path().join("short.gguf");
    std::fs::copy(&path, &short).unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&short)
        .unwrap();
    f.set_len(len - 100).unwrap();
    let base = dir.path().join("base.gguf");
    let w = crate::fixtures::random_weights(&t, 1);
    crate::fixtures::write_gguf(&base, &t, &w, candle_core::quantized::GgmlDType::F32);
    let s = shapes(&t);
    for (p, why) in [(&short, "truncated file"), (&base, "not a GGUF LoRA")] {
        let err = load("g", p, &s, 16).unwrap_err().to_string();
        assert!(
            err.contains("\"g\"") && err.contains(why),
            "{err} lacks {why}"
        );
    }
    assert!(load("g", &path, &s, 16).is_ok());
}
