//! Rotary position embeddings over the whole context, gathered per token so
//! every row of a batch can sit at its own position.

use candle_core::{DType, Device, Tensor};

use crate::error::Result;

/// Cos/sin tables `(context, head_dim / 2)`.
#[derive(Debug, Clone)]
pub struct Rope {
    cos: Tensor,
    sin: Tensor,
}

impl Rope {
    /// Tables for positions `0..context`; `factors` divide the inverse
    /// frequencies (Llama 3.1's scaling; GGUF's `rope_freqs.weight`).
    pub fn new(
        head_dim: usize,
        theta: f32,
        context: usize,
        factors: Option<&[f32]>,
        device: &Device,
    ) -> Result<Self> {
        let half = head_dim / 2;
        if let Some(f) = factors.filter(|f| f.len() != half) {
            return Err(crate::Error::Config(format!(
                "{} RoPE frequency factors for head dim {head_dim}",
                f.len()
            )));
        }
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| {
                let divisor = factors.map_or(1.0, |f| f[i]);
                1.0 / theta.powf(2.0 * i as f32 / head_dim as f32) / divisor
            })
            .collect();
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
                let angle = pos as f64 * f as f64;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
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

    /// The rows for `positions` (one per token): `(cos, sin)`, each `(tokens, head_dim / 2)`.
    pub fn gather(&self, positions: &Tensor) -> Result<(Tensor, Tensor)> {
        Ok((
            self.cos.index_select(positions, 0)?,
            self.sin.index_select(positions, 0)?,
        ))
    }

    /// The same rotation in place on `x` `(tokens, heads, head_dim)`, with
    /// the rows `cos`, `sin` `(tokens, head_dim / 2)` from [`Self::gather`];
    /// the arithmetic is `rope_thd`'s, so results are bit-identical.
    pub fn apply_in_place(x: &mut [f32], heads: usize, head_dim: usize, cos: &[f32], sin: &[f32]) {
        let half = head_dim / 2;
        let rows = cos.chunks_exact(half).zip(sin.chunks_exact(half));
        for (token, (c, s)) in x.chunks_exact_mut(heads * head_dim).zip(rows) {
            for head in token.chunks_exact_mut(head_dim) {
                let (lo, hi) = head.split_at_mut(half);
                for (((a, b), &c), &s) in lo.iter_mut().zip(hi).zip(c).zip(s) {
                    (*a, *b) = (*a * c - *b * s, *a * s + *b * c);
                }
            }
        }
    }

    /// Applies the rotation (half-split, as Hugging Face's `rotate_half`) to
    /// `x`: `(tokens, heads, head_dim)`.
    pub fn apply(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let x = x.unsqueeze(0)?.to_dtype(DType::F32)?.contiguous()?;
        Ok(candle_nn::rotary_emb::rope_thd(&x, cos, sin)?.squeeze(0)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_place_rotation_is_bit_identical_to_rope_thd() {
        let (tokens, heads, head_dim) = (5, 3, 8);
        let rope = Rope::new(head_dim, 10_000.0, 64, None, &Device::Cpu).unwrap();
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
