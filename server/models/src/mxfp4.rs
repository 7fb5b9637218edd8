//! MXFP4, gpt-oss's expert weights: blocks of 32 e2m1 values (4 bits:
//! sign, 2-bit exponent, 1-bit mantissa; two a byte, the low nibble first)
//! sharing one E8M0 scale (`2^(s - 127)`). Every such value is an integer
//! in -12..=12 times `2^(s - 128)`. On CPU ferrox-kernels run the blocks
//! as stored (`QuantType::MXFP4`, GGML's `block_mxfp4`: 17 bytes a block);
//! candle, which has no MXFP4 kernels (CUDA), gets each block transcoded
//! without loss into a GGML Q5_0 block (5-bit quants offset by 16, an f16
//! scale: 22 bytes).

use half::f16;

/// The e2m1 values, doubled to integers (`0.5` is 1), by code.
pub const DOUBLED: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Values a block holds.
pub const BLOCK: usize = 32;
/// Bytes of a block's values (its scale is stored apart).
pub const BLOCK_BYTES: usize = 16;
/// Bytes of the GGML Q5_0 block one transcodes to.
pub const Q5_0_BYTES: usize = 22;

/// Value `i` of a block, doubled (the low nibble of a byte first).
fn doubled(bytes: &[u8; BLOCK_BYTES], i: usize) -> i8 {
    let b = bytes[i / 2];
    DOUBLED[usize::from(if i.is_multiple_of(2) {
        b & 0x0f
    } else {
        b >> 4
    })]
}

/// The scalar reference: value `i` of the block `bytes` with scale `scale`.
pub fn value(bytes: &[u8; BLOCK_BYTES], scale: u8, i: usize) -> f32 {
    f32::from(doubled(bytes, i)) * 2f32.powi(i32::from(scale) - 128)
}

/// Why a block cannot be held exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaleOutOfRange(pub u8);

/// The Q5_0 block holding exactly the MXFP4 block `bytes` with `scale`; a
/// scale f16 cannot carry (past `2^15` or under `2^-24`) is refused unless
/// every value of the block is zero.
pub fn to_q5_0(bytes: &[u8; BLOCK_BYTES], scale: u8) -> Result<[u8; Q5_0_BYTES], ScaleOutOfRange> {
    let q: [i8; BLOCK] = std::array::from_fn(|i| doubled(bytes, i));
    let exp = i32::from(scale) - 128;
    let d = match exp {
        _ if q.iter().all(|&v| v == 0) => f16::ZERO,
        -24..=15 => f16::from_f32(2f32.powi(exp)),
        _ => return Err(ScaleOutOfRange(scale)),
    };
    let mut out = [0u8; Q5_0_BYTES];
    out[..2].copy_from_slice(&d.to_le_bytes());
    let mut qh = 0u32;
    for j in 0..16 {
        // Stored quants are the values offset by 16: 4..=28.
        let (a, b) = ((q[j] + 16) as u8, (q[j + 16] + 16) as u8);
        out[6 + j] = (a & 0x0f) | ((b & 0x0f) << 4);
        qh |= u32::from(a >> 4) << j | u32::from(b >> 4) << (j + 16);
    }
    out[2..6].copy_from_slice(&qh.to_le_bytes());
    Ok(out)
}

/// Bytes of a block as GGML stores it: the E8M0 scale, then 16 bytes whose
/// low nibbles are values 0..16 and high nibbles values 16..32.
pub const GGML_BLOCK_BYTES: usize = 17;

/// GGML's MXFP4 blocks (llama.cpp's gpt-oss files) as Q5_0 blocks.
pub fn ggml_to_q5_0(blocks: &[u8]) -> Result<Vec<u8>, ScaleOutOfRange> {
    let mut out = Vec::with_capacity(blocks.len() / GGML_BLOCK_BYTES * Q5_0_BYTES);
    for b in blocks.chunks_exact(GGML_BLOCK_BYTES) {
        // Into the checkpoint's order: value `i` in byte `i / 2`.
        let code = |i: usize| match i < 16 {
            true => b[1 + i] & 0x0f,
            false => b[1 + i - 16] >> 4,
        };
        let bytes = std::array::from_fn(|j| code(2 * j) | (code(2 * j + 1) << 4));
        out.extend_from_slice(&to_q5_0(&bytes, b[0])?);
    }
    Ok(out)
}

/// GGML's MXFP4 blocks (`block_mxfp4`: the scale, then value `j` in the
/// low nibble of byte `j`, value `j + 16` in its high nibble) of matrix rows
/// `rows` of a checkpoint's MXFP4 tensor whose rows are `blocks_per_row`
/// blocks: `blocks` (16 bytes a block, value `i` in byte `i / 2`, the low
/// nibble first) and `scales` (one a block) of the whole tensor.
pub fn rows_to_ggml(
    blocks: &[u8],
    scales: &[u8],
    blocks_per_row: usize,
    rows: impl Iterator<Item = usize>,
) -> Vec<u8> {
    let mut out = Vec::new();
    for r in rows {
        for b in r * blocks_per_row..(r + 1) * blocks_per_row {
            let bytes = &blocks[b * BLOCK_BYTES..(b + 1) * BLOCK_BYTES];
            let code = |i: usize| (bytes[i / 2] >> (4 * (i % 2))) & 0x0f;
            out.push(scales[b]);
            out.extend((0..16).map(|j| code(j) | (code(j + 16) << 4)));
        }
    }
    out
}

/// Matrix rows `rows` of an MXFP4 tensor as f32 (by [`value`]).
pub fn rows_to_f32(
    blocks: &[u8],
    scales: &[u8],
    blocks_per_row: usize,
    rows: impl Iterator<Item = usize>,
) -> Vec<f32> {
    let mut out = Vec::new();
    for r in rows {
        for b in r * blocks_per_row..(r + 1) * blocks_per_row {
            let mut bytes = [0u8; BLOCK_BYTES];
            bytes.copy_from_slice(&blocks[b * BLOCK_BYTES..(b + 1) * BLOCK_BYTES]);
            out.extend((0..BLOCK).map(|i| value(&bytes, scales[b], i)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::{GgmlDType, QStorage, QTensor};
    use candle_core::{Device, Shape};

    use super::*;

    /// Blocks where every code appears in both nibbles, under scales
    /// from f16's smallest to its largest power of two.
    fn cases() -> Vec<([u8; BLOCK_BYTES], u8)> {
        let mut out = Vec::new();
        for scale in [104u8, 110, 120, 127, 128, 133, 143] {
            for shift in 0..16u8 {
                let bytes = std::array::from_fn(|i| {
                    let lo = (i as u8 + shift) % 16;
                    lo | (((lo * 7 + 3) % 16) << 4)
                });
                out.push((bytes, scale));
            }
        }
        out
    }

    #[test]
    fn a_transcoded_block_holds_every_value_exactly() {
        for (bytes, scale) in cases() {
            let q5 = to_q5_0(&bytes, scale).unwrap();
            // GGML's own Q5_0 dequantisation (candle's) reads it back.
            let storage = QStorage::from_data(
                std::borrow::Cow::Borrowed(&q5[..]),
                &Device::Cpu,
                GgmlDType::Q5_0,
            )
            .unwrap();
            let t = QTensor::new(storage, Shape::from(BLOCK)).unwrap();
            let got: Vec<f32> = t.dequantize(&Device::Cpu).unwrap().to_vec1().unwrap();
            let want: Vec<f32> = (0..BLOCK).map(|i| value(&bytes, scale, i)).collect();
            assert_eq!(got, want, "scale {scale}");
        }
    }

    #[test]
    fn the_scalar_reference_is_the_format_s() {
        // 0x_1_a: low nibble 0xa (-1.0), high 0x1 (+0.5); scale 2^(129-127).
        let mut bytes = [0u8; BLOCK_BYTES];
        bytes[0] = 0x1a;
        assert_eq!(value(&bytes, 129, 0), -4.0);
        assert_eq!(value(&bytes, 129, 1), 2.0);
        assert_eq!(value(&bytes, 129, 2), 0.0);
        // -0 (code 8) is 0; 6.0 is code 7.
        bytes[1] = 0x78;
        assert_eq!((value(&bytes, 127, 2), value(&bytes, 127, 3)), (0.0, 6.0));
    }

    #[test]
    fn scales_past_f16_are_refused_unless_the_block_is_zero() {
        let bytes = [0x11u8; BLOCK_BYTES];
        assert_eq!(to_q5_0(&bytes, 200), Err(ScaleOutOfRange(200)));
        assert_eq!(to_q5_0(&bytes, 90), Err(ScaleOutOfRange(90)));
        let zero = [0x88u8; BLOCK_BYTES];
        let q5 = to_q5_0(&zero, 0).unwrap();
        assert_eq!(&q5[..2], &[0, 0]);
    }

    #[test]
    fn rows_read_alike_packed_and_as_floats() {
        // Scales past f16 too: the packed format holds every e8m0 byte.
        let (blocks, mut scales): (Vec<[u8; 16]>, Vec<u8>) = cases().into_iter().take(12).unzip();
        (scales[9], scales[11]) = (10, 150);
        let flat: Vec<u8> = blocks.concat();
        // 4 rows of 3 blocks: rows 1 and 3.
        let ggml = rows_to_ggml(&flat, &scales, 3, [1, 3].into_iter());
        let f = rows_to_f32(&flat, &scales, 3, [1, 3].into_iter());
        let m = ferrox_kernels::QMatrix::new(ferrox_kernels::QuantType::MXFP4, 2, 96, ggml.clone())
            .unwrap();
        assert_eq!(m.dequantize(), f);
        // The GGML blocks transcode to Q5_0 alike where f16 holds the scale.
        let q5 = ggml_to_q5_0(&ggml[..3 * GGML_BLOCK_BYTES]).unwrap();
        let q = ferrox_kernels::QMatrix::new(ferrox_kernels::QuantType::Q5_0, 1, 96, q5).unwrap();
        assert_eq!(q.dequantize(), f[..96]);
        assert_eq!(ggml_to_q5_0(&ggml), Err(ScaleOutOfRange(10)));
        // Every kernel this CPU has computes the scalar reference's bits.
        let x: Vec<f32> = (0..3 * 96).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut acts = ferrox_kernels::QActs::new();
        acts.quantize(&x, 3).unwrap();
        let run = |k: ferrox_kernels::Kernel| {
            let mut out = vec![0f32; 3 * 2];
            m.matmul_acts_with(k, &acts, &mut [&mut out], false)
                .unwrap();
            out
        };
        let scalar = run(ferrox_kernels::Kernel::Scalar);
        for k in ferrox_kernels::Kernel::available() {
            assert_eq!(run(k), scalar, "{k:?}");
        }
        // And the values' own f32 dot within the activations' 8 bits: each
        // off by at most a step (its block's largest / 127), and the
        // f16-rounded activation scales (2^-11 relative).
        for (n, row) in x.chunks_exact(96).enumerate() {
            for r in 0..2 {
                let w = &f[r * 96..(r + 1) * 96];
                let want: f32 = row.iter().zip(w).map(|(a, b)| a * b).sum();
                let step: f32 = row
                    .chunks(32)
                    .zip(w.chunks(32))
                    .map(|(xb, wb)| {
                        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                        wb.iter().map(|v| v.abs()).sum::<f32>() * amax / 127.0
                    })
                    .sum();
                let mag: f32 = row.iter().zip(w).map(|(a, b)| (a * b).abs()).sum();
                let got = scalar[n * 2 + r];
                assert!((got - want).abs() <= step + 1e-3 * mag, "{got} vs {want}");
            }
        }
    }
}
