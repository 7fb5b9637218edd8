//! A cross-encoder's score head (`BertForSequenceClassification`, what
//! sentence-transformers' `CrossEncoder` saves): the transform its family
//! has (BERT's pooler, a dense layer and tanh on the first token's state;
//! ModernBERT's dense layer, activation and LayerNorm; a decoder's none,
//! see [`super::head_layout`]), the classifier (one label) and the
//! activation sentence-transformers applies to its logit (a sigmoid unless
//! the model's files say otherwise). A decoder reranker (Qwen3-Reranker) scores by its
//! "yes" logit against its "no" at the last position: P(yes) of the two is
//! the sigmoid of their difference, one row of its output projection less
//! another (vLLM's `classifier_from_token`).

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use super::activation::ModuleActivation;
use super::head_layout::{HeadSpec, HeadTransform};
use crate::error::{Error, Result};
use crate::spec::Activation;
use crate::weights::source::WeightSource;

/// `x` through a head's activation (transformers' `ACT2FN`: `gelu` is the
/// exact one).
fn act(x: &Tensor, a: Activation) -> Result<Tensor> {
    match a {
        Activation::SwigluOai { .. } => Err(Error::Config(
            "a classifier head's activation is never gpt-oss's SwiGLU".into(),
        )),
        a => a.apply(x),
    }
}

/// The activation a cross-encoder directory names for its score
/// (sentence-transformers' `activation_fn`, in
/// `config_sentence_transformers.json` or, from older versions,
/// `config.json`'s `sentence_transformers`); a sigmoid when it names none.
pub fn score_activation(dir: &Path) -> Result<ModuleActivation> {
    let read = |name: &str| -> Result<Option<Value>> {
        match std::fs::read_to_string(dir.join(name)) {
            Ok(text) => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| Error::Config(format!("{name}: {e}"))),
            Err(_) => Ok(None),
        }
    };
    let st = read("config_sentence_transformers.json")?;
    let config = read("config.json")?;
    let named = st
        .as_ref()
        .and_then(|v| v.get("activation_fn"))
        .or_else(|| {
            config
                .as_ref()?
                .get("sentence_transformers")?
                .get("activation_fn")
        });
    ModuleActivation::named(
        named.and_then(Value::as_str),
        ModuleActivation::Sigmoid,
        "a cross-encoder",
    )
}

/// The vector `name` of `len` where the head has it (`present`), else
/// zeros: a bias the layer was built without.
fn vector_or_zeros(
    src: &mut dyn WeightSource,
    (name, len): (&str, usize),
    present: bool,
    device: &Device,
) -> Result<Tensor> {
    match present {
        true => src.vector(name, len, device),
        false => Ok(Tensor::zeros(len, DType::F32, device)?),
    }
}

/// A cross-encoder's head in f32: the dense layer and the norm its
/// [`HeadTransform`] has, the one-label classifier, and the activation of
/// its logit.
#[derive(Debug, Clone)]
pub struct ScoreHead {
    transform: HeadTransform,
    dense: Option<(Tensor, Tensor)>,
    norm: Option<(Tensor, Tensor)>,
    out: (Tensor, Tensor),
    activation: ModuleActivation,
}

impl ScoreHead {
    /// Reads the head `spec` describes from `src`, by llama.cpp's names:
    /// `cls.output.{weight,bias}` (one label), and as the transform has
    /// them `cls.{weight,bias}` (`hidden` square) and
    /// `cls.norm.{weight,bias}`. A tensor the head needs and the file
    /// lacks is an error naming it; a bias the head has none of is zero.
    pub(crate) fn load(
        src: &mut dyn WeightSource,
        hidden: usize,
        (spec, activation): (HeadSpec, ModuleActivation),
        device: &Device,
    ) -> Result<Self> {
        // Read first, so a file with no head at all names its classifier.
        let out_w = src.small("cls.output.weight", &[1, hidden], device)?;
        let out_bias = spec.out_bias || src.has("cls.output.bias");
        let out_b = vector_or_zeros(src, ("cls.output.bias", 1), out_bias, device)?;
        // A GGUF says nothing of the biases but holds them or not.
        let dense_bias = spec.dense_bias || src.has("cls.bias");
        let norm_bias = spec.norm_bias || src.has("cls.norm.bias");
        let dense = match spec.transform {
            HeadTransform::Linear => None,
            _ => Some((
                src.small("cls.weight", &[hidden, hidden], device)?,
                vector_or_zeros(src, ("cls.bias", hidden), dense_bias, device)?,
            )),
        };
        let norm = match spec.transform {
            HeadTransform::Prediction { .. } => Some((
                src.vector("cls.norm.weight", hidden, device)?,
                vector_or_zeros(src, ("cls.norm.bias", hidden), norm_bias, device)?,
            )),
            _ => None,
        };
        Ok(ScoreHead {
            transform: spec.transform,
            dense,
            norm,
            out: (out_w, out_b),
            activation,
        })
    }

    /// A decoder's "yes" (`tokens.0`) against "no" (`tokens.1`): the
    /// difference of their rows of the output projection (`output.weight`,
    /// or the embedding table when tied), through a sigmoid.
    pub(crate) fn token_pair(
        src: &mut dyn WeightSource,
        (vocab, hidden): (usize, usize),
        (yes, no): (u32, u32),
        device: &Device,
    ) -> Result<Self> {
        let name = match src.has("output.weight") {
            true => "output.weight",
            false => "token_embd.weight",
        };
        let rows = src
            .embedding(name, vocab, hidden, device)?
            .forward(&[yes, no], device)?;
        let diff = (rows.get(0)? - rows.get(1)?)?.unsqueeze(0)?;
        Ok(ScoreHead {
            transform: HeadTransform::Linear,
            dense: None,
            norm: None,
            out: (diff, Tensor::zeros(1, DType::F32, device)?),
            activation: ModuleActivation::Sigmoid,
        })
    }

    /// llama.cpp's GGUF of a "yes"/"no" reranker: `cls.output.weight`
    /// holds the output projection's "yes" and "no" rows; its softmax's
    /// first is the sigmoid of their difference, as [`Self::token_pair`].
    pub(crate) fn label_pair(
        src: &mut dyn WeightSource,
        hidden: usize,
        device: &Device,
    ) -> Result<Self> {
        let rows = src.small("cls.output.weight", &[2, hidden], device)?;
        let diff = (rows.get(0)? - rows.get(1)?)?.unsqueeze(0)?;
        Ok(ScoreHead {
            transform: HeadTransform::Linear,
            dense: None,
            norm: None,
            out: (diff, Tensor::zeros(1, DType::F32, device)?),
            activation: ModuleActivation::Sigmoid,
        })
    }

    /// One score per row of `pooled` `(n, hidden)` (each sequence's
    /// state as the head pools it), after the activation.
    pub fn scores(&self, pooled: &Tensor) -> Result<Vec<f32>> {
        let linear = |x: &Tensor, (w, b): &(Tensor, Tensor)| -> Result<Tensor> {
            Ok(x.matmul(&w.t()?)?.broadcast_add(b)?)
        };
        let x = match (&self.dense, self.transform) {
            (Some(dense), HeadTransform::Pooler) => linear(pooled, dense)?.tanh()?,
            (Some(dense), HeadTransform::Prediction { activation, eps }) => {
                let x = act(&linear(pooled, dense)?, activation)?;
                match &self.norm {
                    Some((w, b)) => candle_nn::ops::layer_norm(&x, w, b, eps as f32)?,
                    None => x,
                }
            }
            _ => pooled.clone(),
        };
        let logits = linear(&x, &self.out)?;
        Ok(self
            .activation
            .apply(&logits)?
            .flatten_all()?
            .to_vec1::<f32>()?)
    }

    /// Bytes held.
    pub fn held_bytes(&self) -> u64 {
        let layers = self.dense.iter().chain(&self.norm).chain([&self.out]);
        layers
            .flat_map(|(w, b)| [w, b])
            .map(crate::linear::tensor_bytes)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(rows: &[[f32; 2]]) -> Tensor {
        Tensor::new(rows.concat(), &Device::Cpu)
            .and_then(|x| x.reshape((rows.len(), 2)))
            .unwrap()
    }

    fn v(xs: &[f32]) -> Tensor {
        Tensor::new(xs, &Device::Cpu).unwrap()
    }

    fn close(got: &[f32], want: &[f32]) {
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-5, "{got:?} {want:?}");
        }
    }

    #[test]
    fn the_head_is_tanh_of_the_pooler_then_the_classifier() {
        let head = ScoreHead {
            transform: HeadTransform::Pooler,
            dense: Some((t(&[[1.0, 0.0], [0.0, 2.0]]), v(&[0.0, 0.5]))),
            norm: None,
            out: (t(&[[1.0, -1.0]]), v(&[0.25])),
            activation: ModuleActivation::Identity,
        };
        let got = head.scores(&t(&[[0.5, 0.25], [-1.0, 0.0]])).unwrap();
        let want = [
            0.5f32.tanh() - 1.0f32.tanh() + 0.25,
            (-1.0f32).tanh() - 0.5f32.tanh() + 0.25,
        ];
        close(&got, &want);
    }

    /// ModernBERT's: dense, GELU, LayerNorm, classifier.
    #[test]
    fn the_prediction_head_is_the_activation_then_the_norm_then_the_classifier() {
        let head = ScoreHead {
            transform: HeadTransform::Prediction {
                activation: Activation::Gelu,
                eps: 1e-5,
            },
            dense: Some((t(&[[2.0, 0.0], [0.0, 1.0]]), v(&[0.0, 0.0]))),
            norm: Some((v(&[1.0, 2.0]), v(&[0.0, 1.0]))),
            out: (t(&[[1.0, 1.0]]), v(&[0.5])),
            activation: ModuleActivation::Sigmoid,
        };
        let gelu = |x: f32| {
            let t = Tensor::new(&[x], &Device::Cpu).unwrap();
            t.gelu_erf().unwrap().to_vec1::<f32>().unwrap()[0]
        };
        let (a, b) = (gelu(2.0), gelu(-1.0));
        // The LayerNorm of two values is -1 and 1 (or 1 and -1) exactly,
        // less its epsilon's share.
        let d = (a - b) / 2.0;
        let s = d / (d * d + 1e-5).sqrt();
        let logit = s + (2.0 * -s + 1.0) + 0.5;
        let got = head.scores(&t(&[[1.0, -1.0]])).unwrap();
        close(&got, &[1.0 / (1.0 + (-logit).exp())]);
    }
}
