//! One mixture-of-experts layer's weights, every expert resident.

use std::sync::Arc;

use candle_core::Tensor;

use super::reads::ExpertReads;
use super::spec::MoeSpec;
use crate::ffn::mlp::Mlp;
use crate::linear::tensor_bytes;

/// One mixture-of-experts layer's weights.
#[derive(Debug, Clone)]
pub struct MoeWeights {
    /// Its kind.
    pub spec: MoeSpec,
    /// The router `[experts, hidden]`, f32.
    pub router: Tensor,
    /// The router's bias (gpt-oss).
    pub router_bias: Option<Tensor>,
    /// Every expert, resident.
    pub experts: Vec<Mlp>,
    /// The router's per-expert correction bias on the choice, f32
    /// (`e_score_correction_bias`: DeepSeek-V3, GLM-4.5).
    pub correction: Option<Tensor>,
    /// The shared expert and its gate `[hidden]` where it has one.
    pub shared: Option<(Mlp, Option<Tensor>)>,
    /// How often each expert's matrices were read.
    pub reads: Arc<ExpertReads>,
}

impl MoeWeights {
    pub(crate) fn held_bytes(&self) -> u64 {
        let opt = |t: &Option<Tensor>| t.as_ref().map_or(0, tensor_bytes);
        let shared = self
            .shared
            .as_ref()
            .map_or(0, |(m, g)| m.held_bytes() + opt(g));
        tensor_bytes(&self.router)
            + opt(&self.router_bias)
            + opt(&self.correction)
            + self.experts.iter().map(Mlp::held_bytes).sum::<u64>()
            + shared
    }
}
