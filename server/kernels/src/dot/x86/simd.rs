//! The vector operations the tiles are written in, one implementation per
//! register width and dot instruction (see `ymm.rs`, `zmm.rs`).
//!
//! Every method is `#[inline(always)]` and calls intrinsics: they compile
//! into the `#[target_feature]` entry point they are inlined into, so each
//! is only called under the features its implementation names.

/// A vector width and dot instruction. `I` holds integer lanes (one i32 a
/// weight row), `F` f32 lanes (one a weight row).
pub(super) trait Simd {
    /// Integer vector.
    type I: Copy;
    /// f32 vector.
    type F: Copy;
    /// Weight rows a vector covers: 8, or 16 (a panel).
    const LANES: usize;
    /// Whether Q8_0's signed quants run as `q ^ 0x80` with offset -128
    /// (u8 x i8 dot instructions); otherwise via `maddubs(|q|, sign(x, q))`.
    const XOR_SIGNED: bool;
    /// Whether [`Self::dot4`] is one instruction (`vpdpbusd`), so a tile
    /// may interleave its activation rows register by register.
    const DOT4: bool;

    /// One plane register: 4 bytes of each of `LANES` rows.
    unsafe fn load(p: *const u8) -> Self::I;
    /// Every byte `v`.
    unsafe fn splat8(v: u8) -> Self::I;
    /// Every i32 lane `v`.
    unsafe fn splat32(v: i32) -> Self::I;
    /// The 4 bytes at `p` in every i32 lane.
    unsafe fn bcast32(p: *const u8) -> Self::I;
    /// `a & b`.
    unsafe fn and(a: Self::I, b: Self::I) -> Self::I;
    /// `a ^ b`.
    unsafe fn xor(a: Self::I, b: Self::I) -> Self::I;
    /// `a | (b & m)`.
    unsafe fn or_and(a: Self::I, b: Self::I, m: Self::I) -> Self::I;
    /// Each u16 lane shifted right by `n`.
    unsafe fn srl16(a: Self::I, n: u32) -> Self::I;
    /// Each u16 lane shifted left by `n`.
    unsafe fn sll16(a: Self::I, n: u32) -> Self::I;
    /// `|a|` of each i8 (-128 stays 0x80, read as u8 128).
    unsafe fn abs8(a: Self::I) -> Self::I;
    /// i32 lanes: `a + b`.
    unsafe fn add32(a: Self::I, b: Self::I) -> Self::I;
    /// i32 lanes: `a - b`.
    unsafe fn sub32(a: Self::I, b: Self::I) -> Self::I;
    /// i32 lanes: low 32 bits of `a * b`.
    unsafe fn mul32(a: Self::I, b: Self::I) -> Self::I;
    /// i16 pairs: `a0 * b0 + a1 * b1` into each i32 lane.
    unsafe fn madd16(a: Self::I, b: Self::I) -> Self::I;
    /// i32 lanes shifted left by `n`.
    unsafe fn sll32(a: Self::I, n: u32) -> Self::I;
    /// i32 lanes shifted right by `n`, zeros in.
    unsafe fn srl32(a: Self::I, n: u32) -> Self::I;
    /// i32 lanes shifted right by `n`, sign in.
    unsafe fn sra32(a: Self::I, n: u32) -> Self::I;
    /// `LANES` bytes zero-extended to i32 lanes.
    unsafe fn u8_to_i32(p: *const u8) -> Self::I;
    /// `2 * LANES` bytes sign-extended to i16 (an i16 pair an i32 lane).
    unsafe fn i8_to_i16(p: *const u8) -> Self::I;
    /// `2 * LANES` bytes zero-extended to i16.
    unsafe fn u8_to_i16(p: *const u8) -> Self::I;
    /// The 16 bytes at `p` in every 128-bit lane (a [`Self::lut`] table).
    unsafe fn table16(p: *const u8) -> Self::I;
    /// Each byte of `a` (all below 16) replaced by `table`'s byte at that
    /// index (`pshufb`).
    unsafe fn lut(a: Self::I, table: Self::I) -> Self::I;
    /// `acc + ` the u8 x i8 dot of each lane's 4 bytes of `w` with the 4
    /// bytes at `x` (only where [`Self::DOT4`]).
    unsafe fn dot4(acc: Self::I, w: Self::I, x: *const i8) -> Self::I;
    /// The exact integer dots of a 32-block's 8 unpacked registers with the
    /// activation's 32 bytes at `x`: `[whole, 0]`, or per 16-weight half.
    /// `wu` are unsigned quants (`raw` their signed form when `signed`: Q8_0
    /// without `XOR_SIGNED`); `chunk`: how many `maddubs` results an i16
    /// lane may sum without overflow.
    unsafe fn dots(
        wu: &[Self::I; 8],
        raw: &[Self::I; 8],
        x: *const i8,
        halves: bool,
        chunk: usize,
        signed: bool,
    ) -> [Self::I; 2];

    /// i32 lanes to f32 (exact below 2^24).
    unsafe fn cvt(a: Self::I) -> Self::F;
    /// `LANES` f16 bits to f32.
    unsafe fn f16s(p: *const u16) -> Self::F;
    /// `LANES` e8m0 bytes `e` to the f32 `2^(e - 128)`, exactly as
    /// `quant_type::e8m0_half`: bits `(e - 1) << 23`, or for `e < 2` the
    /// subnormal `0x0040_0000 >> (1 - e)` (a shift of 32 or more gives 0,
    /// and the larger of the two as i32 is the one that applies).
    unsafe fn e8m0s(p: *const u8) -> Self::F;
    /// The f32 at `p` in every lane.
    unsafe fn fsplat(p: *const f32) -> Self::F;
    /// Zeros.
    unsafe fn fzero() -> Self::F;
    /// `a * b`.
    unsafe fn mul(a: Self::F, b: Self::F) -> Self::F;
    /// `a * b + c`, rounded once.
    unsafe fn fma(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// `c - a * b`, rounded once.
    unsafe fn fnma(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// Stores the lanes to `p` (16 f32 writable).
    unsafe fn store(p: *mut f32, a: Self::F);
}
