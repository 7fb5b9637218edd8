//! Gemma 4's feed-forward with experts (26B-A4B): the dense gated MLP and a
//! mixture of experts side by side, summed, each half with its own norms.
//! The MLP reads the block's normed input and its output is normed; the
//! experts read the block's un-normed input through a norm of their own,
//! are routed by that input's weightless RMSNorm times the router's scale
//! (and `hidden^-1/2`), and each chosen expert's weight is
//! multiplied by a scale of that expert's; their sum is normed too.

use candle_core::{DType, Device, Tensor};

use super::mlp::{self, Mlp};
use super::moe::{self, MoeSpec, MoeWeights};
use crate::error::{Error, Result};
use crate::linear::tensor_bytes;
use crate::spec::ModelSpec;
use crate::weights::source::{WeightSource, norm};

/// Both halves' weights.
#[derive(Debug, Clone)]
pub struct DenseAndMoe {
    /// The dense MLP.
    pub mlp: Mlp,
    /// RMSNorm of its output (`post_feedforward_layernorm_1`).
    mlp_post_norm: Tensor,
    /// The experts.
    pub moe: MoeWeights,
    /// The router's input scale (`router.scale`) times `hidden^-1/2`,
    /// `(hidden,)`, f32.
    router_scale: Tensor,
    /// RMSNorm of their input (`pre_feedforward_layernorm_2`).
    moe_norm: Tensor,
    /// RMSNorm of their sum (`post_feedforward_layernorm_2`).
    moe_post_norm: Tensor,
    /// Each expert's scale of its weight (`per_expert_scale`).
    expert_scales: Vec<f32>,
}

impl DenseAndMoe {
    /// Layer `i`'s halves (GGUF names: the MLP's, the experts', `ffn_gate_inp.scale`,
    /// `ffn_down_exps.scale`, `post_ffw_norm_1`, `pre_ffw_norm_2`,
    /// `post_ffw_norm_2`).
    pub(crate) fn load(
        src: &mut dyn WeightSource,
        spec: &ModelSpec,
        (i, m): (usize, &MoeSpec),
        device: &Device,
    ) -> Result<Self> {
        let n = |t: &str| format!("blk.{i}.{t}");
        let hidden = spec.hidden;
        let mlp = mlp::load(src, i, "", (hidden, spec.ffn_width(i)), device)?;
        let experts = moe::load::load(src, m, i, hidden, device)?;
        let router_scale = src.vector(&n("ffn_gate_inp.scale"), hidden, device)?;
        let router_scale = (router_scale * (hidden as f64).powf(-0.5))?.to_dtype(DType::F32)?;
        let expert_scales = src.vector(&n("ffn_down_exps.scale"), m.experts, device)?;
        let expert_scales = expert_scales.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        if expert_scales.iter().any(|s| !s.is_finite()) {
            return Err(Error::Config(format!(
                "blk.{i}.ffn_down_exps.scale is not finite"
            )));
        }
        Ok(DenseAndMoe {
            mlp,
            mlp_post_norm: norm(src, spec, &n("post_ffw_norm_1.weight"), hidden, device)?,
            moe: experts,
            router_scale,
            moe_norm: norm(src, spec, &n("pre_ffw_norm_2.weight"), hidden, device)?,
            moe_post_norm: norm(src, spec, &n("post_ffw_norm_2.weight"), hidden, device)?,
            expert_scales,
        })
    }

    pub(crate) fn held_bytes(&self) -> u64 {
        let norms = [
            &self.mlp_post_norm,
            &self.moe_norm,
            &self.moe_post_norm,
            &self.router_scale,
        ];
        self.mlp.held_bytes()
            + self.moe.held_bytes()
            + norms.iter().map(|t| tensor_bytes(t)).sum::<u64>()
            + 4 * self.expert_scales.len() as u64
    }

    /// `norm1(mlp(h)) + norm2(experts(norm(x)))` for the block's input `x`
    /// and its normed form `h`, both `(tokens, hidden)`, the MLP `width`
    /// wide.
    pub(crate) fn forward(
        &self,
        (x, h): (&Tensor, &Tensor),
        width: usize,
        spec: &ModelSpec,
    ) -> Result<Tensor> {
        let m = &self.moe.spec;
        let rms = |t: &Tensor, w: &Tensor| crate::norm::apply(t, w, None, &spec.norms);
        let dense = rms(
            &self.mlp.forward(h, width, m.activation)?,
            &self.mlp_post_norm,
        )?;
        let route = crate::norm::rms_unit(x, spec.norms.eps)?;
        let route = route.broadcast_mul(&self.router_scale.to_dtype(route.dtype())?)?;
        let into = rms(x, &self.moe_norm)?;
        let experts =
            moe::forward::forward_routed(&self.moe, (&route, &into), Some(&self.expert_scales))?;
        Ok((dense + rms(&experts, &self.moe_post_norm)?)?)
    }
}
