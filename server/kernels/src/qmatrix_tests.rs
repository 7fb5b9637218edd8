use half::f16;

use super::*;
use crate::fixtures::{Scales, random_blocks};
use crate::test_util::Rng;

/// GGML's `dequantize_row_*` (ggml-quants.c) over raw blocks, written from
/// GGML's block layouts (ggml-common.h) and independent of the repacking.
fn ggml_dequantize(ty: QuantType, data: &[u8]) -> Vec<f32> {
    let h = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
    let mut out = Vec::new();
    for x in data.chunks_exact(ty.block_bytes()) {
        let mut y = vec![0f32; ty.block_len()];
        match ty {
            QuantType::Q4_0 | QuantType::Q4_1 => {
                let (d, one) = (h(x, 0), ty == QuantType::Q4_1);
                let (m, qs) = if one {
                    (h(x, 2), &x[4..20])
                } else {
                    (0.0, &x[2..18])
                };
                for j in 0..16 {
                    let (x0, x1) = (i32::from(qs[j] & 0x0F), i32::from(qs[j] >> 4));
                    if one {
                        (y[j], y[j + 16]) = (x0 as f32 * d + m, x1 as f32 * d + m);
                    } else {
                        (y[j], y[j + 16]) = ((x0 - 8) as f32 * d, (x1 - 8) as f32 * d);
                    }
                }
            }
            QuantType::Q5_0 | QuantType::Q5_1 => {
                let (d, one) = (h(x, 0), ty == QuantType::Q5_1);
                let (m, at) = if one { (h(x, 2), 4) } else { (0.0, 2) };
                let qh = u32::from_le_bytes([x[at], x[at + 1], x[at + 2], x[at + 3]]);
                let qs = &x[at + 4..at + 20];
                for j in 0..16 {
                    let xh_0 = (((qh >> j) << 4) & 0x10) as u8;
                    let xh_1 = ((qh >> (j + 12)) & 0x10) as u8;
                    let x0 = i32::from((qs[j] & 0x0F) | xh_0);
                    let x1 = i32::from((qs[j] >> 4) | xh_1);
                    if one {
                        (y[j], y[j + 16]) = (x0 as f32 * d + m, x1 as f32 * d + m);
                    } else {
                        (y[j], y[j + 16]) = ((x0 - 16) as f32 * d, (x1 - 16) as f32 * d);
                    }
                }
            }
            QuantType::Q8_0 => {
                for (v, &q) in y.iter_mut().zip(&x[2..34]) {
                    *v = f32::from(q as i8) * h(x, 0);
                }
            }
            QuantType::Q2_K => q2_k(x, h(x, 80), h(x, 82), &mut y),
            QuantType::Q3_K => q3_k(x, h(x, 108), &mut y),
            QuantType::Q4_K | QuantType::Q5_K => q45_k(x, ty == QuantType::Q5_K, &mut y),
            QuantType::Q6_K => q6_k(x, h(x, 208), &mut y),
            QuantType::MXFP4 => mxfp4(x, &mut y),
        }
        out.extend(y);
    }
    out
}

fn q2_k(x: &[u8], d: f32, min: f32, y: &mut [f32]) {
    let (scales, mut q) = (&x[0..16], &x[16..80]);
    let (mut is, mut at) = (0, 0);
    for _n in 0..2 {
        for shift in [0, 2, 4, 6] {
            for half in 0..2 {
                let sc = scales[is];
                is += 1;
                let (dl, ml) = (d * f32::from(sc & 0xF), min * f32::from(sc >> 4));
                for l in 0..16 {
                    y[at] = dl * f32::from(((q[l + 16 * half] >> shift) & 3) as i8) - ml;
                    at += 1;
                }
            }
        }
        q = &q[32..];
    }
}

fn q3_k(x: &[u8], d_all: f32, y: &mut [f32]) {
    let (hm, mut q) = (&x[0..32], &x[32..96]);
    let (kmask1, kmask2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
    let mut aux: [u32; 4] = std::array::from_fn(|i| {
        if i < 3 {
            u32::from_le_bytes([x[96 + 4 * i], x[97 + 4 * i], x[98 + 4 * i], x[99 + 4 * i]])
        } else {
            0
        }
    });
    let tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
    aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
    aux[0] = (aux[0] & kmask2) | ((tmp & kmask1) << 4);
    aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
    let scales: Vec<i8> = aux
        .iter()
        .flat_map(|a| a.to_le_bytes())
        .map(|b| b as i8)
        .collect();
    let (mut is, mut at, mut m) = (0, 0, 1u8);
    for _n in 0..2 {
        for shift in [0, 2, 4, 6] {
            for half in 0..2 {
                let dl = d_all * f32::from(scales[is] - 32);
                is += 1;
                for l in 16 * half..16 * half + 16 {
                    let low = ((q[l] >> shift) & 3) as i8;
                    let v = low - if hm[l] & m != 0 { 0 } else { 4 };
                    y[at] = dl * f32::from(v);
                    at += 1;
                }
            }
            m <<= 1;
        }
        q = &q[32..];
    }
}

fn get_scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

fn q45_k(x: &[u8], five: bool, y: &mut [f32]) {
    let h = |i: usize| f16::from_le_bytes([x[i], x[i + 1]]).to_f32();
    let (d, min, scales) = (h(0), h(2), &x[4..16]);
    let (qh, mut ql) = if five {
        (&x[16..48], &x[48..176])
    } else {
        (&x[0..0], &x[16..144])
    };
    let (mut is, mut at, mut u1, mut u2) = (0, 0, 1u8, 2u8);
    for _j in 0..4 {
        let (sc, m) = get_scale_min_k4(is, scales);
        let (d1, m1) = (d * f32::from(sc), min * f32::from(m));
        let (sc, m) = get_scale_min_k4(is + 1, scales);
        let (d2, m2) = (d * f32::from(sc), min * f32::from(m));
        let high = |l: usize, u: u8| if five && qh[l] & u != 0 { 16 } else { 0 };
        for l in 0..32 {
            y[at + l] = d1 * f32::from((ql[l] & 0xF) + high(l, u1)) - m1;
            y[at + 32 + l] = d2 * f32::from((ql[l] >> 4) + high(l, u2)) - m2;
        }
        (ql, at, is) = (&ql[32..], at + 64, is + 2);
        (u1, u2) = (u1 << 2, u2 << 2);
    }
}

fn q6_k(x: &[u8], d: f32, y: &mut [f32]) {
    let (mut ql, mut qh, mut sc) = (&x[0..128], &x[128..192], &x[192..208]);
    for n in 0..2 {
        let y = &mut y[128 * n..];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
            let s = |i: usize| f32::from(sc[i] as i8);
            y[l] = d * s(is) * f32::from(q1);
            y[l + 32] = d * s(is + 2) * f32::from(q2);
            y[l + 64] = d * s(is + 4) * f32::from(q3);
            y[l + 96] = d * s(is + 6) * f32::from(q4);
        }
        (ql, qh, sc) = (&ql[64..], &qh[32..], &sc[8..]);
    }
}

/// GGML's `kvalues_mxfp4`: the e2m1 values by code, doubled.
const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `block_mxfp4` (an e8m0 byte `e`, then 16 bytes: weight `j` the low
/// nibble of byte `j`, weight `j + 16` its high nibble), each weight
/// `kvalues_mxfp4[code] * 2^(e - 128)`; the power of two taken in f64
/// (exact for every `e`, and so in f32).
fn mxfp4(x: &[u8], y: &mut [f32]) {
    let d = 2f64.powi(i32::from(x[0]) - 128) as f32;
    for j in 0..16 {
        y[j] = f32::from(KVALUES_MXFP4[usize::from(x[1 + j] & 0xF)]) * d;
        y[j + 16] = f32::from(KVALUES_MXFP4[usize::from(x[1 + j] >> 4)]) * d;
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn repacked_matrix_dequantizes_to_ggml_bit_for_bit() {
    let mut rng = Rng::new(4);
    for ty in QuantType::ALL {
        let n = ty.block_len();
        // Rows not a multiple of 8 pad the last group with zero rows; odd
        // group counts leave a lone last panel.
        for (rows, cols) in [
            (1, n),
            (3, 3 * n),
            (9, n),
            (17, 2 * n),
            (24, n),
            (41, 4 * n),
        ] {
            for scales in [Scales::Plausible, Scales::Extreme] {
                let data = random_blocks(&mut rng, ty, rows, cols, scales);
                let w = QMatrix::new(ty, rows, cols, data.clone()).unwrap();
                let want = ggml_dequantize(ty, &data);
                assert_eq!(
                    bits(&w.dequantize()),
                    bits(&want),
                    "{ty:?} {rows}x{cols} {scales:?}"
                );
                let mut row = vec![0f32; cols];
                w.dequantize_row(rows - 1, &mut row).unwrap();
                assert_eq!(
                    bits(&row),
                    bits(&want[(rows - 1) * cols..]),
                    "{ty:?} last row"
                );
            }
        }
    }
}

#[test]
fn dequantizes_known_blocks() {
    let half = |v: f32| f16::from_f32(v).to_le_bytes();
    let qs: Vec<u8> = (0..16u8).map(|j| j | ((15 - j) << 4)).collect();
    let nib = |j: usize| if j < 16 { j as f32 } else { 31.0 - j as f32 };
    let mut q40 = half(0.5).to_vec();
    q40.extend(&qs);
    let mut q41 = half(0.5).to_vec();
    q41.extend(half(1.0));
    q41.extend(&qs);
    let mut q80 = half(0.25).to_vec();
    q80.extend((0..32).map(|j| (j as i8 - 16) as u8));
    // Q5_0: high bits set on the odd weights.
    let mut q50 = half(0.5).to_vec();
    q50.extend(0xAAAA_AAAAu32.to_le_bytes());
    q50.extend(&qs);
    // Q4_K: sub-block t has scale t + 1 and minimum 2t, quants 3 (low) / 12 (high).
    let mut q4k = [half(0.5), half(0.25)].concat();
    let (sc, mn): (Vec<u8>, Vec<u8>) = (0..8u8).map(|t| (t + 1, 2 * t)).unzip();
    let mut scales = [0u8; 12];
    for j in 0..4 {
        scales[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        scales[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
        scales[j + 8] = (sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4);
    }
    q4k.extend(scales);
    q4k.extend([0xC3u8; 128]);
    type Case = (QuantType, Vec<u8>, Box<dyn Fn(usize) -> f32>);
    let cases: [Case; 5] = [
        (
            QuantType::Q4_0,
            q40,
            Box::new(move |j| 0.5 * (nib(j) - 8.0)),
        ),
        (QuantType::Q4_1, q41, Box::new(move |j| 0.5 * nib(j) + 1.0)),
        (QuantType::Q8_0, q80, Box::new(|j| 0.25 * (j as f32 - 16.0))),
        (
            QuantType::Q5_0,
            q50,
            Box::new(move |j| 0.5 * (nib(j) + if j % 2 == 1 { 16.0 } else { 0.0 } - 16.0)),
        ),
        (
            QuantType::Q4_K,
            q4k,
            Box::new(|j| {
                let t = j / 32;
                let q = if t % 2 == 0 { 3.0 } else { 12.0 };
                0.5 * (t + 1) as f32 * q - 0.25 * (2 * t) as f32
            }),
        ),
    ];
    for (ty, data, want) in cases {
        let w = QMatrix::new(ty, 1, ty.block_len(), data).unwrap();
        let mut row = vec![0f32; ty.block_len()];
        w.dequantize_row(0, &mut row).unwrap();
        for (j, &v) in row.iter().enumerate() {
            assert_eq!(v, want(j), "{ty:?} weight {j}");
        }
    }
}

#[test]
fn mxfp4_dequantizes_every_code_at_every_extreme_scale() {
    // Low nibbles code j, high nibbles code 15 - j: every code in both
    // halves of the block. Scales from f32's subnormal 2^-128 (e = 0) to
    // 2^127 (e = 255, where 12 x 2^127 overflows to infinity as in GGML).
    let qs: Vec<u8> = (0..16u8).map(|j| j | ((15 - j) << 4)).collect();
    let (mut data, scales) = (Vec::new(), [0u8, 1, 2, 64, 127, 128, 129, 200, 254, 255]);
    for e in scales {
        data.push(e);
        data.extend(&qs);
    }
    let w = QMatrix::new(QuantType::MXFP4, scales.len(), 32, data.clone()).unwrap();
    let got = w.dequantize();
    assert_eq!(bits(&got), bits(&ggml_dequantize(QuantType::MXFP4, &data)));
    for (row, &e) in scales.iter().enumerate() {
        let unit = 2f64.powi(i32::from(e) - 128);
        for (k, &v) in got[row * 32..(row + 1) * 32].iter().enumerate() {
            let code = if k < 16 { k } else { 31 - k };
            // e2m1: sign bit 3, then 0, 0.5, 1, 1.5, 2, 3, 4, 6.
            let mag = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0][code % 8];
            // Code 8 (-0) is GGML's +0.
            let sign = if code > 8 { -1.0 } else { 1.0 };
            let want = (sign * mag * 2.0 * unit) as f32;
            assert_eq!(
                v.to_bits(),
                want.to_bits(),
                "e {e} code {code}: {v} vs {want}"
            );
        }
    }
    // The extreme scales as f32 bits: subnormal, then normal, then the top.
    assert_eq!(got[1].to_bits(), 0x0020_0000, "0.5 x 2^-127 is 2^-128");
    assert_eq!(got[32 + 1].to_bits(), 0x0040_0000);
    assert_eq!(got[9 * 32 + 1], 2f32.powi(127));
    assert_eq!(got[9 * 32 + 2], f32::INFINITY);
}

#[test]
fn holds_exactly_the_planned_bytes_near_ggml_size() {
    let mut rng = Rng::new(6);
    for ty in QuantType::ALL {
        let n = ty.block_len();
        for (rows, cols) in [(1, n), (5, 2 * n), (16, n), (24, 3 * n), (40, 8 * n)] {
            let data = random_blocks(&mut rng, ty, rows, cols, Scales::Plausible);
            let ggml = data.len() / rows * rows.next_multiple_of(8);
            let w = QMatrix::new(ty, rows, cols, data).unwrap();
            let planned = ty.held_bytes(rows, cols).unwrap();
            assert_eq!(w.held_bytes(), planned, "{ty:?} {rows}x{cols}");
            // GGML's size (rows in whole groups of 8), but for the 6-bit
            // sub-block scales of Q3_K/Q4_K/Q5_K held as bytes.
            let (held, stored) = match ty {
                QuantType::Q3_K => (114, 110),
                QuantType::Q4_K => (148, 144),
                QuantType::Q5_K => (180, 176),
                _ => (1, 1),
            };
            assert_eq!(planned * stored, ggml * held, "{ty:?} {rows}x{cols}");
        }
    }
    assert_eq!(
        QuantType::Q4_1.held_bytes(3, 30),
        Err(Error::BadCols {
            cols: 30,
            multiple: 32
        })
    );
    assert_eq!(
        QuantType::Q8_0.held_bytes(usize::MAX, 64),
        Err(Error::Overflow("weight bytes"))
    );
}

#[test]
fn bad_data_is_an_error_naming_the_lengths() {
    for ty in QuantType::ALL {
        let (n, bb) = (ty.block_len(), ty.block_bytes());
        let cases: [(usize, usize, usize, Error); 5] = [
            // Truncated, one byte long, a row's block missing, empty.
            (2, n, 2 * bb - 1, length(2 * bb, 2 * bb - 1)),
            (2, n, 2 * bb + 1, length(2 * bb, 2 * bb + 1)),
            (3, 2 * n, 5 * bb, length(6 * bb, 5 * bb)),
            (1, n, 0, length(bb, 0)),
            // Columns not whole blocks.
            (
                1,
                n + 16,
                bb,
                Error::BadCols {
                    cols: n + 16,
                    multiple: n,
                },
            ),
        ];
        for (rows, cols, len, want) in cases {
            let got = QMatrix::new(ty, rows, cols, vec![0; len]).map(|_| ());
            assert_eq!(got, Err(want), "{ty:?} {rows}x{cols} with {len} bytes");
        }
        let err = QMatrix::new(ty, 1, n, vec![0; bb - 3]).unwrap_err();
        let text = format!("expected length {bb}, got {}", bb - 3);
        assert!(err.to_string().contains(&text), "{ty:?}: {err}");
        // 128 columns: whole blocks of 32, not of 256.
        let got = QMatrix::new(ty, 1, 128, vec![0; 128 / n * bb]).map(|_| ());
        let want = if n == 32 {
            Ok(())
        } else {
            Err(Error::BadCols {
                cols: 128,
                multiple: 256,
            })
        };
        assert_eq!(got, want, "{ty:?}");
        let w = QMatrix::new(ty, 2, n, vec![0; 2 * bb]).unwrap();
        assert_eq!(
            w.dequantize_row(2, &mut vec![0.0; n]),
            Err(Error::RowOutOfRange { row: 2, rows: 2 })
        );
        assert!(matches!(
            w.dequantize_row(0, &mut vec![0.0; n - 1]),
            Err(Error::Length {
                what: "row output",
                ..
            })
        ));
    }
}

fn length(expected: usize, got: usize) -> Error {
    Error::Length {
        what: "weight data",
        expected,
        got,
    }
}
