//! A cross-encoder's score head (`BertForSequenceClassification`, what
//! sentence-transformers' `CrossEncoder` saves): the pooler (a dense layer
//! and tanh on the first token's state), the classifier (one label) and the
//! activation sentence-transformers applies to its logit (a sigmoid unless
//! the model's files say otherwise). llama.cpp names the two layers `cls`
//! and `cls.output`.

use std::path::Path;

use candle_core::{Device, Tensor};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::weights::source::WeightSource;

/// What turns the classifier's logit into the score.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScoreActivation {
    /// `1 / (1 + e^-x)`: sentence-transformers' default for one label.
    Sigmoid,
    /// The logit itself.
    Identity,
}

impl ScoreActivation {
    /// The activation a cross-encoder directory names (sentence-transformers'
    /// `activation_fn`, in `config_sentence_transformers.json` or, from
    /// older versions, `config.json`'s `sentence_transformers`); a sigmoid
    /// when it names none.
    pub fn from_dir(dir: &Path) -> Result<Self> {
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
        Self::named(named.and_then(Value::as_str))
    }

    /// The activation of sentence-transformers' `activation_fn` class path.
    pub fn named(name: Option<&str>) -> Result<Self> {
        match name.map(|n| n.rsplit('.').next().unwrap_or(n)) {
            None | Some("Sigmoid") => Ok(ScoreActivation::Sigmoid),
            Some("Identity") => Ok(ScoreActivation::Identity),
            Some(other) => Err(Error::Config(format!(
                "a cross-encoder's activation {other} (Sigmoid and Identity are served)"
            ))),
        }
    }
}

/// The pooler and the one-label classifier, in f32.
#[derive(Debug, Clone)]
pub struct ScoreHead {
    dense: (Tensor, Tensor),
    out: (Tensor, Tensor),
    activation: ScoreActivation,
}

impl ScoreHead {
    /// Reads `cls.{weight,bias}` (`hidden` square) and
    /// `cls.output.{weight,bias}` (one label) from `src`.
    pub(crate) fn load(
        src: &mut dyn WeightSource,
        hidden: usize,
        activation: ScoreActivation,
        device: &Device,
    ) -> Result<Self> {
        if !src.has("cls.output.weight") {
            return Err(Error::MissingTensor(
                "the classifier (`classifier.weight`, GGUF `cls.output.weight`)".into(),
            ));
        }
        let dense = (
            src.small("cls.weight", &[hidden, hidden], device)?,
            src.vector("cls.bias", hidden, device)?,
        );
        let out = (
            src.small("cls.output.weight", &[1, hidden], device)?,
            src.vector("cls.output.bias", 1, device)?,
        );
        Ok(ScoreHead {
            dense,
            out,
            activation,
        })
    }

    /// One score per row of `pooled` `(n, hidden)` (each sequence's first
    /// token's state), after the activation.
    pub fn scores(&self, pooled: &Tensor) -> Result<Vec<f32>> {
        let linear = |x: &Tensor, (w, b): &(Tensor, Tensor)| -> Result<Tensor> {
            Ok(x.matmul(&w.t()?)?.broadcast_add(b)?)
        };
        let x = linear(pooled, &self.dense)?.tanh()?;
        let logits = linear(&x, &self.out)?.flatten_all()?.to_vec1::<f32>()?;
        Ok(match self.activation {
            ScoreActivation::Sigmoid => logits.iter().map(|x| 1.0 / (1.0 + (-x).exp())).collect(),
            ScoreActivation::Identity => logits,
        })
    }

    /// Bytes held.
    pub fn held_bytes(&self) -> u64 {
        [&self.dense.0, &self.dense.1, &self.out.0, &self.out.1]
            .into_iter()
            .map(crate::linear::tensor_bytes)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_activation_is_read_by_its_class_name() {
        let named = |n| ScoreActivation::named(n).unwrap();
        assert_eq!(named(None), ScoreActivation::Sigmoid);
        assert_eq!(
            named(Some("torch.nn.modules.activation.Sigmoid")),
            ScoreActivation::Sigmoid
        );
        assert_eq!(
            named(Some("torch.nn.modules.linear.Identity")),
            ScoreActivation::Identity
        );
        assert!(ScoreActivation::named(Some("torch.nn.Tanh")).is_err());
    }

    #[test]
    fn the_head_is_tanh_of_the_pooler_then_the_classifier() {
        let d = Device::Cpu;
        let head = ScoreHead {
            dense: (
                Tensor::new(&[[1.0f32, 0.0], [0.0, 2.0]], &d).unwrap(),
                Tensor::new(&[0.0f32, 0.5], &d).unwrap(),
            ),
            out: (
                Tensor::new(&[[1.0f32, -1.0]], &d).unwrap(),
                Tensor::new(&[0.25f32], &d).unwrap(),
            ),
            activation: ScoreActivation::Identity,
        };
        let pooled = Tensor::new(&[[0.5f32, 0.25], [-1.0, 0.0]], &d).unwrap();
        let got = head.scores(&pooled).unwrap();
        let want = [
            0.5f32.tanh() - 1.0f32.tanh() + 0.25,
            (-1.0f32).tanh() - 0.5f32.tanh() + 0.25,
        ];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{got:?} {want:?}");
        }
    }
}
