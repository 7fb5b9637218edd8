//! A cross-encoder's score head (`BertForSequenceClassification`, what
//! sentence-transformers' `CrossEncoder` saves): the pooler (a dense layer
//! and tanh on the first token's state), the classifier (one label) and the
//! activation sentence-transformers applies to its logit (a sigmoid unless
//! the model's files say otherwise). llama.cpp names the two layers `cls`
//! and `cls.output`. A decoder with a classification head
//! (`Qwen3ForSequenceClassification`) has no pooler and no bias: its
//! `score` linear reads the last token's state. A decoder reranker (Qwen3-Reranker) scores by its
//! "yes" logit against its "no" at the last position: P(yes) of the two is
//! the sigmoid of their difference, one row of its output projection less
//! another (vLLM's `classifier_from_token`).

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use super::activation::ModuleActivation;
use crate::error::{Error, Result};
use crate::weights::source::WeightSource;

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

/// The pooler (none for a decoder's token pair) and the one-label
/// classifier, in f32.
#[derive(Debug, Clone)]
pub struct ScoreHead {
    dense: Option<(Tensor, Tensor)>,
    out: (Tensor, Tensor),
    activation: ModuleActivation,
}

impl ScoreHead {
    /// Reads `cls.{weight,bias}` (`hidden` square; only with `pooler`, an
    /// encoder's) and `cls.output.{weight,bias}` (one label; a decoder's
    /// `score` has no bias) from `src`.
    pub(crate) fn load(
        src: &mut dyn WeightSource,
        (hidden, pooler): (usize, bool),
        activation: ModuleActivation,
        device: &Device,
    ) -> Result<Self> {
        if !src.has("cls.output.weight") {
            return Err(Error::MissingTensor(
                "the classifier (`classifier.weight` or `score.weight`, GGUF \
                 `cls.output.weight`)"
                    .into(),
            ));
        }
        let dense = match pooler {
            true => Some((
                src.small("cls.weight", &[hidden, hidden], device)?,
                src.vector("cls.bias", hidden, device)?,
            )),
            false => None,
        };
        let bias = match src.has("cls.output.bias") {
            true => src.vector("cls.output.bias", 1, device)?,
            false => Tensor::zeros(1, DType::F32, device)?,
        };
        let out = (src.small("cls.output.weight", &[1, hidden], device)?, bias);
        Ok(ScoreHead {
            dense,
            out,
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
            dense: None,
            out: (diff, Tensor::zeros(1, DType::F32, device)?),
            activation: ModuleActivation::Sigmoid,
        })
    }

    /// One score per row of `pooled` `(n, hidden)` (each sequence's first
    /// token's state; a decoder's last), after the activation.
    pub fn scores(&self, pooled: &Tensor) -> Result<Vec<f32>> {
        let linear = |x: &Tensor, (w, b): &(Tensor, Tensor)| -> Result<Tensor> {
            Ok(x.matmul(&w.t()?)?.broadcast_add(b)?)
        };
        let x = match &self.dense {
            Some(dense) => linear(pooled, dense)?.tanh()?,
            None => pooled.clone(),
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
        let dense = self.dense.iter().flat_map(|(w, b)| [w, b]);
        dense
            .chain([&self.out.0, &self.out.1])
            .map(crate::linear::tensor_bytes)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_is_tanh_of_the_pooler_then_the_classifier() {
        let d = Device::Cpu;
        let head = ScoreHead {
            dense: Some((
                Tensor::new(&[[1.0f32, 0.0], [0.0, 2.0]], &d).unwrap(),
                Tensor::new(&[0.0f32, 0.5], &d).unwrap(),
            )),
            out: (
                Tensor::new(&[[1.0f32, -1.0]], &d).unwrap(),
                Tensor::new(&[0.25f32], &d).unwrap(),
            ),
            activation: ModuleActivation::Identity,
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
