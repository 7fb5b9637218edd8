//! The activation a sentence-transformers module names by its torch class
//! (a cross-encoder's `activation_fn`, a Dense module's
//! `activation_function`): the ones served, and the error naming any other.

use candle_core::Tensor;

use crate::error::{Error, Result};

/// A torch activation module, applied element by element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModuleActivation {
    /// `1 / (1 + e^-x)`: a one-label cross-encoder's default.
    Sigmoid,
    /// The value itself.
    Identity,
    /// `tanh(x)`: a Dense module's default.
    Tanh,
    /// `max(x, 0)`.
    Relu,
}

impl ModuleActivation {
    /// The activation of a torch class path (`torch.nn.modules.linear.Identity`),
    /// `default` when none is named; `what` names the module in the error.
    pub fn named(name: Option<&str>, default: Self, what: &str) -> Result<Self> {
        match name.map(|n| n.rsplit('.').next().unwrap_or(n)) {
            None => Ok(default),
            Some("Sigmoid") => Ok(ModuleActivation::Sigmoid),
            Some("Identity") => Ok(ModuleActivation::Identity),
            Some("Tanh") => Ok(ModuleActivation::Tanh),
            Some("ReLU") => Ok(ModuleActivation::Relu),
            Some(other) => Err(Error::Config(format!(
                "{what}'s activation {other} is not served (Sigmoid, Identity, Tanh, ReLU)"
            ))),
        }
    }

    /// `x` through it.
    pub fn apply(self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            ModuleActivation::Sigmoid => candle_nn::ops::sigmoid(x)?,
            ModuleActivation::Identity => x.clone(),
            ModuleActivation::Tanh => x.tanh()?,
            ModuleActivation::Relu => x.relu()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn activations_are_read_by_their_class_names_and_applied() {
        let named = |n| ModuleActivation::named(n, ModuleActivation::Tanh, "m").unwrap();
        assert_eq!(named(None), ModuleActivation::Tanh);
        assert_eq!(
            named(Some("torch.nn.modules.activation.Sigmoid")),
            ModuleActivation::Sigmoid
        );
        assert_eq!(
            named(Some("torch.nn.modules.linear.Identity")),
            ModuleActivation::Identity
        );
        assert_eq!(named(Some("torch.nn.ReLU")), ModuleActivation::Relu);
        let err = ModuleActivation::named(Some("torch.nn.GELU"), ModuleActivation::Tanh, "2_Dense");
        assert!(
            err.unwrap_err()
                .to_string()
                .contains("2_Dense's activation GELU")
        );
        let x = Tensor::new(&[-1.0f32, 0.0, 2.0], &Device::Cpu).unwrap();
        let got = |a: ModuleActivation| a.apply(&x).unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(got(ModuleActivation::Relu), [0.0, 0.0, 2.0]);
        assert_eq!(got(ModuleActivation::Identity), [-1.0, 0.0, 2.0]);
        let s = got(ModuleActivation::Sigmoid);
        assert!((s[0] - 1.0 / (1.0 + 1f32.exp())).abs() < 1e-6 && s[1] == 0.5);
        assert!((got(ModuleActivation::Tanh)[2] - 2f32.tanh()).abs() < 1e-6);
    }
}
