//! GGML's block layouts (ggml-common.h) read into what a repacked matrix
//! holds: per 32-block its stored quants and two sub-scale bytes, per GGML
//! block the f16 bits of its scale and minimum (MXFP4: its e8m0 byte).

use crate::quant_type::{QK, QuantType};

/// One GGML block, decoded. Quants are unsigned as stored (Q8_0 keeps its
/// i8 bit pattern); sub-scales are as [`crate::quant_type::Sub`] holds them.
#[derive(Debug, Clone)]
pub(crate) struct Decoded {
    /// f16 bits of the scale (`d`; MXFP4: the e8m0 byte).
    pub d: u16,
    /// f16 bits of the minimum (Q4_1/Q5_1's `m`, the K-quants' `dmin`), else 0.
    pub m: u16,
    /// Sub-scale bytes of each 32-block.
    pub sub: [[u8; 2]; 8],
    /// Stored quants of each 32-block.
    pub q: [[u8; QK]; 8],
}

impl Default for Decoded {
    fn default() -> Self {
        Self {
            d: 0,
            m: 0,
            sub: [[0; 2]; 8],
            q: [[0; QK]; 8],
        }
    }
}

/// Little-endian u16 at `i`.
fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

/// Q4_K/Q5_K's 6-bit scale and minimum of 32-block `j` (GGML's `get_scale_min_k4`).
fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Q3_K's signed scale of 16-block `j`: 4 low bits from bytes 0..8, 2 high
/// bits from bytes 8..12, minus 32.
fn scale_q3k(j: usize, s: &[u8]) -> i8 {
    let low = (s[j % 8] >> (4 * (j / 8))) & 0xF;
    let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    (low | (high << 4)) as i8 - 32
}

/// Decodes one GGML block of `ty` (exactly `ty.block_bytes()` bytes) into `out`.
pub(crate) fn decode(ty: QuantType, blk: &[u8], out: &mut Decoded) {
    debug_assert_eq!(blk.len(), ty.block_bytes());
    match ty {
        QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q5_0 | QuantType::Q5_1 | QuantType::Q8_0 => {
            decode_legacy(ty, blk, out)
        }
        QuantType::Q2_K | QuantType::Q3_K => decode_q23k(ty == QuantType::Q3_K, blk, out),
        QuantType::Q4_K | QuantType::Q5_K => decode_q45k(ty == QuantType::Q5_K, blk, out),
        QuantType::Q6_K => decode_q6k(blk, out),
        // `block_mxfp4`: the e8m0 byte, then the codes as Q4_0's nibbles.
        QuantType::MXFP4 => {
            out.d = u16::from(blk[0]);
            for (j, q) in out.q[0].iter_mut().enumerate() {
                *q = nib(&blk[1..], j);
            }
        }
    }
}

/// Nibble `j` of a 32-block: byte `j % 16`, low for `j < 16`.
fn nib(qs: &[u8], j: usize) -> u8 {
    (qs[j % 16] >> (4 * (j / 16))) & 0xF
}

/// The 32-weight formats: f16 `d` (and `m`), Q5's 32 high bits, quants.
fn decode_legacy(ty: QuantType, blk: &[u8], out: &mut Decoded) {
    let with_m = matches!(ty, QuantType::Q4_1 | QuantType::Q5_1);
    out.d = u16_at(blk, 0);
    out.m = if with_m { u16_at(blk, 2) } else { 0 };
    let at = if with_m { 4 } else { 2 };
    match ty {
        QuantType::Q8_0 => out.q[0].copy_from_slice(&blk[2..34]),
        QuantType::Q5_0 | QuantType::Q5_1 => {
            let qh = u32::from_le_bytes([blk[at], blk[at + 1], blk[at + 2], blk[at + 3]]);
            for (j, q) in out.q[0].iter_mut().enumerate() {
                *q = nib(&blk[at + 4..], j) | ((((qh >> j) & 1) as u8) << 4);
            }
        }
        _ => {
            for (j, q) in out.q[0].iter_mut().enumerate() {
                *q = nib(&blk[at..], j);
            }
        }
    }
}

/// Q2_K (`scales[16]`, `qs[64]`, `d`, `dmin`) and Q3_K (`hmask[32]`,
/// `qs[64]`, `scales[12]`, `d`): 32-block `t` is bits `2 (t % 4)` of
/// `qs[32 (t / 4)..][..32]`, Q3_K's third bit bit `t` of `hmask`.
fn decode_q23k(q3: bool, blk: &[u8], out: &mut Decoded) {
    let (qs, scales) = if q3 {
        (&blk[32..96], &blk[96..108])
    } else {
        (&blk[16..80], &blk[0..16])
    };
    (out.d, out.m) = if q3 {
        (u16_at(blk, 108), 0)
    } else {
        (u16_at(blk, 80), u16_at(blk, 82))
    };
    for t in 0..8 {
        out.sub[t] = if q3 {
            [
                scale_q3k(2 * t, scales) as u8,
                scale_q3k(2 * t + 1, scales) as u8,
            ]
        } else {
            [scales[2 * t], scales[2 * t + 1]]
        };
        for (l, q) in out.q[t].iter_mut().enumerate() {
            let low = (qs[32 * (t / 4) + l] >> (2 * (t % 4))) & 3;
            *q = if q3 {
                low | (((blk[l] >> t) & 1) << 2)
            } else {
                low
            };
        }
    }
}

/// Q4_K / Q5_K (`d`, `dmin`, `scales[12]`, Q5_K's `qh[32]`, `qs[128]`):
/// 32-block `t` is the low (even `t`) or high nibbles of `qs[32 (t / 2)..]`,
/// Q5_K's fifth bit bit `t` of `qh`.
fn decode_q45k(q5: bool, blk: &[u8], out: &mut Decoded) {
    let scales = &blk[4..16];
    let (qh, qs) = if q5 {
        (&blk[16..48], &blk[48..176])
    } else {
        (&blk[0..0], &blk[16..144])
    };
    (out.d, out.m) = (u16_at(blk, 0), u16_at(blk, 2));
    for t in 0..8 {
        let (sc, mn) = scale_min_k4(t, scales);
        out.sub[t] = [sc, mn];
        for (l, q) in out.q[t].iter_mut().enumerate() {
            let low = (qs[32 * (t / 2) + l] >> (4 * (t % 2))) & 0xF;
            *q = if q5 {
                low | (((qh[l] >> t) & 1) << 4)
            } else {
                low
            };
        }
    }
}

/// Q6_K (`ql[128]`, `qh[64]`, `scales[16]`, `d`): 32-block `t = 4n + k`
/// is nibbles `k / 2` of `ql[64n + 32 (k % 2)..]` with bits `2k` of `qh[32n..]`.
fn decode_q6k(blk: &[u8], out: &mut Decoded) {
    let (ql, qh, scales) = (&blk[0..128], &blk[128..192], &blk[192..208]);
    (out.d, out.m) = (u16_at(blk, 208), 0);
    for t in 0..8 {
        let (n, k) = (t / 4, t % 4);
        out.sub[t] = [scales[2 * t], scales[2 * t + 1]];
        for (l, q) in out.q[t].iter_mut().enumerate() {
            let low = (ql[64 * n + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0xF;
            *q = low | (((qh[32 * n + l] >> (2 * k)) & 3) << 4);
        }
    }
}
