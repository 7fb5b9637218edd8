//! Paged attention's hot loops compiled for AVX2 + FMA + F16C: the same
//! code as the portable path, in wider registers.

use std::arch::x86_64::*;

use half::f16;

use super::{KvElem, KvView, QueryTile, Scratch};

/// [`super::attend_tile`] in 256-bit registers.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn attend_tile<T: KvElem>(
    kv: &KvView<'_, T>,
    q: &QueryTile<'_>,
    scratch: &mut Scratch,
    outs: &mut [&mut [f32]],
) {
    super::attend_tile(kv, q, scratch, outs);
}

/// f16 to f32, eight at a time.
///
/// # Safety
/// The CPU has AVX and F16C; `out.len() == src.len()`.
#[target_feature(enable = "avx,f16c")]
pub(super) unsafe fn widen_f16(src: &[f16], out: &mut [f32]) {
    let (s, o) = (src.chunks_exact(8), out.chunks_exact_mut(8));
    for (s, o) in s.zip(o) {
        // SAFETY: 8 f16 readable, 8 f32 writable.
        unsafe {
            let v = _mm256_cvtph_ps(_mm_loadu_si128(s.as_ptr().cast()));
            _mm256_storeu_ps(o.as_mut_ptr(), v);
        }
    }
    let done = src.len() / 8 * 8;
    for (o, s) in out[done..].iter_mut().zip(&src[done..]) {
        *o = s.to_f32();
    }
}
