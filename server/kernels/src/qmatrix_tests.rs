use half::f16;

use super::*;
use crate::test_util::{Rng, rel_err};

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

/// Every kernel this CPU can run; the first is the scalar reference.
fn kernels() -> Vec<Kernel> {
    #[allow(unused_mut)]
    let mut ks = vec![Kernel::Scalar];
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
    {
        ks.push(Kernel::Avx2);
        if is_x86_feature_detected!("avxvnni") {
            ks.push(Kernel::AvxVnni);
        }
        if is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vnni")
        {
            ks.push(Kernel::Avx512Vnni);
        }
    }
    ks
}

#[test]
fn detect_picks_the_fastest_kernel() {
    assert_eq!(Kernel::detect(), *kernels().last().unwrap());
}

#[test]
fn simd_agrees_with_scalar() {
    let mut rng = Rng::new(2);
    for ty in TYPES {
        // Odd row counts and every batch remainder exercise each tile shape;
        // 96 columns = 3 blocks leave the two-block kernel a tail block.
        let shapes = [
            (7, 1),
            (9, 2),
            (33, 3),
            (64, 4),
            (65, 5),
            (18, 6),
            (31, 7),
            (200, 17),
        ];
        for ((rows, batch), cols) in shapes.into_iter().flat_map(|s| [(s, 96), (s, 128)]) {
            let w = QMatrix::new(ty, rows, cols, random_blocks(&mut rng, ty, rows, cols)).unwrap();
            let x = rng.vec(batch * cols);
            let mut want = vec![0f32; batch * rows];
            w.matmul_with(Kernel::Scalar, &x, batch, &mut want).unwrap();
            for k in kernels() {
                let mut got = vec![0f32; batch * rows];
                w.matmul_with(k, &x, batch, &mut got).unwrap();
                let err = rel_err(&got, &want);
                assert!(err < 1e-5, "{k:?} {ty:?} {rows} rows b{batch}: {err}");
            }
        }
    }
}

#[test]
fn q8_extreme_weights_do_not_saturate() {
    // -128 weights against +-127 activations: the largest maddubs pair sum.
    let mut data = f16::from_f32(1.0).to_le_bytes().to_vec();
    data.extend([0x80u8; 32]);
    let w = QMatrix::new(QuantType::Q8_0, 1, 32, data).unwrap();
    for (k, sign) in kernels().into_iter().flat_map(|k| [(k, 1.0f32), (k, -1.0)]) {
        let mut out = [0f32];
        w.matmul_with(k, &[sign; 32], 1, &mut out).unwrap();
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

#[test]
fn held_bytes_are_what_a_matrix_allocates() {
    let mut rng = Rng::new(11);
    for ty in [QuantType::Q4_0, QuantType::Q4_1, QuantType::Q8_0] {
        for (rows, cols) in [(1, 32), (7, 96), (64, 576)] {
            let m = QMatrix::new(ty, rows, cols, random_blocks(&mut rng, ty, rows, cols)).unwrap();
            assert_eq!(
                m.held_bytes(),
                ty.held_bytes(rows * cols),
                "{ty:?} {rows}x{cols}"
            );
            assert_eq!(m.held_bytes(), m.dm.capacity() * 4 + m.qs.capacity());
        }
    }
}
