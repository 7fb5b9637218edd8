//! Builders of raw GGML blocks for the tests: random quants and sub-scale
//! bytes, with f16 (MXFP4: e8m0) scales plausible or extreme.

use half::f16;

use crate::quant_type::QuantType;
use crate::test_util::Rng;

/// How a block's f16 scales (and minima) are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scales {
    /// Small positive scales (negative minima for Q4_1/Q5_1), as files hold.
    Plausible,
    /// Drawn from [`EXTREMES`]; a quarter of the blocks also have every
    /// quant and sub-scale bit set (the largest quants and scales).
    Extreme,
}

/// The f16 edge values: largest and smallest normal, subnormals, zeros,
/// negatives.
pub(crate) const EXTREMES: [f32; 10] = [
    65504.0,
    -65504.0,
    6.103_515_6e-5,
    -6.103_515_6e-5,
    5.960_464_5e-8,
    6.097_555e-5,
    0.0,
    -0.0,
    -1.5,
    0.75,
];

/// MXFP4's extreme e8m0 scales: `2^(e - 128)` from f32's subnormals
/// (0, 1) through 1 (128) to its largest power of two (255).
pub(crate) const E8M0_EXTREMES: [u8; 8] = [0, 1, 2, 127, 128, 200, 254, 255];

/// Byte offsets of a GGML block's f16 scale and minimum (`dmin`), if any
/// (MXFP4: of its e8m0 byte, written apart).
pub(crate) fn f16_fields(ty: QuantType) -> (usize, Option<usize>) {
    match ty {
        QuantType::MXFP4 => (0, None),
        QuantType::Q4_0 | QuantType::Q5_0 | QuantType::Q8_0 => (0, None),
        QuantType::Q4_1 | QuantType::Q5_1 | QuantType::Q4_K | QuantType::Q5_K => (0, Some(2)),
        QuantType::Q2_K => (80, Some(82)),
        QuantType::Q3_K => (108, None),
        QuantType::Q6_K => (208, None),
    }
}

/// `rows x cols` weights of `ty` as raw GGML blocks, row-major.
pub(crate) fn random_blocks(
    rng: &mut Rng,
    ty: QuantType,
    rows: usize,
    cols: usize,
    scales: Scales,
) -> Vec<u8> {
    let bb = ty.block_bytes();
    let (d_at, m_at) = f16_fields(ty);
    let mut data = Vec::with_capacity(rows * cols / ty.block_len() * bb);
    for _ in 0..rows * cols / ty.block_len() {
        let mut blk = rng.bytes(bb);
        let (d, m) = match scales {
            Scales::Plausible => {
                let d = 0.002 + 0.02 * rng.f32().abs();
                // Q4_1/Q5_1 store a minimum to add, K-quants a `dmin` to subtract.
                let m = if ty.block_len() == 32 { -0.1 } else { 0.01 } * rng.f32().abs();
                (d, m)
            }
            Scales::Extreme => {
                if rng.next_u64().is_multiple_of(4) {
                    blk.fill(0xFF);
                }
                let mut pick = || EXTREMES[(rng.next_u64() % EXTREMES.len() as u64) as usize];
                (pick(), pick())
            }
        };
        if ty == QuantType::MXFP4 {
            blk[0] = match scales {
                // 2^-10..2^-3 (a weight's largest value 6x that).
                Scales::Plausible => 118 + (rng.next_u64() % 8) as u8,
                Scales::Extreme => {
                    E8M0_EXTREMES[(rng.next_u64() % E8M0_EXTREMES.len() as u64) as usize]
                }
            };
            data.extend(blk);
            continue;
        }
        blk[d_at..d_at + 2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        if let Some(at) = m_at {
            blk[at..at + 2].copy_from_slice(&f16::from_f32(m).to_le_bytes());
        }
        data.extend(blk);
    }
    data
}
