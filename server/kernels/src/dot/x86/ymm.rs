//! 256-bit vectors: 8 weight rows a register. AVX2 (`maddubs`, summing a
//! few products in i16 before widening) or AVX-VNNI (`vpdpbusd`).

use std::arch::x86_64::*;

use super::simd::Simd;

/// 256-bit vectors; `VNNI` picks AVX-VNNI's fused u8 x i8 dot.
pub(super) struct Ymm<const VNNI: bool>;

// SAFETY (every method): inlined only into entry points compiled with AVX2,
// FMA and F16C (plus AVX-VNNI for `Ymm<true>`); pointers are the caller's
// to keep in bounds.
impl<const VNNI: bool> Simd for Ymm<VNNI> {
    type I = __m256i;
    type F = __m256;
    const LANES: usize = 8;
    const XOR_SIGNED: bool = VNNI;
    const DOT4: bool = VNNI;

    #[inline(always)]
    unsafe fn load(p: *const u8) -> __m256i {
        unsafe { _mm256_loadu_si256(p.cast()) }
    }
    #[inline(always)]
    unsafe fn splat8(v: u8) -> __m256i {
        unsafe { _mm256_set1_epi8(v as i8) }
    }
    #[inline(always)]
    unsafe fn splat32(v: i32) -> __m256i {
        unsafe { _mm256_set1_epi32(v) }
    }
    #[inline(always)]
    unsafe fn bcast32(p: *const u8) -> __m256i {
        unsafe { _mm256_set1_epi32(p.cast::<i32>().read_unaligned()) }
    }
    #[inline(always)]
    unsafe fn and(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_and_si256(a, b) }
    }
    #[inline(always)]
    unsafe fn xor(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_xor_si256(a, b) }
    }
    #[inline(always)]
    unsafe fn or_and(a: __m256i, b: __m256i, m: __m256i) -> __m256i {
        unsafe { _mm256_or_si256(a, _mm256_and_si256(b, m)) }
    }
    #[inline(always)]
    unsafe fn srl16(a: __m256i, n: u32) -> __m256i {
        unsafe { _mm256_srl_epi16(a, _mm_cvtsi32_si128(n as i32)) }
    }
    #[inline(always)]
    unsafe fn sll16(a: __m256i, n: u32) -> __m256i {
        unsafe { _mm256_sll_epi16(a, _mm_cvtsi32_si128(n as i32)) }
    }
    #[inline(always)]
    unsafe fn abs8(a: __m256i) -> __m256i {
        unsafe { _mm256_sign_epi8(a, a) }
    }
    #[inline(always)]
    unsafe fn add32(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_add_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn sub32(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_sub_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn mul32(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_mullo_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn madd16(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_madd_epi16(a, b) }
    }
    #[inline(always)]
    unsafe fn sll32(a: __m256i, n: u32) -> __m256i {
        unsafe { _mm256_sll_epi32(a, _mm_cvtsi32_si128(n as i32)) }
    }
    #[inline(always)]
    unsafe fn srl32(a: __m256i, n: u32) -> __m256i {
        unsafe { _mm256_srl_epi32(a, _mm_cvtsi32_si128(n as i32)) }
    }
    #[inline(always)]
    unsafe fn sra32(a: __m256i, n: u32) -> __m256i {
        unsafe { _mm256_sra_epi32(a, _mm_cvtsi32_si128(n as i32)) }
    }
    #[inline(always)]
    unsafe fn u8_to_i32(p: *const u8) -> __m256i {
        unsafe { _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast())) }
    }
    #[inline(always)]
    unsafe fn i8_to_i16(p: *const u8) -> __m256i {
        unsafe { _mm256_cvtepi8_epi16(_mm_loadu_si128(p.cast())) }
    }
    #[inline(always)]
    unsafe fn u8_to_i16(p: *const u8) -> __m256i {
        unsafe { _mm256_cvtepu8_epi16(_mm_loadu_si128(p.cast())) }
    }

    #[inline(always)]
    unsafe fn table16(p: *const u8) -> __m256i {
        unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast())) }
    }
    #[inline(always)]
    unsafe fn lut(a: __m256i, table: __m256i) -> __m256i {
        unsafe { _mm256_shuffle_epi8(table, a) }
    }

    #[inline(always)]
    unsafe fn dot4(acc: __m256i, w: __m256i, x: *const i8) -> __m256i {
        // SAFETY: `x..x+4` readable (the caller's guarantee).
        unsafe {
            let xb = Self::bcast32(x.cast());
            if VNNI {
                _mm256_dpbusd_avx_epi32(acc, w, xb)
            } else {
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(w, xb), _mm256_set1_epi16(1));
                _mm256_add_epi32(acc, p)
            }
        }
    }

    // Index loops over the 8 registers read clearer than zips.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    unsafe fn dots(
        wu: &[__m256i; 8],
        raw: &[__m256i; 8],
        x: *const i8,
        halves: bool,
        chunk: usize,
        signed: bool,
    ) -> [__m256i; 2] {
        // Plain loops, no closures (see `unpack`).
        let ranges = if halves {
            [(0, 4), (4, 8)]
        } else {
            [(0, 8), (8, 8)]
        };
        let mut out = [unsafe { Self::splat32(0) }; 2];
        for (h, (a, b)) in ranges.into_iter().enumerate() {
            // SAFETY: `x..x+32` readable (the caller's guarantee).
            unsafe {
                let mut s = _mm256_setzero_si256();
                if VNNI {
                    // Two chains, so consecutive `vpdpbusd` do not wait on
                    // each other; integer sums are exact in any order.
                    let mut t = _mm256_setzero_si256();
                    for u in a..b {
                        let xb = Self::bcast32(x.add(4 * u).cast());
                        if u % 2 == 0 {
                            s = _mm256_dpbusd_avx_epi32(s, wu[u], xb);
                        } else {
                            t = _mm256_dpbusd_avx_epi32(t, wu[u], xb);
                        }
                    }
                    s = _mm256_add_epi32(s, t);
                } else {
                    let mut u = a;
                    while u < b {
                        let mut t = _mm256_setzero_si256();
                        for v in u..(u + chunk).min(b) {
                            let xb = Self::bcast32(x.add(4 * v).cast());
                            let xv = if signed {
                                _mm256_sign_epi8(xb, raw[v])
                            } else {
                                xb
                            };
                            t = _mm256_add_epi16(t, _mm256_maddubs_epi16(wu[v], xv));
                        }
                        s = _mm256_add_epi32(s, _mm256_madd_epi16(t, _mm256_set1_epi16(1)));
                        u += chunk;
                    }
                }
                out[h] = s;
            }
        }
        out
    }

    #[inline(always)]
    unsafe fn cvt(a: __m256i) -> __m256 {
        unsafe { _mm256_cvtepi32_ps(a) }
    }
    #[inline(always)]
    unsafe fn f16s(p: *const u16) -> __m256 {
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
    #[inline(always)]
    unsafe fn e8m0s(p: *const u8) -> __m256 {
        unsafe {
            let (e, one) = (Self::u8_to_i32(p), _mm256_set1_epi32(1));
            let normal = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, one));
            let tiny = _mm256_srlv_epi32(_mm256_set1_epi32(0x0040_0000), _mm256_sub_epi32(one, e));
            _mm256_castsi256_ps(_mm256_max_epi32(normal, tiny))
        }
    }
    #[inline(always)]
    unsafe fn fsplat(p: *const f32) -> __m256 {
        unsafe { _mm256_set1_ps(*p) }
    }
    #[inline(always)]
    unsafe fn fzero() -> __m256 {
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn fnma(a: __m256, b: __m256, c: __m256) -> __m256 {
        unsafe { _mm256_fnmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, a: __m256) {
        unsafe { _mm256_storeu_ps(p, a) }
    }
}
