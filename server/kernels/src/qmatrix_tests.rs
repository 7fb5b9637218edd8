use half::f16;

use super::*;
use crate::dot::Kernel;
use crate::qact::QActs;
use crate::test_util::{Rng, rel_err};

/// GGML's own dequantisation of raw blocks, independent of the repacking.
fn ggml_dequantize(ty: QuantType, data: &[u8]) -> Vec<f32> {
    let h = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
    let mut out = Vec::new();
    for blk in data.chunks_exact(ty.block_bytes()) {
        let d = h(blk, 0);
        match ty {
            QuantType::Q4_0 => {
                let q = &blk[2..18];
                out.extend(q.iter().map(|&b| (i32::from(b & 0x0F) - 8) as f32 * d));
                out.extend(q.iter().map(|&b| (i32::from(b >> 4) - 8) as f32 * d));
            }
            QuantType::Q4_1 => {
                let (m, q) = (h(blk, 2), &blk[4..20]);
                out.extend(q.iter().map(|&b| f32::from(b & 0x0F) * d + m));
                out.extend(q.iter().map(|&b| f32::from(b >> 4) * d + m));
            }
            QuantType::Q8_0 => out.extend(blk[2..34].iter().map(|&b| f32::from(b as i8) * d)),
        }
    }
    out
}

/// `matmul` through one kernel, into one plain output.
fn run(k: Kernel, w: &QMatrix, x: &[f32], batch: usize) -> Vec<f32> {
    let mut acts = QActs::new();
    acts.quantize(x, batch).unwrap();
    let mut out = vec![0f32; batch * w.rows()];
    w.matmul_acts_with(k, &acts, &mut [&mut out], false)
        .unwrap();
    out
}

/// Random GGML blocks with plausible scales (and minima for Q4_1).
fn random_blocks(rng: &mut Rng, ty: QuantType, rows: usize, cols: usize) -> Vec<u8> {
    let mut data = Vec::new();
    for _ in 0..rows * cols / QK {
        let d = f16::from_f32(0.01 + 0.02 * rng.f32().abs());
        data.extend_from_slice(&d.to_le_bytes());
        if ty == QuantType::Q4_1 {
            data.extend_from_slice(&f16::from_f32(-0.1 * rng.f32().abs()).to_le_bytes());
        }
        data.extend(rng.bytes(ty.block_bytes() - data.len() % ty.block_bytes()));
    }
    data
}

fn reference(w: &QMatrix, x: &[f32], batch: usize) -> Vec<f32> {
    let dq = w.dequantize();
    let mut out = vec![0f32; batch * w.rows()];
    for n in 0..batch {
        for m in 0..w.rows() {
            let row = &dq[m * w.cols()..(m + 1) * w.cols()];
            let xr = &x[n * w.cols()..(n + 1) * w.cols()];
            out[n * w.rows() + m] = row.iter().zip(xr).map(|(a, b)| a * b).sum();
        }
    }
    out
}

const TYPES: [QuantType; 3] = [QuantType::Q4_0, QuantType::Q4_1, QuantType::Q8_0];

/// Format, one block's bytes, expected value of weight j.
type Case = (QuantType, Vec<u8>, fn(usize) -> f32);

#[test]
fn dequantizes_known_blocks() {
    let half = |v: f32| f16::from_f32(v).to_le_bytes();
    let qs: Vec<u8> = (0..16u8).map(|j| j | ((15 - j) << 4)).collect();
    let mut q40 = half(0.5).to_vec();
    q40.extend(&qs);
    let mut q41 = half(0.5).to_vec();
    q41.extend(half(1.0));
    q41.extend(&qs);
    let mut q80 = half(0.25).to_vec();
    q80.extend((0..32).map(|j| (j as i8 - 16) as u8));
    let cases: [Case; 3] = [
        (QuantType::Q4_0, q40, |j| {
            0.5 * (if j < 16 { j as f32 } else { 31.0 - j as f32 } - 8.0)
        }),
        (QuantType::Q4_1, q41, |j| {
            0.5 * if j < 16 { j as f32 } else { 31.0 - j as f32 } + 1.0
        }),
        (QuantType::Q8_0, q80, |j| 0.25 * (j as f32 - 16.0)),
    ];
    for (ty, data, want) in cases {
        let w = QMatrix::new(ty, 1, 32, data).unwrap();
        let mut row = vec![0f32; 32];
        w.dequantize_row(0, &mut row).unwrap();
        for (j, &v) in row.iter().enumerate() {
            assert_eq!(v, want(j), "{ty:?} weight {j}");
        }
        assert_eq!(w.dequantize(), row);
    }
}

#[test]
fn matmul_matches_f32_reference_within_activation_quant_error() {
    let mut rng = Rng::new(1);
    for ty in TYPES {
        for (rows, cols, batch) in [(64, 576, 1), (37, 96, 5), (130, 256, 9)] {
            let w = QMatrix::new(ty, rows, cols, random_blocks(&mut rng, ty, rows, cols)).unwrap();
            let x = rng.vec(batch * cols);
            let mut out = vec![0f32; batch * rows];
            w.matmul(&x, batch, &mut out).unwrap();
            let err = rel_err(&out, &reference(&w, &x, batch));
            assert!(err < 1e-2, "{ty:?} {rows}x{cols} b{batch}: rel err {err}");
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

fn kernels() -> Vec<Kernel> {
    Kernel::available()
}

#[test]
fn detect_picks_the_fastest_kernel() {
    assert_eq!(Kernel::detect(), *kernels().last().unwrap());
    assert_eq!(kernels()[0], Kernel::Scalar);
    // The AVX2 path stays on every x86 machine that has it, even where
    // AVX-VNNI is what `detect` picks: the tests below force it.
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        assert!(kernels().contains(&Kernel::Avx2));
    }
}

#[test]
fn repacking_keeps_ggml_values_and_holds_exactly_the_planned_bytes() {
    let mut rng = Rng::new(4);
    for ty in TYPES {
        // Rows not a multiple of 8 pad the last group with zero rows.
        for (rows, cols) in [
            (1, 32),
            (3, 96),
            (5, 64),
            (2, 1056),
            (7, 160),
            (16, 96),
            (24, 64),
        ] {
            let data = random_blocks(&mut rng, ty, rows, cols);
            let w = QMatrix::new(ty, rows, cols, data.clone()).unwrap();
            assert_eq!(
                w.dequantize(),
                ggml_dequantize(ty, &data),
                "{ty:?} {rows}x{cols}"
            );
            let planned = ty.held_bytes(rows, cols).unwrap();
            assert_eq!(w.held_bytes(), planned, "{ty:?} {rows}x{cols}");
            let padded = data.len() / rows * rows.next_multiple_of(8);
            assert_eq!(planned, padded, "GGML's bytes, whole groups of 8 rows");
        }
    }
    assert_eq!(
        QuantType::Q4_1.held_bytes(3, 30),
        Err(Error::BadCols { cols: 30 })
    );
    assert_eq!(
        QuantType::Q8_0.held_bytes(usize::MAX, 64),
        Err(Error::Overflow("weight bytes"))
    );
}

#[test]
fn every_kernel_agrees_with_scalar_on_every_tile_remainder() {
    let mut rng = Rng::new(2);
    // Rows 1..=9 and batches 1..=9 hit every padded group and activation
    // tail; 96 columns = 3 blocks, 1056 = 33; 70 rows of activations split
    // into panels. Every kernel computes each cell in the reference's order,
    // so they agree bit for bit.
    let mut shapes: Vec<(usize, usize, usize)> = Vec::new();
    for rows in 1..=9 {
        for batch in 1..=9 {
            shapes.push((rows, batch, if (rows + batch) % 2 == 0 { 96 } else { 128 }));
        }
    }
    shapes.extend([
        (17, 9, 1536),
        (37, 3, 1056),
        (66, 70, 160),
        (200, 17, 576),
        (13, 130, 64),
    ]);
    for ty in TYPES {
        for &(rows, batch, cols) in &shapes {
            let w = QMatrix::new(ty, rows, cols, random_blocks(&mut rng, ty, rows, cols)).unwrap();
            let x = rng.vec(batch * cols);
            let want = run(Kernel::Scalar, &w, &x, batch);
            for k in kernels() {
                let got = run(k, &w, &x, batch);
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{k:?} {ty:?} {rows}x{cols} b{batch}"
                );
            }
        }
    }
}

#[test]
fn a_row_gets_the_same_bits_in_any_batch_and_tile() {
    // Batch invariance at the kernel: activation row n's outputs do not
    // depend on which tile width, tile position or panel computed them
    // (batch 1 runs 1-wide tiles, larger batches 4-wide ones and their
    // tails, over 64 rows 32-row panels).
    let mut rng = Rng::new(9);
    for ty in TYPES {
        for (rows, cols) in [(13, 576), (9, 1056), (7, 96)] {
            let w = QMatrix::new(ty, rows, cols, random_blocks(&mut rng, ty, rows, cols)).unwrap();
            let x = rng.vec(70 * cols);
            for k in kernels() {
                let all = run(k, &w, &x, 70);
                for (n0, batch) in [(0, 1), (5, 1), (3, 3), (60, 10), (1, 6)] {
                    let got = run(k, &w, &x[n0 * cols..(n0 + batch) * cols], batch);
                    let want = &all[n0 * rows..(n0 + batch) * rows];
                    assert_eq!(
                        bits(&got),
                        bits(want),
                        "{k:?} {ty:?} {rows}x{cols} rows {n0}+{batch}"
                    );
                }
            }
        }
    }
}

#[test]
fn parts_split_the_rows_and_add_accumulates() {
    let mut rng = Rng::new(5);
    let (rows, cols, batch) = (40, 64, 6);
    let w = QMatrix::new(
        QuantType::Q4_1,
        rows,
        cols,
        random_blocks(&mut rng, QuantType::Q4_1, rows, cols),
    )
    .unwrap();
    let x = rng.vec(batch * cols);
    let mut acts = QActs::new();
    acts.quantize(&x, batch).unwrap();
    // Part lengths at tile boundaries (24, 8, 8) and across them (5, 2, 33):
    // a tile's rows may fall in two or three parts.
    for lens in [[24, 8, 8], [5, 2, 33]] {
        for k in kernels() {
            let whole = run(k, &w, &x, batch);
            let mut bufs: Vec<Vec<f32>> = lens
                .iter()
                .enumerate()
                .map(|(p, &len)| vec![p as f32 + 1.0; batch * len])
                .collect();
            let mut parts: Vec<&mut [f32]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
            w.matmul_acts_with(k, &acts, &mut parts, true).unwrap();
            for n in 0..batch {
                let mut start = 0;
                for (p, &len) in lens.iter().enumerate() {
                    for r in 0..len {
                        let got = bufs[p][n * len + r] - (p as f32 + 1.0);
                        let want = whole[n * rows + start + r];
                        assert!(
                            (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                            "{k:?} parts {lens:?} row {} act {n}",
                            start + r
                        );
                    }
                    start += len;
                }
            }
        }
    }
    let mut short = vec![0f32; batch * 30];
    assert!(matches!(
        w.matmul_acts(&acts, &mut [&mut short], false),
        Err(Error::Length {
            what: "matmul output",
            ..
        })
    ));
}

#[test]
fn q8_extreme_weights_do_not_saturate() {
    // -128 weights against +-127 activations: the largest maddubs pair sum.
    let mut data = f16::from_f32(1.0).to_le_bytes().to_vec();
    data.extend([0x80u8; 32]);
    let w = QMatrix::new(QuantType::Q8_0, 1, 32, data).unwrap();
    for (k, sign) in kernels().into_iter().flat_map(|k| [(k, 1.0f32), (k, -1.0)]) {
        let mut out = [0f32];
        out[0] = run(k, &w, &[sign; 32], 1)[0];
        // Exact in integers; only the f16-rounded activation scale (as
        // GGML's Q8 blocks store it) moves the result, by < 1e-3 relative.
        assert!(
            (out[0] - sign * -128.0 * 32.0).abs() < 4096.0 * 1e-3,
            "{k:?}: {out:?}"
        );
    }
}

#[test]
fn zero_input_gives_zero_output() {
    let mut rng = Rng::new(3);
    for ty in TYPES {
        let w = QMatrix::new(ty, 10, 64, random_blocks(&mut rng, ty, 10, 64)).unwrap();
        let mut out = vec![1f32; 20];
        w.matmul(&[0f32; 128], 2, &mut out).unwrap();
        assert!(out.iter().all(|&v| v == 0.0));
    }
}

#[test]
fn rejects_bad_shapes() {
    let ok = || QMatrix::new(QuantType::Q8_0, 2, 32, vec![0; 68]).unwrap();
    let cases: [(&str, Result<(), Error>, Error); 5] = [
        (
            "cols not multiple",
            QMatrix::new(QuantType::Q4_0, 1, 30, vec![]).map(|_| ()),
            Error::BadCols { cols: 30 },
        ),
        (
            "data length",
            QMatrix::new(QuantType::Q4_1, 2, 32, vec![0; 39]).map(|_| ()),
            Error::Length {
                what: "weight data",
                expected: 40,
                got: 39,
            },
        ),
        (
            "input length",
            ok().matmul(&[0.0; 31], 1, &mut [0.0; 2]),
            Error::Length {
                what: "matmul input",
                expected: 32,
                got: 31,
            },
        ),
        (
            "output length",
            ok().matmul(&[0.0; 32], 1, &mut [0.0; 1]),
            Error::Length {
                what: "matmul output",
                expected: 2,
                got: 1,
            },
        ),
        (
            "row out of range",
            ok().dequantize_row(2, &mut [0.0; 32]),
            Error::RowOutOfRange { row: 2, rows: 2 },
        ),
    ];
    for (name, got, want) in cases {
        assert_eq!(got, Err(want), "{name}");
    }
}

#[test]
fn empty_batch_is_a_no_op() {
    let w = QMatrix::new(QuantType::Q4_0, 4, 32, vec![0; 72]).unwrap();
    assert_eq!(w.matmul(&[], 0, &mut []), Ok(()));
}
