//! The GGML block formats the kernels run, how each is held once repacked,
//! and the bytes a repacked matrix holds.

use crate::Error;

/// Weights per quantization block (the unit of the activation's scales and
/// of every kernel's integer dots).
pub const QK: usize = 32;

/// Weights per K-quant super-block.
pub const QK_K: usize = 256;

/// Weight rows interleaved per group: one 256-bit register holds 4 bytes
/// of each of a group's rows, so its lanes are the group's rows.
pub(crate) const GROUP: usize = 8;

/// GGML block formats supported by [`crate::QMatrix`].
// GGML's names (`Q4_K`), which every GGUF tool prints.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum QuantType {
    /// f16 scale, 32 x 4-bit weights offset by 8.
    Q4_0,
    /// f16 scale, f16 minimum, 32 x 4-bit weights.
    Q4_1,
    /// f16 scale, 32 x 5-bit weights offset by 16.
    Q5_0,
    /// f16 scale, f16 minimum, 32 x 5-bit weights.
    Q5_1,
    /// f16 scale, 32 x i8 weights.
    Q8_0,
    /// 256 x 2-bit weights in 16-blocks with 4-bit scales and minima, f16 `d`/`dmin`.
    Q2_K,
    /// 256 x 3-bit weights (offset by 4) in 16-blocks with signed 6-bit scales, f16 `d`.
    Q3_K,
    /// 256 x 4-bit weights in 32-blocks with 6-bit scales and minima, f16 `d`/`dmin`.
    Q4_K,
    /// 256 x 5-bit weights in 32-blocks with 6-bit scales and minima, f16 `d`/`dmin`.
    Q5_K,
    /// 256 x 6-bit weights (offset by 32) in 16-blocks with i8 scales, f16 `d`.
    Q6_K,
    /// OCP microscaling FP4 (gpt-oss's experts): an e8m0 scale byte `e`,
    /// 32 x 4-bit e2m1 codes; weight = [`E2M1`]`[code] * 2^(e - 128)`.
    MXFP4,
}

/// MXFP4's e2m1 values by code, doubled to integers (GGML's `kvalues_mxfp4`):
/// sign bit 3, then 0, 0.5, 1, 1.5, 2, 3, 4, 6 times two.
pub(crate) const E2M1: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// What [`E2M1`]'s values are biased by where the SIMD paths read them as
/// unsigned bytes (u8 x i8 dot instructions): 0..=24, offset back in integers.
pub(crate) const E2M1_BIAS: i32 = 12;

/// An e8m0 scale byte as the f32 `2^(e - 128)` (GGML's
/// `GGML_E8M0_TO_FP32_HALF`: exact for every byte, 0 and 1 subnormal).
pub(crate) const fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

/// How a 32-block's sub-block scales are held (two bytes a row a block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sub {
    /// None: one f16 scale per block (the legacy formats).
    None,
    /// One 6-bit scale and one 6-bit minimum per 32-block (Q4_K, Q5_K),
    /// held as two byte fields: the scales of a panel's rows side by side,
    /// then their minima.
    Per32,
    /// A signed scale per 16-block (Q6_K, Q3_K), held as an i8 pair a row.
    Per16,
    /// GGML's `scale | min << 4` byte per 16-block (Q2_K), as a pair a row.
    Per16Min,
}

/// Which minimum a format subtracts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Min {
    /// None.
    None,
    /// An f16 minimum per 32-block, times the activation's sum (Q4_1, Q5_1).
    Block,
    /// An f16 `dmin` per super-block times the sub-block minima (K-quants).
    Super,
}

/// How a format is held and computed: quants as bit planes, scales as
/// per-block bytes and per-unit (block or super-block) f16s (MXFP4: e8m0
/// bytes).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Format {
    /// Bits of the low plane (8, 4 or 2): plane registers per 32-block.
    pub lo: u32,
    /// Bits of the high plane (0, 1 or 2), ORed in above the low bits.
    pub hi: u32,
    /// The integer every stored quant is offset by (Q4_0's -8, Q6_K's -32).
    pub offset: i32,
    /// The sub-block scales.
    pub sub: Sub,
    /// The minimum.
    pub min: Min,
    /// 32-blocks per unit of the f16 scales: 1, or 8 for a K-quant super-block.
    pub bpu: usize,
    /// MXFP4: stored quants are e2m1 codes whose values are [`E2M1`]'s, and
    /// the scale is an e8m0 byte, not an f16.
    pub mx: bool,
}

impl Format {
    /// Plane registers (32 bytes for a group of 8 rows) per 32-block.
    pub const fn regs(self) -> usize {
        (self.lo + self.hi) as usize
    }

    /// Whether the integer dots are taken per 16-weight half.
    pub const fn halves(self) -> bool {
        matches!(self.sub, Sub::Per16 | Sub::Per16Min)
    }

    /// Largest unsigned quant a SIMD dot multiplies (MXFP4: its biased value).
    pub const fn umax(self) -> u32 {
        if self.mx {
            2 * E2M1_BIAS as u32
        } else {
            (1 << (self.lo + self.hi)) - 1
        }
    }

    /// Bytes of a unit's scale as held: an f16, or MXFP4's e8m0 byte.
    pub const fn scale_bytes(self) -> usize {
        if self.mx { 1 } else { 2 }
    }

    /// Where weight `k` of a 32-block sits: `[(register, shift)]` of its low
    /// bits, then of its high bits (register `lo..` when `hi > 0`). Register
    /// `u` of the unpacked block holds weights `4u..4u+4` (byte `k % 4` of a
    /// row's 4): a `b`-bit plane has `b` registers, weight `4u+i` in
    /// register `u % b` at bit `b * (u / b)`, so every unpacked register is
    /// one shift and one mask of a plane register.
    pub const fn bits(self, k: usize) -> [(usize, u32); 2] {
        let u = (k / 4) as u32;
        let lo = ((u % self.lo) as usize, self.lo * (u / self.lo));
        if self.hi == 0 {
            return [lo, (0, 0)];
        }
        let hi = ((self.lo + u % self.hi) as usize, self.hi * (u / self.hi));
        [lo, hi]
    }
}

impl QuantType {
    /// Every supported format.
    pub const ALL: [Self; 11] = [
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q2_K,
        Self::Q3_K,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
        Self::MXFP4,
    ];

    /// The format for a const-generic code (`ty as u8`).
    pub(crate) const fn from_code(code: u8) -> Self {
        Self::ALL[code as usize]
    }

    /// Weights per GGML block: 32, or 256 for K-quants.
    pub const fn block_len(self) -> usize {
        self.format().bpu * QK
    }

    /// Bytes of one GGML block ([`Self::block_len`] weights).
    pub const fn block_bytes(self) -> usize {
        match self {
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
            Self::Q2_K => 84,
            Self::Q3_K => 110,
            Self::Q4_K => 144,
            Self::Q5_K => 176,
            Self::Q6_K => 210,
            Self::MXFP4 => 17,
        }
    }

    /// How the format is held and computed.
    pub(crate) const fn format(self) -> Format {
        let (lo, hi, offset, sub, min, bpu) = match self {
            Self::Q4_0 => (4, 0, -8, Sub::None, Min::None, 1),
            Self::Q4_1 => (4, 0, 0, Sub::None, Min::Block, 1),
            Self::Q5_0 => (4, 1, -16, Sub::None, Min::None, 1),
            Self::Q5_1 => (4, 1, 0, Sub::None, Min::Block, 1),
            Self::Q8_0 => (8, 0, 0, Sub::None, Min::None, 1),
            Self::Q2_K => (2, 0, 0, Sub::Per16Min, Min::Super, 8),
            Self::Q3_K => (2, 1, -4, Sub::Per16, Min::None, 8),
            Self::Q4_K => (4, 0, 0, Sub::Per32, Min::Super, 8),
            Self::Q5_K => (4, 1, 0, Sub::Per32, Min::Super, 8),
            Self::Q6_K => (4, 2, -32, Sub::Per16, Min::None, 8),
            // The scalar dot takes the signed values, offset 0.
            Self::MXFP4 => (4, 0, 0, Sub::None, Min::None, 1),
        };
        Format {
            lo,
            hi,
            offset,
            sub,
            min,
            bpu,
            mx: matches!(self, Self::MXFP4),
        }
    }

    /// Checks that rows of `cols` weights are whole GGML blocks.
    pub(crate) fn check_cols(self, cols: usize) -> Result<(), Error> {
        let multiple = self.block_len();
        if cols == 0 || !cols.is_multiple_of(multiple) {
            return Err(Error::BadCols { cols, multiple });
        }
        Ok(())
    }

    /// Exactly the bytes [`crate::QMatrix::new`] allocates for a `rows x cols`
    /// matrix of this format (the memory planner counts weights with it),
    /// rows rounded up to a whole group of 8: GGML's size for every format
    /// but Q3_K/Q4_K/Q5_K, whose 6-bit sub-block scales are held as bytes
    /// (2-4% over). MXFP4 holds its 17 bytes a block: 4.25 bits a weight.
    pub fn held_bytes(self, rows: usize, cols: usize) -> Result<usize, Error> {
        self.check_cols(cols)?;
        let f = self.format();
        let nb = cols / QK;
        let sub = if f.sub == Sub::None { 0 } else { 2 };
        let unit = if f.min == Min::None { 1 } else { 2 } * f.scale_bytes();
        nb.checked_mul(4 * f.regs() + sub)
            .and_then(|q| q.checked_add(nb / f.bpu * unit))
            .zip(rows.checked_next_multiple_of(GROUP))
            .and_then(|(per_row, r)| r.checked_mul(per_row))
            .ok_or(Error::Overflow("weight bytes"))
    }
}
