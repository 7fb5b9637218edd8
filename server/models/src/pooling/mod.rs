//! What a pooling model does with its last hidden states: one vector a
//! sequence (its first token's, the mean of its tokens', or its last
//! token's), L2-normalized where the model says; how that is read from
//! sentence-transformers' files and GGUF ([`config`]); the Dense modules
//! after it ([`dense`]) and the prompts before the text ([`prompts`]).

pub mod activation;
pub mod config;
pub mod dense;
pub mod head;
pub mod head_layout;
mod method;
pub mod prompts;

use candle_core::{DType, Tensor};

use crate::error::Result;
pub use method::PoolingMethod;

/// How a pooling model turns a sequence into one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pooling {
    /// Which tokens' states make the vector.
    pub method: PoolingMethod,
    /// Divided by its L2 norm (sentence-transformers' `Normalize`).
    pub normalize: bool,
}

impl Pooling {
    /// One vector per sequence, `(lens.len(), hidden)` in f32, from
    /// `hidden` `(tokens, hidden)`, whose rows are the sequences' tokens,
    /// `lens[i]` of sequence `i` after those of the ones before. Not
    /// normalized: [`normalize`] does that, after any truncation.
    pub fn pool(&self, hidden: &Tensor, lens: &[usize]) -> Result<Tensor> {
        let hidden = hidden.to_dtype(DType::F32)?;
        let mut rows = Vec::with_capacity(lens.len());
        let mut at = 0;
        for &n in lens {
            let seq = hidden.narrow(0, at, n)?;
            rows.push(match self.method {
                PoolingMethod::Cls => seq.narrow(0, 0, 1)?,
                PoolingMethod::Last => seq.narrow(0, n - 1, 1)?,
                PoolingMethod::Mean => seq.mean_keepdim(0)?,
            });
            at += n;
        }
        Ok(Tensor::cat(&rows, 0)?)
    }
}

/// `v` divided by its L2 norm (a zero vector stays zero).
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn each_method_pools_its_tokens_per_sequence() {
        // Two sequences, 2 and 3 tokens, width 2.
        let rows = [
            [1.0, 2.0],
            [3.0, 4.0],
            [5.0, 6.0],
            [7.0, 8.0],
            [9.0, 0.0f32],
        ];
        let h = Tensor::new(&rows, &Device::Cpu).unwrap();
        let cases = [
            (PoolingMethod::Cls, [[1.0, 2.0], [5.0, 6.0]]),
            (PoolingMethod::Last, [[3.0, 4.0], [9.0, 0.0]]),
            (PoolingMethod::Mean, [[2.0, 3.0], [7.0, 14.0 / 3.0]]),
        ];
        for (method, want) in cases {
            let p = Pooling {
                method,
                normalize: false,
            };
            let got: Vec<Vec<f32>> = p.pool(&h, &[2, 3]).unwrap().to_vec2().unwrap();
            for (g, w) in got.iter().zip(want) {
                for (a, b) in g.iter().zip(w) {
                    assert!((a - b).abs() < 1e-6, "{method}: {got:?}");
                }
            }
        }
    }

    #[test]
    fn normalizing_gives_unit_length_and_leaves_zero_alone() {
        let mut v = [3.0, 4.0];
        normalize(&mut v);
        assert_eq!(v, [0.6, 0.8]);
        let mut z = [0.0, 0.0];
        normalize(&mut z);
        assert_eq!(z, [0.0, 0.0]);
    }
}
