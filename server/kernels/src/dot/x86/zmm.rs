//! 512-bit vectors over AVX-512 F/BW/VL + VNNI: a panel's 16 weight rows a
//! register (`WIDE`), or, for a lone last group, its 8 rows in the low half
//! (loads of 256 bits, zero-extended: the high lanes compute zeros nobody reads).

use std::arch::x86_64::*;

use super::simd::Simd;

/// 512-bit vectors; `WIDE`: 16 rows, else 8 in the low lanes.
pub(super) struct Zmm<const WIDE: bool>;

// SAFETY (every method): inlined only into entry points compiled with
// AVX-512 F/BW/VL/VNNI; pointers are the caller's to keep in bounds, and a
// narrow load reads half what a wide one does.
impl<const WIDE: bool> Simd for Zmm<WIDE> {
    type I = __m512i;
    type F = __m512;
    const LANES: usize = if WIDE { 16 } else { 8 };
    const XOR_SIGNED: bool = true;
    const DOT4: bool = true;

    #[inline(always)]
    unsafe fn load(p: *const u8) -> __m512i {
        unsafe {
            if WIDE {
                _mm512_loadu_si512(p.cast())
            } else {
                _mm512_zextsi256_si512(_mm256_loadu_si256(p.cast()))
            }
        }
    }
    #[inline(always)]
    unsafe fn splat8(v: u8) -> __m512i {
        unsafe { _mm512_set1_epi8(v as i8) }
    }
    #[inline(always)]
    unsafe fn splat32(v: i32) -> __m512i {
        unsafe { _mm512_set1_epi32(v) }
    }
    #[inline(always)]
    unsafe fn bcast32(p: *const u8) -> __m512i {
        unsafe { _mm512_set1_epi32(p.cast::<i32>().read_unaligned()) }
    }
    #[inline(always)]
    unsafe fn and(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_and_si512(a, b) }
    }
    #[inline(always)]
    unsafe fn xor(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_xor_si512(a, b) }
    }
    #[inline(always)]
    unsafe fn or_and(a: __m512i, b: __m512i, m: __m512i) -> __m512i {
        // Truth table of a | (b & m) over (a, b, m) = bits (4, 2, 1).
        unsafe { _mm512_ternarylogic_epi32::<0xF8>(a, b, m) }
    }
    #[inline(always)]
    unsafe fn srl16(a: __m512i, n: u32) -> __m512i {
        unsafe { _mm512_srl_epi16(a, _mm_cvtsi32_si128(n as i32)) }
    }
    #[inline(always)]
    unsafe fn sll16(a: __m512i, n: u32) -> __m512i {
        unsafe { _mm512_sll_epi16(a, _mm_cvtsi32_si128(n as i32)) }
    }
    #[inline(always)]
    unsafe fn abs8(a: __m512i) -> __m512i {
        unsafe { _mm512_abs_epi8(a) }
    }
    #[inline(always)]
    unsafe fn add32(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_add_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn sub32(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_sub_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn mul32(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_mullo_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn madd16(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_madd_epi16(a, b) }
    }
    #[inline(always)]
    unsafe fn sll32(a: __m512i, n: u32) -> __m512i {
        unsafe { _mm512_sll_epi32(a, _mm_cvtsi32_si128(n as i32)) }
    }
    #[inline(always)]
    unsafe fn srl32(a: __m512i, n: u32) -> __m512i {
        unsafe { _mm512_srl_epi32(a, _mm_cvtsi32_si128(n as i32)) }
    }
    #[inline(always)]
    unsafe fn sra32(a: __m512i, n: u32) -> __m512i {
        unsafe { _mm512_sra_epi32(a, _mm_cvtsi32_si128(n as i32)) }
    }
    #[inline(always)]
    unsafe fn u8_to_i32(p: *const u8) -> __m512i {
        unsafe {
            let b = if WIDE {
                _mm_loadu_si128(p.cast())
            } else {
                _mm_loadl_epi64(p.cast())
            };
            _mm512_cvtepu8_epi32(b)
        }
    }
    #[inline(always)]
    unsafe fn i8_to_i16(p: *const u8) -> __m512i {
        unsafe { _mm512_cvtepi8_epi16(Self::half(p)) }
    }
    #[inline(always)]
    unsafe fn u8_to_i16(p: *const u8) -> __m512i {
        unsafe { _mm512_cvtepu8_epi16(Self::half(p)) }
    }

    #[inline(always)]
    unsafe fn table16(p: *const u8) -> __m512i {
        unsafe { _mm512_broadcast_i32x4(_mm_loadu_si128(p.cast())) }
    }
    #[inline(always)]
    unsafe fn lut(a: __m512i, table: __m512i) -> __m512i {
        unsafe { _mm512_shuffle_epi8(table, a) }
    }

    #[inline(always)]
    unsafe fn dot4(acc: __m512i, w: __m512i, x: *const i8) -> __m512i {
        // SAFETY: `x..x+4` readable (the caller's guarantee).
        unsafe { _mm512_dpbusd_epi32(acc, w, Self::bcast32(x.cast())) }
    }

    // Index loops over the 8 registers read clearer than zips.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    unsafe fn dots(
        wu: &[__m512i; 8],
        _raw: &[__m512i; 8],
        x: *const i8,
        halves: bool,
        _chunk: usize,
        _signed: bool,
    ) -> [__m512i; 2] {
        // Plain loops, no closures (see `tile::unpack`). Two chains of 4
        // (the halves), so consecutive `vpdpbusd` do not wait on each other;
        // integer sums are exact in any order.
        let mut out = [unsafe { _mm512_setzero_si512() }; 2];
        for u in 0..8 {
            // SAFETY: `x..x+32` readable (the caller's guarantee).
            out[u / 4] = unsafe {
                _mm512_dpbusd_epi32(out[u / 4], wu[u], Self::bcast32(x.add(4 * u).cast()))
            };
        }
        if !halves {
            out = [unsafe { _mm512_add_epi32(out[0], out[1]) }, out[1]];
        }
        out
    }

    #[inline(always)]
    unsafe fn cvt(a: __m512i) -> __m512 {
        unsafe { _mm512_cvtepi32_ps(a) }
    }
    #[inline(always)]
    unsafe fn f16s(p: *const u16) -> __m512 {
        unsafe {
            let h = if WIDE {
                _mm256_loadu_si256(p.cast())
            } else {
                _mm256_zextsi128_si256(_mm_loadu_si128(p.cast()))
            };
            _mm512_cvtph_ps(h)
        }
    }
    #[inline(always)]
    unsafe fn e8m0s(p: *const u8) -> __m512 {
        unsafe {
            let (e, one) = (Self::u8_to_i32(p), _mm512_set1_epi32(1));
            let normal = _mm512_slli_epi32::<23>(_mm512_sub_epi32(e, one));
            let tiny = _mm512_srlv_epi32(_mm512_set1_epi32(0x0040_0000), _mm512_sub_epi32(one, e));
            _mm512_castsi512_ps(_mm512_max_epi32(normal, tiny))
        }
    }
    #[inline(always)]
    unsafe fn fsplat(p: *const f32) -> __m512 {
        unsafe { _mm512_set1_ps(*p) }
    }
    #[inline(always)]
    unsafe fn fzero() -> __m512 {
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn fnma(a: __m512, b: __m512, c: __m512) -> __m512 {
        unsafe { _mm512_fnmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, a: __m512) {
        unsafe { _mm512_storeu_ps(p, a) }
    }
}

impl<const WIDE: bool> Zmm<WIDE> {
    /// `2 * LANES` bytes, zero-extended to 256 bits.
    #[inline(always)]
    unsafe fn half(p: *const u8) -> __m256i {
        unsafe {
            if WIDE {
                _mm256_loadu_si256(p.cast())
            } else {
                _mm256_zextsi128_si256(_mm_loadu_si128(p.cast()))
            }
        }
    }
}
