//! Tiny random-weight models written to a temp dir and read back through the
//! real loaders.

use std::path::Path;

use candle_core::Device;
use candle_core::quantized::GgmlDType;
use ferrox_core::batch_model::{PrefillChunk, StepLogits};
use ferrox_core::{BatchModel, BlockPool, DecodeRow};
use ferrox_plan::KvDtype;

use super::helpers::{Joiner, Pools, argmax, full, greedy_alone, greedy_batched, prefill};
use crate::fixtures::{Tiny, random_weights, write_gguf, write_safetensors};
use crate::{Error, PagedModel, Source};

fn open(path: &Path) -> PagedModel {
    open_kv(path, KvDtype::F32)
}

fn open_kv(path: &Path, kv: KvDtype) -> PagedModel {
    let llama = Source::open(path).unwrap().decoder(&Device::Cpu).unwrap();
    PagedModel::new(llama, 64, 4, kv).unwrap()
}

fn prompt(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + seed * 11) % 96).collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn last_logits(m: &mut PagedModel, p: &[u32], chunk: usize) -> Vec<f32> {
    let mut kv = Pools::of(m).seq(p.len(), chunk);
    prefill(m, &mut kv, p, chunk)
}

#[test]
fn gguf_and_safetensors_give_the_same_logits() {
    for arch in ["llama", "qwen2"] {
        let t = Tiny {
            arch,
            ..Tiny::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let w = random_weights(&t, 1);
        write_safetensors(dir.path(), &t, &w);
        let gguf = dir.path().join("tiny.gguf");
        write_gguf(&gguf, &t, &w, GgmlDType::F32);
        let p = prompt(23, 1);
        let a = last_logits(&mut open(dir.path()), &p, 64);
        let b = last_logits(&mut open(&gguf), &p, 64);
        assert!(max_diff(&a, &b) < 1e-4, "{arch}: {}", max_diff(&a, &b));
    }
}

#[test]
fn llama3_rope_scaling_agrees_between_formats_and_changes_the_output() {
    let t = Tiny {
        rope_scaling: true,
        ..Tiny::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let w = random_weights(&t, 7);
    write_safetensors(dir.path(), &t, &w);
    let gguf = dir.path().join("scaled.gguf");
    write_gguf(&gguf, &t, &w, GgmlDType::F32);
    let plain = dir.path().join("plain.gguf");
    write_gguf(&plain, &Tiny::default(), &w, GgmlDType::F32);
    let p = prompt(60, 3);
    let a = last_logits(&mut open(dir.path()), &p, 64);
    let b = last_logits(&mut open(&gguf), &p, 64);
    assert!(max_diff(&a, &b) < 1e-4, "{}", max_diff(&a, &b));
    let c = last_logits(&mut open(&plain), &p, 64);
    assert!(max_diff(&a, &c) > 1e-3, "scaling made no difference");
}

#[test]
fn quantized_kernels_track_f32_weights() {
    let t = Tiny::default();
    let dir = tempfile::tempdir().unwrap();
    let w = random_weights(&t, 2);
    let (f32_path, q8_path) = (dir.path().join("f32.gguf"), dir.path().join("q8.gguf"));
    write_gguf(&f32_path, &t, &w, GgmlDType::F32);
    write_gguf(&q8_path, &t, &w, GgmlDType::Q8_0);
    let p = prompt(17, 2);
    let a = last_logits(&mut open(&f32_path), &p, 64);
    let b = last_logits(&mut open(&q8_path), &p, 64);
    let dot: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    let cosine = dot / (norm(&a) * norm(&b));
    assert!(cosine > 0.995, "cosine {cosine}");
}

#[test]
fn fused_attention_matches_the_generic_path() {
    for kv in [KvDtype::F32, KvDtype::F16, KvDtype::Bf16] {
        fused_matches_generic(kv);
    }
}

fn fused_matches_generic(kv: KvDtype) {
    let t = Tiny::default();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q8.gguf");
    write_gguf(&path, &t, &random_weights(&t, 3), GgmlDType::Q8_0);
    let mut fused = open_kv(&path, kv);
    let mut generic = open_kv(&path, kv);
    generic.decoder_mut().set_fused_attention(false);
    let pool = BlockPool::new(64);
    let (a, b) = (pool.allocate(8).unwrap(), pool.allocate(8).unwrap());
    let (p1, p2) = (prompt(13, 4), prompt(6, 5));
    for m in [&mut fused, &mut generic] {
        // Chunks that start mid-block (block size 4).
        m.prefill(&full(&a), &p1[..6], 0, false).unwrap();
        m.prefill(&full(&a), &p1[6..], 6, true).unwrap();
        m.prefill(&full(&b), &p2, 0, true).unwrap();
    }
    let rows = [
        DecodeRow {
            token: 5,
            pos: 13,
            tables: &full(&a),
        },
        DecodeRow {
            token: 9,
            pos: 6,
            tables: &full(&b),
        },
    ];
    let (x, y) = (fused.decode(&rows).unwrap(), generic.decode(&rows).unwrap());
    for (r, (lx, ly)) in x.iter().zip(&y).enumerate() {
        assert!(
            max_diff(lx, ly) < 1e-4,
            "{kv} row {r}: {}",
            max_diff(lx, ly)
        );
    }
}

#[test]
fn chunk_sizes_agree_and_batches_equal_singles() {
    for kv in [KvDtype::F32, KvDtype::F16] {
        chunks_and_batches(kv);
    }
}

fn chunks_and_batches(kv: KvDtype) {
    let t = Tiny::default();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q4.gguf");
    write_gguf(&path, &t, &random_weights(&t, 4), GgmlDType::Q4_1);
    let mut m = open_kv(&path, kv);
    let p = prompt(70, 6);
    let whole = last_logits(&mut m, &p, 70);
    for chunk in [1, 7, 64] {
        let got = last_logits(&mut m, &p, chunk);
        assert!(max_diff(&got, &whole) < 1e-4, "chunk {chunk}");
    }
    let pool = Pools::of(&m);
    let seqs = vec![
        Joiner {
            prompt: prompt(9, 1),
            join: 0,
            n: 10,
        },
        Joiner {
            prompt: prompt(3, 2),
            join: 0,
            n: 4,
        },
        Joiner {
            prompt: prompt(21, 3),
            join: 3,
            n: 8,
        },
        Joiner {
            prompt: prompt(14, 4),
            join: 5,
            n: 6,
        },
    ];
    let batched = greedy_batched(&mut m, &pool, &seqs, 5);
    for (s, got) in seqs.iter().zip(&batched) {
        assert_eq!(got, &greedy_alone(&mut m, &pool, &s.prompt, s.n, 64));
    }
    assert_eq!(pool.used(), 0);
    assert!(argmax(&whole) < 96);
}

#[test]
fn bad_files_are_clear_errors() {
    let t = Tiny::default();
    let dir = tempfile::tempdir().unwrap();
    let w = random_weights(&t, 5);

    let path = dir.path().join("gptneox.gguf");
    write_gguf(
        &path,
        &Tiny {
            arch: "gptneox",
            ..t
        },
        &w,
        GgmlDType::F32,
    );
    let err = Source::open(&path)
        .unwrap()
        .decoder(&Device::Cpu)
        .unwrap_err();
    assert!(
        matches!(&err, Error::UnknownArchitecture { name: a, .. } if a == "gptneox"),
        "{err}"
    );

    let mut missing = w.clone();
    missing.remove("model.layers.1.mlp.up_proj.weight");
    let path = dir.path().join("missing.gguf");
    write_gguf(&path, &t, &missing, GgmlDType::F32);
    let err = Source::open(&path)
        .unwrap()
        .decoder(&Device::Cpu)
        .unwrap_err();
    assert!(err.to_string().contains("blk.1.ffn_up.weight"), "{err}");

    let path = dir.path().join("truncated.gguf");
    write_gguf(&path, &t, &w, GgmlDType::F32);
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len - 100)
        .unwrap();
    let err = Source::open(&path)
        .and_then(|mut s| s.decoder(&Device::Cpu))
        .unwrap_err();
    assert!(err.to_string().contains("truncated"), "{err}");

    let path = dir.path().join("garbage.gguf");
    std::fs::write(&path, b"definitely not a model").unwrap();
    assert!(matches!(Source::open(&path), Err(Error::Corrupt { .. })));
    assert!(matches!(
        Source::open(&dir.path().join("absent.gguf")),
        Err(Error::Io { .. })
    ));

    let st = dir.path().join("st");
    std::fs::create_dir(&st).unwrap();
    write_safetensors(&st, &t, &w);
    let f = st.join("model.safetensors");
    let len = std::fs::metadata(&f).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let err = Source::open(&st)
        .unwrap()
        .decoder(&Device::Cpu)
        .unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
}

#[test]
fn positions_past_the_blocks_are_errors_not_panics() {
    let t = Tiny::default();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q8.gguf");
    write_gguf(&path, &t, &random_weights(&t, 6), GgmlDType::Q8_0);
    let mut m = open(&path);
    let pool = BlockPool::new(64);
    let lease = pool.allocate(1).unwrap();
    assert!(m.prefill(&full(&lease), &prompt(5, 1), 0, true).is_err());
    let row = DecodeRow {
        token: 1,
        pos: 300,
        tables: &full(&lease),
    };
    assert!(m.decode(&[row]).is_err());
    let row = DecodeRow {
        token: 1000,
        pos: 0,
        tables: &full(&lease),
    };
    assert!(m.decode(&[row]).is_err());
}

#[test]
fn a_mixed_step_gives_the_logits_of_separate_prefill_and_decode_calls() {
    let t = Tiny::default();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q8.gguf");
    write_gguf(&path, &t, &random_weights(&t, 7), GgmlDType::Q8_0);
    let (mut mixed, mut separate) = (open(&path), open(&path));
    let pool = BlockPool::new(64);
    let (mut x, y, z) = (
        pool.allocate(8).unwrap(),
        pool.allocate(8).unwrap(),
        pool.allocate(8).unwrap(),
    );
    let (px, py, pz) = (prompt(9, 1), prompt(11, 2), prompt(5, 3));
    for m in [&mut mixed, &mut separate] {
        prefill(m, &mut x, &px, 64);
    }
    let (tx, ty, tz) = (full(&x), full(&y), full(&z));
    let chunk = |tables, tokens, pos, want_logits| PrefillChunk {
        tables,
        tokens,
        pos,
        want_logits,
        all_logits: false,
    };
    let row = |token, pos, tables| DecodeRow { token, pos, tables };
    // Step 1: y's first chunk (mid-block end), z whole, x decodes.
    let chunks = [chunk(&ty, &py[..6], 0, false), chunk(&tz, &pz[..], 0, true)];
    let rows = [row(7, 9, &tx)];
    let got = mixed.step(&chunks, &rows).unwrap();
    assert_eq!(got.prefill.len(), 2);
    assert!(got.prefill[0].is_none());
    assert!(
        separate
            .prefill(&full(&y), &py[..6], 0, false)
            .unwrap()
            .is_none()
    );
    let z_alone = separate.prefill(&full(&z), &pz, 0, true).unwrap().unwrap();
    let x_alone = separate.decode(&rows).unwrap();
    let z_mixed = got.prefill[1].as_ref().unwrap();
    assert!(
        max_diff(z_mixed, &z_alone) < 1e-4,
        "{}",
        max_diff(z_mixed, &z_alone)
    );
    assert_eq!(got.decode.len(), 1);
    assert!(max_diff(&got.decode[0], &x_alone[0]) < 1e-4);
    // Step 2: y's final chunk starts mid-block; x and z decode.
    let chunks = [chunk(&ty, &py[6..], 6, true)];
    let rows = [row(3, 10, &tx), row(4, 5, &tz)];
    let got = mixed.step(&chunks, &rows).unwrap();
    let y_alone = separate
        .prefill(&full(&y), &py[6..], 6, true)
        .unwrap()
        .unwrap();
    let rows_alone = separate.decode(&rows).unwrap();
    let y_mixed = got.prefill[0].as_ref().unwrap();
    assert!(
        max_diff(y_mixed, &y_alone) < 1e-4,
        "{}",
        max_diff(y_mixed, &y_alone)
    );
    for (r, (a, b)) in got.decode.iter().zip(&rows_alone).enumerate() {
        assert!(max_diff(a, b) < 1e-4, "row {r}: {}", max_diff(a, b));
    }
    assert_eq!(got.decode.len(), 2);
    // An empty step is empty, not an error.
    assert_eq!(mixed.step(&[], &[]).unwrap(), StepLogits::default());
}

#[test]
fn all_logits_of_a_chunk_are_each_prefix_s_last_logits() {
    let t = Tiny::default();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q8.gguf");
    write_gguf(&path, &t, &random_weights(&t, 7), GgmlDType::Q8_0);
    let (mut mixed, mut alone) = (open(&path), open(&path));
    let pool = BlockPool::new(64);
    let (mut x, y) = (pool.allocate(8).unwrap(), pool.allocate(8).unwrap());
    let (px, py) = (prompt(9, 1), prompt(7, 2));
    prefill(&mut mixed, &mut x, &px, 64);
    // y's second chunk wants every token's logits, beside a decode row of x.
    let first = PrefillChunk {
        tables: &full(&y),
        tokens: &py[..3],
        pos: 0,
        want_logits: false,
        all_logits: false,
    };
    mixed.step(&[first], &[]).unwrap();
    let second = PrefillChunk {
        tokens: &py[3..],
        pos: 3,
        want_logits: true,
        all_logits: true,
        ..first
    };
    let row = DecodeRow {
        token: 5,
        pos: 9,
        tables: &full(&x),
    };
    let got = mixed.step(&[second], &[row]).unwrap();
    assert_eq!((got.prompt.len(), got.prompt[0].len()), (1, 4));
    for (i, logits) in got.prompt[0].iter().enumerate() {
        let want = last_logits(&mut alone, &py[..4 + i], 64);
        assert!(
            max_diff(logits, &want) < 1e-4,
            "token {i}: {}",
            max_diff(logits, &want)
        );
    }
    assert_eq!(got.prefill[0].as_ref(), got.prompt[0].last());
    assert_eq!(got.decode.len(), 1);
}

#[test]
fn inspect_counts_the_bytes_the_decoder_holds() {
    use candle_core::DType;
    use ferrox_plan::DeviceKind;
    let t = Tiny::default();
    let dir = tempfile::tempdir().unwrap();
    let w = random_weights(&t, 7);
    let mut paths = Vec::new();
    for dtype in [
        GgmlDType::F32,
        GgmlDType::F16,
        GgmlDType::Q8_0,
        GgmlDType::Q4_0,
        GgmlDType::Q4_1,
    ] {
        let p = dir.path().join(format!("{dtype:?}.gguf"));
        write_gguf(&p, &t, &w, dtype);
        paths.push(p);
    }
    // A bf16 checkpoint: the CPU path widens it to f32, twice its file size.
    let st = dir.path().join("bf16");
    std::fs::create_dir(&st).unwrap();
    let half: std::collections::HashMap<_, _> = w
        .iter()
        .map(|(k, v)| (k.clone(), v.to_dtype(DType::BF16).unwrap()))
        .collect();
    write_safetensors(&st, &t, &half);
    paths.push(st.clone());
    for p in &paths {
        let mut src = Source::open(p).unwrap();
        let info = src.info().unwrap();
        let held = src.decoder(&Device::Cpu).unwrap().held_bytes();
        assert_eq!(info.devices.cpu.weight_bytes, held, "{}", p.display());
        assert_eq!(info.facts.weight_bytes, held);
        assert_eq!(info.devices.on(DeviceKind::Cpu).kv_dtype, KvDtype::F16);
    }
    // A GPU holds the matrices in bf16 (half the CPU's f32), vectors in f32
    // on both: twice the GPU's bytes less the CPU's is the vectors' f32 bytes.
    let info = Source::open(&st).unwrap().info().unwrap();
    let vector_bytes: u64 = w
        .values()
        .filter(|t| t.rank() == 1)
        .map(|t| 4 * t.elem_count() as u64)
        .sum();
    assert!(vector_bytes > 0);
    assert_eq!(
        2 * info.devices.cuda.weight_bytes - info.devices.cpu.weight_bytes,
        vector_bytes
    );
    assert_eq!(info.devices.cuda.kv_dtype, KvDtype::F16);
}

#[test]
fn fused_layers_match_the_op_by_op_path_for_every_format() {
    for (arch, ty) in [
        ("llama", GgmlDType::Q4_0),
        ("llama", GgmlDType::Q4_1),
        ("llama", GgmlDType::Q8_0),
        ("qwen2", GgmlDType::Q4_1),
    ] {
        let t = Tiny {
            arch,
            ..Tiny::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        write_gguf(&path, &t, &random_weights(&t, 8), ty);
        let (mut fused, mut ops) = (open(&path), open(&path));
        ops.decoder_mut().set_fused_layers(false);
        assert!(
            fused.decoder().fused_layers(),
            "{arch} {ty:?}: fused path not taken"
        );
        assert!(!ops.decoder().fused_layers());
        // A mixed step of chunks and a decode row, then decode of all three.
        let pool = BlockPool::new(64);
        let (mut a, mut b) = (pool.allocate(8).unwrap(), pool.allocate(8).unwrap());
        let (pa, pb) = (prompt(19, 1), prompt(9, 2));
        let mut logits = Vec::new();
        for m in [&mut fused, &mut ops] {
            let la = prefill(m, &mut a, &pa, 7);
            let lb = prefill(m, &mut b, &pb, 64);
            let rows = [
                DecodeRow {
                    token: 3,
                    pos: pa.len(),
                    tables: &full(&a),
                },
                DecodeRow {
                    token: 11,
                    pos: pb.len(),
                    tables: &full(&b),
                },
            ];
            let d = m.decode(&rows).unwrap();
            logits.push([la, lb, d[0].clone(), d[1].clone()]);
        }
        for (i, (x, y)) in logits[0].iter().zip(&logits[1]).enumerate() {
            // Same quantisation, same RoPE and norm arithmetic: only the
            // summation order inside the matmuls differs.
            assert!(
                max_diff(x, y) < 1e-4,
                "{arch} {ty:?} output {i}: {}",
                max_diff(x, y)
            );
        }
    }
}
