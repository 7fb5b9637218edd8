use half::f16;

use super::*;
use crate::fixtures::{Scales, random_blocks};
use crate::quant_type::{QK_K, QuantType};
use crate::test_util::{Rng, rel_err};

/// `matmul` through one kernel, into one plain output.
fn run(k: Kernel, w: &QMatrix, x: &[f32], batch: usize) -> Vec<f32> {
    let mut acts = QActs::new();
    acts.quantize(x, batch).unwrap();
    let mut out = vec![0f32; batch * w.rows()];
    w.matmul_acts_with(k, &acts, &mut [&mut out], false)
        .unwrap();
    out
}

fn matrix(rng: &mut Rng, ty: QuantType, rows: usize, cols: usize, scales: Scales) -> QMatrix {
    QMatrix::new(ty, rows, cols, random_blocks(rng, ty, rows, cols, scales)).unwrap()
}

/// f32 math on the dequantized matrix.
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
    // The narrower paths stay on every x86 machine that has them, even
    // where a wider one is what `detect` picks: the tests below force each.
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            assert!(kernels().contains(&Kernel::Avx2));
        }
        if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512bw") {
            assert_eq!(Kernel::detect(), Kernel::Avx512Vnni);
        }
    }
}

#[test]
fn scalar_matmul_is_within_activation_quant_error_of_f32_math() {
    // The definition's only approximation is the activation's 8-bit
    // quantisation (~1/254 of each block's largest value): on random
    // weights the result stays within 1.5% (2-norm) of f32 math.
    let mut rng = Rng::new(1);
    for ty in QuantType::ALL {
        let n = ty.block_len();
        for (rows, cols, batch) in [(64, 2 * n, 1), (37, n, 5), (130, 3 * n, 9)] {
            let w = matrix(&mut rng, ty, rows, cols, Scales::Plausible);
            let x = rng.vec(batch * cols);
            let want = reference(&w, &x, batch);
            for k in [Kernel::Scalar, Kernel::detect()] {
                let err = rel_err(&run(k, &w, &x, batch), &want);
                assert!(
                    err < 1.5e-2,
                    "{k:?} {ty:?} {rows}x{cols} b{batch}: rel err {err}"
                );
            }
        }
    }
}

#[test]
fn every_kernel_agrees_with_scalar_bit_for_bit() {
    let mut rng = Rng::new(2);
    // Rows 1..=9 (every padded group, a lone last panel) by batches 1..=9;
    // batches 1..=40 over 3 panels; then batches past the 32-row panels
    // with a lone last group; extreme and plausible scales alike.
    let mut shapes: Vec<(usize, usize, usize)> = Vec::new();
    for rows in 1..=9 {
        for batch in 1..=9 {
            shapes.push((rows, batch, 1 + (rows + batch) % 2));
        }
    }
    shapes.extend((1..=40).map(|batch| (41, batch, 2)));
    // Past 64 rows the tasks take 32-row activation panels, past 256 (of
    // short rows) 64-row ones.
    shapes.extend([(17, 77, 3), (72, 130, 1), (24, 300, 1)]);
    for ty in QuantType::ALL {
        for (i, &(rows, batch, blocks)) in shapes.iter().enumerate() {
            let cols = blocks * ty.block_len();
            let scales = if i % 2 == 0 {
                Scales::Extreme
            } else {
                Scales::Plausible
            };
            let w = matrix(&mut rng, ty, rows, cols, scales);
            let x: Vec<f32> = rng.vec(batch * cols).iter().map(|v| v * 8.0).collect();
            let want = run(Kernel::Scalar, &w, &x, batch);
            for k in kernels() {
                let got = run(k, &w, &x, batch);
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{k:?} {ty:?} {rows}x{cols} b{batch} {scales:?}"
                );
            }
        }
    }
}

/// The widest fixed tile of `k` (batches up to 8): the 512-bit kernel's
/// 8 rows, the 256-bit kernels' 4.
fn small_tile(k: Kernel) -> usize {
    #[cfg(target_arch = "x86_64")]
    if k == Kernel::Avx512Vnni {
        return 8;
    }
    let _ = k;
    4
}

#[test]
fn decode_batches_take_one_pass_of_wide_tiles_and_match_scalar() {
    // Past 8 rows a group's activation rows run in tiles of up to 16 (each
    // block unpacked once for them all), the rest in one narrower tile;
    // up to 8, fixed tiles of 8, 4, 2, 1. 40 rows: two whole panels and a
    // lone last group (the 512-bit kernel's half-panel tiles); 2 x 8192
    // columns for Q8_0..Q5_1 and 2 super-blocks otherwise, so rows sit a
    // padded stride apart.
    let mut rng = Rng::new(12);
    let batches = [1, 7, 8, 9, 15, 16, 17, 31, 32, 33];
    for ty in QuantType::ALL {
        let cols = if ty.block_len() == QK_K { 512 } else { 8192 };
        let w = matrix(&mut rng, ty, 40, cols, Scales::Extreme);
        let mut acts = QActs::new();
        acts.quantize(
            &rng.vec(33 * cols)
                .iter()
                .map(|v| v * 8.0)
                .collect::<Vec<_>>(),
            33,
        )
        .unwrap();
        for &batch in &batches {
            let collect = |k: Kernel| {
                let (mut cells, mut tiles) = (Vec::new(), Vec::new());
                k.tiles(
                    &w,
                    (0, w.groups()),
                    &acts,
                    (0, batch),
                    &mut |g, (n, aa), t| {
                        tiles.push((g, n, aa));
                        for (j, row) in t.iter().enumerate().take(aa) {
                            cells.extend(
                                row.iter()
                                    .enumerate()
                                    .map(|(r, v)| (g, n + j, r, v.to_bits())),
                            );
                        }
                    },
                );
                cells.sort_unstable();
                tiles.sort_unstable();
                (cells, tiles)
            };
            let (want, _) = collect(Kernel::Scalar);
            for k in kernels().into_iter().filter(|&k| k != Kernel::Scalar) {
                let (got, tiles) = collect(k);
                assert_eq!(got, want, "{k:?} {ty:?} b{batch}");
                let widths: Vec<usize> = tiles.iter().filter(|t| t.0 == 0).map(|t| t.2).collect();
                let most = if batch > 8 { 16 } else { small_tile(k) };
                let mut expect = vec![most; batch / most];
                let rest = batch % most;
                if batch > 8 {
                    expect.extend((rest > 0).then_some(rest));
                } else {
                    expect.extend([4, 2, 1].into_iter().filter(|&t| rest & t != 0));
                }
                assert_eq!(widths, expect, "{k:?} {ty:?} b{batch}: tiles of group 0");
            }
        }
    }
}

#[test]
fn a_row_gets_the_same_bits_in_any_batch_and_tile() {
    // Batch invariance at the kernel: activation row n's outputs do not
    // depend on which tile width, tile position or panel computed them
    // (batch 1 runs 1-wide tiles, larger batches 4- and 8-wide ones and
    // their tails, over 64 rows 32-row panels).
    let mut rng = Rng::new(9);
    for ty in QuantType::ALL {
        for (rows, blocks) in [(13, 2), (24, 1)] {
            let cols = blocks * ty.block_len();
            let w = matrix(&mut rng, ty, rows, cols, Scales::Plausible);
            let x = rng.vec(70 * cols);
            for k in kernels() {
                let all = run(k, &w, &x, 70);
                for (n0, batch) in [(0, 1), (5, 1), (3, 3), (60, 10), (1, 6), (8, 13)] {
                    let got = run(k, &w, &x[n0 * cols..(n0 + batch) * cols], batch);
                    let want = &all[n0 * rows..(n0 + batch) * rows];
                    assert_eq!(
                        bits(&got),
                        bits(want),
                        "{k:?} {ty:?} {rows} rows {n0}+{batch}"
                    );
                }
            }
        }
    }
}

#[test]
fn parts_split_the_rows_and_add_accumulates() {
    let mut rng = Rng::new(5);
    let (rows, batch) = (40, 6);
    for ty in QuantType::ALL {
        let cols = 2 * ty.block_len();
        let w = matrix(&mut rng, ty, rows, cols, Scales::Plausible);
        let x = rng.vec(batch * cols);
        let mut acts = QActs::new();
        acts.quantize(&x, batch).unwrap();
        // Part lengths at group and panel boundaries (24, 8, 8), across them
        // (5, 2, 33) and a panel split between parts (8, 32): a tile's rows
        // may fall in two or three parts.
        for lens in [&[24, 8, 8][..], &[5, 2, 33], &[8, 32], &[1, 1, 1, 37]] {
            for k in kernels() {
                let whole = run(k, &w, &x, batch);
                let mut bufs: Vec<Vec<f32>> = lens
                    .iter()
                    .enumerate()
                    .map(|(p, &len)| vec![p as f32 + 1.0; batch * len])
                    .collect();
                let mut parts: Vec<&mut [f32]> =
                    bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
                w.matmul_acts_with(k, &acts, &mut parts, true).unwrap();
                for n in 0..batch {
                    let mut start = 0;
                    for (p, &len) in lens.iter().enumerate() {
                        for r in 0..len {
                            let want = p as f32 + 1.0 + whole[n * rows + start + r];
                            let got = bufs[p][n * len + r];
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{k:?} {ty:?} {lens:?} row {}",
                                start + r
                            );
                        }
                        start += len;
                    }
                }
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
        let out = run(k, &w, &[sign; 32], 1)[0];
        // Exact in integers; only the f16-rounded activation scale (as
        // GGML's Q8 blocks store it) moves the result, by < 1e-3 relative.
        assert!(
            (out - sign * -128.0 * 32.0).abs() < 4096.0 * 1e-3,
            "{k:?}: {out}"
        );
    }
}

#[test]
fn zero_input_gives_zero_output() {
    let mut rng = Rng::new(3);
    for ty in QuantType::ALL {
        let cols = ty.block_len();
        let w = matrix(&mut rng, ty, 10, cols, Scales::Plausible);
        for k in kernels() {
            let mut acts = QActs::new();
            acts.quantize(&vec![0f32; 2 * cols], 2).unwrap();
            let mut out = vec![1f32; 20];
            w.matmul_acts_with(k, &acts, &mut [&mut out], false)
                .unwrap();
            assert!(out.iter().all(|&v| v == 0.0), "{k:?} {ty:?}");
        }
    }
}

#[test]
fn rejects_bad_shapes() {
    let ok = || QMatrix::new(QuantType::Q8_0, 2, 32, vec![0; 68]).unwrap();
    let k4 = QMatrix::new(QuantType::Q4_K, 2, 256, vec![0; 288]).unwrap();
    let cases: [(&str, Result<(), Error>, Error); 3] = [
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
            "too many parts",
            ok().matmul_acts(
                &acts(&[0.0; 32]),
                &mut [&mut [0.0], &mut [], &mut [], &mut [], &mut [0.0]],
                false,
            ),
            Error::Length {
                what: "matmul output",
                expected: 2,
                got: 2,
            },
        ),
    ];
    for (name, got, want) in cases {
        assert_eq!(got, Err(want), "{name}");
    }
    let mut out = [0.0; 4];
    assert!(matches!(
        k4.matmul_acts(&acts(&[0.0; 64]), &mut [&mut out], false),
        Err(Error::Length {
            what: "matmul input",
            ..
        })
    ));
}

fn acts(x: &[f32]) -> QActs {
    let mut a = QActs::new();
    a.quantize(x, 1).unwrap();
    a
}

#[test]
fn empty_batch_is_a_no_op() {
    let w = QMatrix::new(QuantType::Q4_0, 4, 32, vec![0; 72]).unwrap();
    assert_eq!(w.matmul(&[], 0, &mut []), Ok(()));
}

#[test]
fn tiles_over_any_group_range_match_scalar() {
    // `matmul` hands kernels whole panels; a range that starts or ends
    // inside one runs the 512-bit kernel's half-panel tiles: the same bits.
    let mut rng = Rng::new(11);
    for ty in QuantType::ALL {
        let cols = ty.block_len();
        let w = matrix(&mut rng, ty, 40, cols, Scales::Extreme);
        let mut acts = QActs::new();
        acts.quantize(&rng.vec(11 * cols), 11).unwrap();
        let collect = |k: Kernel, groups: (usize, usize)| {
            let mut cells = Vec::new();
            k.tiles(&w, groups, &acts, (0, 11), &mut |g, (n, aa), t| {
                for (j, row) in t.iter().enumerate().take(aa) {
                    cells.extend(
                        row.iter()
                            .enumerate()
                            .map(|(r, v)| (g, n + j, r, v.to_bits())),
                    );
                }
            });
            cells.sort_unstable();
            cells
        };
        for groups in [(0, 5), (1, 4), (1, 2), (3, 5), (2, 3), (4, 5)] {
            let want = collect(Kernel::Scalar, groups);
            assert_eq!(want.len(), (groups.1 - groups.0) * 8 * 11);
            for k in kernels() {
                assert_eq!(collect(k, groups), want, "{k:?} {ty:?} groups {groups:?}");
            }
        }
    }
}
