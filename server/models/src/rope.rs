//! Rotary position embeddings over the whole context, gathered per token so
//! every row of a batch can sit at its own position.

use candle_core::{DType, Device, Tensor};

use crate::error::Result;
use crate::spec::{RopeScaling, RopeSpec};

/// Cos/sin tables `(context, rotary_dim / 2)` of one RoPE kind.
#[derive(Debug, Clone)]
pub struct Rope {
    cos: Tensor,
    sin: Tensor,
}

/// The inverse frequencies of `spec` for a model served to `context`
/// positions, and what cos and sin are multiplied by.
fn frequencies(spec: &RopeSpec, context: usize) -> Result<(Vec<f32>, f32)> {
    let (dim, half) = (spec.rotary_dim, spec.rotary_dim / 2);
    let (divisors, mul): (Option<&[f32]>, f32) = match &spec.scaling {
        RopeScaling::None | RopeScaling::Linear(_) => (None, 1.0),
        RopeScaling::Divisors(d) => (Some(d), 1.0),
        RopeScaling::Yarn {
            divisors,
            attention,
        } => (Some(divisors), *attention),
        // llama.cpp's rule (and vLLM's): one set for the whole served
        // context, so a token's rotation never depends on its batch.
        RopeScaling::LongRope {
            short,
            long,
            original,
            attention,
        } => (
            Some(if context > *original { long } else { short }),
            *attention,
        ),
    };
    if let Some(d) = divisors.filter(|d| d.len() != half) {
        return Err(crate::Error::Config(format!(
            "{} RoPE frequency factors for rotary dim {dim}",
            d.len()
        )));
    }
    let linear = match spec.scaling {
        RopeScaling::Linear(f) => f,
        _ => 1.0,
    };
    let inv_freq = (0..half)
        .map(|i| {
            let divisor = divisors.map_or(1.0, |d| d[i]) * linear;
            1.0 / (divisor * spec.theta.powf(2.0 * i as f32 / dim as f32))
        })
        .collect();
    Ok((inv_freq, mul))
}

impl Rope {
    /// Tables for positions `0..context`.
    pub fn new(spec: &RopeSpec, context: usize, device: &Device) -> Result<Self> {
        let half = spec.rotary_dim / 2;
        let (inv_freq, mul) = frequencies(spec, context)?;
        // The context length is the file's word: a table that cannot be
        // allocated is an error, not an abort.
        let table = |n: Option<usize>| -> Result<Vec<f32>> {
            let mut v = Vec::new();
            n.and_then(|n| v.try_reserve_exact(n).ok()).ok_or_else(|| {
                crate::Error::Config(format!(
                    "no memory for RoPE tables of {context} positions x {half}"
                ))
            })?;
            Ok(v)
        };
        let n = context.checked_mul(half);
        let (mut cos, mut sin) = (table(n)?, table(n)?);
        for pos in 0..context {
            for &f in &inv_freq {
                // In f64 so positions near 8k keep their precision.
                let angle = pos as f64 * f64::from(f);
                cos.push(angle.cos() as f32 * mul);
                sin.push(angle.sin() as f32 * mul);
            }
        }
        Ok(Rope {
            cos: Tensor::from_vec(cos, (context, half), device)?,
            sin: Tensor::from_vec(sin, (context, half), device)?,
        })
    }

    /// Positions covered.
    pub fn context(&self) -> usize {
        self.cos.dims()[0]
    }

    /// The rows for `positions` (one per token): `(cos, sin)`, each `(tokens, rotary_dim / 2)`.
    pub fn gather(&self, positions: &Tensor) -> Result<(Tensor, Tensor)> {
        Ok((
            self.cos.index_select(positions, 0)?,
            self.sin.index_select(positions, 0)?,
        ))
    }

    /// The same rotation in place on `x` `(tokens, heads, head_dim)`, with
    /// the rows `cos`, `sin` `(tokens, rotary_dim / 2)` from [`Self::gather`]:
    /// each head's first `rotary_dim` values rotate; the arithmetic is
    /// `rope_thd`'s, so results are bit-identical.
    pub fn apply_in_place(x: &mut [f32], heads: usize, head_dim: usize, cos: &[f32], sin: &[f32]) {
        let tokens = x.len() / (heads * head_dim).max(1);
        let half = cos.len() / tokens.max(1);
        if half == 0 {
            return;
        }
        let rows = cos.chunks_exact(half).zip(sin.chunks_exact(half));
        for (token, (c, s)) in x.chunks_exact_mut(heads * head_dim).zip(rows) {
            for head in token.chunks_exact_mut(head_dim) {
                let (lo, hi) = head[..2 * half].split_at_mut(half);
                for (((a, b), &c), &s) in lo.iter_mut().zip(hi).zip(c).zip(s) {
                    (*a, *b) = (*a * c - *b * s, *a * s + *b * c);
                }
            }
        }
    }

    /// Applies the rotation (half-split, as Hugging Face's `rotate_half`) to
    /// the first `rotary_dim` values of each head of `x`: `(tokens, heads,
    /// head_dim)`.
    pub fn apply(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let x = x.to_dtype(DType::F32)?;
        let (head_dim, rot) = (x.dim(2)?, 2 * cos.dim(1)?);
        if rot == head_dim {
            let x = x.unsqueeze(0)?.contiguous()?;
            return Ok(candle_nn::rotary_emb::rope_thd(&x, cos, sin)?.squeeze(0)?);
        }
        let rotated = x.narrow(2, 0, rot)?.unsqueeze(0)?.contiguous()?;
        let rotated = candle_nn::rotary_emb::rope_thd(&rotated, cos, sin)?.squeeze(0)?;
        Ok(Tensor::cat(
            &[&rotated, &x.narrow(2, rot, head_dim - rot)?],
            2,
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(rotary_dim: usize) -> RopeSpec {
        RopeSpec {
            theta: 10_000.0,
            rotary_dim,
            scaling: RopeScaling::None,
        }
    }

    #[test]
    fn partial_rotation_leaves_the_tail_and_matches_in_place() {
        let (tokens, heads, head_dim) = (3, 2, 8);
        let rope = Rope::new(&plain(6), 16, &Device::Cpu).unwrap();
        let pos = Tensor::new(&[0u32, 5, 15], &Device::Cpu).unwrap();
        let (cos, sin) = rope.gather(&pos).unwrap();
        let x: Vec<f32> = (0..tokens * heads * head_dim)
            .map(|i| i as f32 * 0.1)
            .collect();
        let t = Tensor::from_vec(x.clone(), (tokens, heads, head_dim), &Device::Cpu).unwrap();
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let want = flat(&Rope::apply(&t, &cos, &sin).unwrap());
        let mut got = x.clone();
        Rope::apply_in_place(&mut got, heads, head_dim, &flat(&cos), &flat(&sin));
        assert_eq!(got, want);
        for (i, (a, b)) in got.iter().zip(&x).enumerate() {
            if i % head_dim >= 6 {
                assert_eq!(a, b, "dimension {} rotated", i % head_dim);
            }
        }
        assert_ne!(got[head_dim * heads..], x[head_dim * heads..]);
    }

    #[test]
    fn scalings_change_the_frequencies_as_their_kind_says() {
        let spec = |scaling| RopeSpec {
            theta: 100.0,
            rotary_dim: 4,
            scaling,
        };
        let (plain, _) = frequencies(&spec(RopeScaling::None), 64).unwrap();
        let (linear, _) = frequencies(&spec(RopeScaling::Linear(8.0)), 64).unwrap();
        assert_eq!(linear, plain.iter().map(|f| f / 8.0).collect::<Vec<_>>());
        let long = RopeScaling::LongRope {
            short: vec![1.0, 2.0],
            long: vec![3.0, 4.0],
            original: 32,
            attention: 1.25,
        };
        let (short, mul) = frequencies(&spec(long.clone()), 32).unwrap();
        assert_eq!((short[1], mul), (plain[1] / 2.0, 1.25));
        let (far, _) = frequencies(&spec(long), 33).unwrap();
        assert_eq!(far[0], plain[0] / 3.0);
        let bad = spec(RopeScaling::Divisors(vec![1.0; 3]));
        assert!(frequencies(&bad, 8).is_err());
    }

    #[test]
    fn in_place_rotation_is_bit_identical_to_rope_thd() {
        let (tokens, heads, head_dim) = (5, 3, 8);
        let rope = Rope::new(&plain(head_dim), 64, &Device::Cpu).unwrap();
        let pos = Tensor::new(&[0u32, 7, 3, 63, 1], &Device::Cpu).unwrap();
        let (cos, sin) = rope.gather(&pos).unwrap();
        let x: Vec<f32> = (0..tokens * heads * head_dim)
            .map(|i| (i as f32 * 0.37).sin() * 3.0)
            .collect();
        let t = Tensor::from_vec(x.clone(), (tokens, heads, head_dim), &Device::Cpu).unwrap();
        let want = Rope::apply(&t, &cos, &sin)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let mut got = x;
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        Rope::apply_in_place(&mut got, heads, head_dim, &flat(&cos), &flat(&sin));
        assert_eq!(got, want);
    }
}
