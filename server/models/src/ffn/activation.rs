//! An MLP's activation: a dense layer's, its experts', or an encoder's
//! plain MLP's.

use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};

/// Exact GELU of `x`: on the CPU in f32 by ferrox-kernels' vectorised erf
/// (candle's calls libm's scalar `erff` per element), elsewhere candle's.
pub(crate) fn gelu_erf(x: &Tensor) -> Result<Tensor> {
    if !matches!(x.device(), Device::Cpu) || x.dtype() != DType::F32 {
        return Ok(x.gelu_erf()?);
    }
    let mut v = x.flatten_all()?.to_vec1::<f32>()?;
    ferrox_kernels::gelu_erf_in_place(&mut v);
    Ok(Tensor::from_vec(v, x.shape(), x.device())?)
}

/// An MLP's activation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// SiLU (SwiGLU: Llama, Qwen, Mistral, Phi).
    Silu,
    /// GELU, tanh approximation (GeGLU: Gemma).
    GeluTanh,
    /// GELU, exact (erf): BERT's `gelu`.
    Gelu,
    /// Squared ReLU, `max(x, 0)^2` (Nemotron-H's `relu2`).
    Relu2,
    /// gpt-oss's clamped SwiGLU: the gate clamped above at `limit`, up to
    /// `[-limit, limit]`, then `(up + 1) * gate * sigmoid(alpha * gate)`.
    SwigluOai {
        /// The sigmoid's slope (1.702).
        alpha: f32,
        /// The clamp (7.0).
        limit: f32,
    },
}

impl Activation {
    /// `x` through the activation alone (a plain MLP's, a head's); gpt-oss's
    /// SwiGLU, which needs its up half, is refused.
    pub(crate) fn apply(self, x: &candle_core::Tensor) -> Result<candle_core::Tensor> {
        Ok(match self {
            Activation::Silu => candle_nn::ops::silu(x)?,
            Activation::GeluTanh => x.gelu()?,
            Activation::Gelu => gelu_erf(x)?,
            Activation::Relu2 => x.relu()?.sqr()?,
            Activation::SwigluOai { .. } => {
                return Err(Error::Config(
                    "gpt-oss's SwiGLU is a gated activation".into(),
                ));
            }
        })
    }

    /// The activation transformers calls `name` under the config key `key`
    /// (`gelu` where absent): exact GELU, its tanh form, SiLU or squared
    /// ReLU.
    pub(crate) fn from_hf(key: &str, name: Option<&str>) -> Result<Self> {
        match name.unwrap_or("gelu") {
            "gelu" => Ok(Activation::Gelu),
            "gelu_new" | "gelu_pytorch_tanh" => Ok(Activation::GeluTanh),
            "silu" | "swish" => Ok(Activation::Silu),
            "relu2" => Ok(Activation::Relu2),
            other => Err(Error::Config(format!(
                "the {key} {other:?} is not served (gelu, gelu_new, gelu_pytorch_tanh, silu, relu2)"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transformers_names_map_to_their_activation_and_others_are_refused_by_key() {
        for (name, want) in [
            (None, Activation::Gelu),
            (Some("gelu"), Activation::Gelu),
            (Some("gelu_new"), Activation::GeluTanh),
            (Some("gelu_pytorch_tanh"), Activation::GeluTanh),
            (Some("silu"), Activation::Silu),
            (Some("swish"), Activation::Silu),
            (Some("relu2"), Activation::Relu2),
        ] {
            assert_eq!(
                Activation::from_hf("hidden_act", name).unwrap(),
                want,
                "{name:?}"
            );
        }
        let err = Activation::from_hf("classifier_activation", Some("relu")).unwrap_err();
        assert!(
            err.to_string()
                .contains("classifier_activation \"relu\" is not served"),
            "{err}"
        );
    }

    #[test]
    fn squared_relu_is_zero_below_zero_and_the_square_above() {
        let x =
            candle_core::Tensor::new(&[-2.0f32, -0.5, 0.0, 0.5, 3.0], &candle_core::Device::Cpu)
                .unwrap();
        let y: Vec<f32> = Activation::Relu2.apply(&x).unwrap().to_vec1().unwrap();
        assert_eq!(y, [0.0, 0.0, 0.0, 0.25, 9.0]);
    }
}
