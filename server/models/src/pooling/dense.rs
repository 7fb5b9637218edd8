//! sentence-transformers' `Dense` module: a linear layer (and its
//! activation) applied to the pooled vector, in `modules.json` order,
//! before any Normalize (EmbeddingGemma's two, 768 -> 3072 -> 768). Read
//! from the module's folder (`config.json`, `model.safetensors` with
//! `linear.weight` and `linear.bias`), or from a GGUF's `dense_2` and
//! `dense_3` tensors (llama.cpp's converter with
//! `--sentence-transformers-dense-modules`). Held and run in f32: one
//! small matrix a vector.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde::Deserialize;

use super::activation::ModuleActivation;
use crate::error::{Error, Result};
use crate::weights::source::{WeightSource, check_small, check_vector};

/// Where a Dense module's weights are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DenseWeights {
    /// The module folder's `model.safetensors` (`linear.weight`, `linear.bias`).
    File(PathBuf),
    /// The model's own tensor `{name}.weight` (GGUF's `dense_2`, `dense_3`).
    Tensor(String),
}

/// One Dense module as the model's files describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DenseModule {
    /// Its weights.
    pub weights: DenseWeights,
    /// The width it takes.
    pub in_features: usize,
    /// The width it gives.
    pub out_features: usize,
    /// It adds a bias.
    pub bias: bool,
    /// Applied after the linear layer.
    pub activation: ModuleActivation,
}

/// A Dense module's `config.json` (sentence-transformers' keys).
#[derive(Debug, Deserialize)]
struct DenseConfig {
    in_features: usize,
    out_features: usize,
    #[serde(default = "yes")]
    bias: bool,
    activation_function: Option<String>,
    #[serde(default)]
    use_residual: bool,
    module_input_name: Option<String>,
}

fn yes() -> bool {
    true
}

/// The vector every module of a sentence embedding reads and writes.
const SENTENCE_EMBEDDING: &str = "sentence_embedding";

impl DenseModule {
    /// The module in `dir` (its folder), from its `config.json` text;
    /// what it does that is not served is refused by name.
    pub fn from_config(dir: &Path, text: &str) -> Result<Self> {
        let shown = dir.display();
        let c: DenseConfig = serde_json::from_str(text).map_err(|e| Error::Corrupt {
            path: format!("{shown}/config.json"),
            message: e.to_string(),
        })?;
        if c.use_residual {
            return Err(Error::Config(format!(
                "{shown}: a Dense module with use_residual is not served"
            )));
        }
        if let Some(other) = c.module_input_name.filter(|n| n != SENTENCE_EMBEDDING) {
            return Err(Error::Config(format!(
                "{shown}: a Dense module reading {other:?} (not the pooled vector) is not served"
            )));
        }
        let what = format!("the Dense module {shown}");
        // sentence-transformers' Dense defaults to tanh.
        let activation = ModuleActivation::named(
            c.activation_function.as_deref(),
            ModuleActivation::Tanh,
            &what,
        )?;
        Ok(DenseModule {
            weights: DenseWeights::File(dir.join("model.safetensors")),
            in_features: c.in_features,
            out_features: c.out_features,
            bias: c.bias,
            activation,
        })
    }

    /// Bytes its weights take as held (f32).
    pub fn held_bytes(&self) -> u64 {
        let values =
            self.in_features * self.out_features + usize::from(self.bias) * self.out_features;
        (values * std::mem::size_of::<f32>()) as u64
    }

    /// Reads its weights (`src`: the model's own, for a GGUF's tensors).
    pub(crate) fn load(&self, src: &mut dyn WeightSource, device: &Device) -> Result<Dense> {
        let shape = [self.out_features, self.in_features];
        let (weight, bias) = match &self.weights {
            DenseWeights::Tensor(name) => {
                (src.small(&format!("{name}.weight"), &shape, device)?, None)
            }
            DenseWeights::File(path) => self.read_file(path, device)?,
        };
        Ok(Dense {
            weight,
            bias,
            activation: self.activation,
        })
    }

    /// `linear.weight` (and `linear.bias`) from a module's safetensors.
    fn read_file(&self, path: &Path, device: &Device) -> Result<(Tensor, Option<Tensor>)> {
        let shown = path.display().to_string();
        let mut tensors =
            candle_core::safetensors::load(path, device).map_err(|e| Error::Corrupt {
                path: shown.clone(),
                message: e.to_string(),
            })?;
        let mut take = |name: &str| {
            tensors
                .remove(name)
                .ok_or_else(|| Error::MissingTensor(format!("{shown}: {name}")))
        };
        let weight = take("linear.weight")?;
        check_small(
            "linear.weight",
            weight.dims(),
            &[self.out_features, self.in_features],
        )?;
        let bias = match self.bias {
            true => {
                let b = take("linear.bias")?;
                check_vector("linear.bias", b.dims(), self.out_features)?;
                Some(b.to_dtype(DType::F32)?)
            }
            false => None,
        };
        Ok((weight.to_dtype(DType::F32)?, bias))
    }
}

/// A Dense module's weights, ready to run.
#[derive(Debug, Clone)]
pub struct Dense {
    weight: Tensor,
    bias: Option<Tensor>,
    activation: ModuleActivation,
}

impl Dense {
    /// `x` `(n, in)` to `(n, out)`, f32.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut y = x.matmul(&self.weight.t()?)?;
        if let Some(b) = &self.bias {
            y = y.broadcast_add(b)?;
        }
        self.activation.apply(&y)
    }

    /// The width it gives.
    pub fn out_features(&self) -> usize {
        self.weight.dims()[0]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_reads_as_sentence_transformers_writes_it() {
        let dir = Path::new("2_Dense");
        let m = DenseModule::from_config(
            dir,
            r#"{"in_features": 4, "out_features": 8, "bias": false,
                "activation_function": "torch.nn.modules.linear.Identity"}"#,
        )
        .unwrap();
        assert_eq!(
            (m.in_features, m.out_features, m.bias, m.activation),
            (4, 8, false, ModuleActivation::Identity)
        );
        assert_eq!(m.weights, DenseWeights::File(dir.join("model.safetensors")));
        // sentence-transformers' defaults: a bias, tanh.
        let d = DenseModule::from_config(dir, r#"{"in_features": 4, "out_features": 8}"#).unwrap();
        assert_eq!((d.bias, d.activation), (true, ModuleActivation::Tanh));
        for (bad, why) in [
            (
                r#"{"in_features":4,"out_features":4,"use_residual":true}"#,
                "use_residual",
            ),
            (
                r#"{"in_features":4,"out_features":4,"module_input_name":"token_embeddings"}"#,
                "token_embeddings",
            ),
            (
                r#"{"in_features":4,"out_features":4,"activation_function":"torch.nn.GELU"}"#,
                "GELU",
            ),
        ] {
            let err = DenseModule::from_config(dir, bad).unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
        }
    }

    #[test]
    fn the_layer_is_the_activation_of_x_times_w_plus_b() {
        let d = Device::Cpu;
        let dense = Dense {
            weight: Tensor::new(&[[1.0f32, 2.0], [0.0, -1.0], [0.5, 0.5]], &d).unwrap(),
            bias: Some(Tensor::new(&[0.0f32, 1.0, -1.0], &d).unwrap()),
            activation: ModuleActivation::Relu,
        };
        let x = Tensor::new(&[[1.0f32, 1.0], [2.0, -1.0]], &d).unwrap();
        let got: Vec<Vec<f32>> = dense.forward(&x).unwrap().to_vec2().unwrap();
        assert_eq!(got, [[3.0, 0.0, 0.0], [0.0, 2.0, 0.0]]);
        assert_eq!(dense.out_features(), 3);
    }
}
