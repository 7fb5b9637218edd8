//! A mixture-of-experts layer's kind: how many experts, how many a token
//! runs, how the router weighs them.

use crate::ffn::activation::Activation;

/// One mixture-of-experts layer's kind.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeSpec {
    /// Experts in the layer (every one resident).
    pub experts: usize,
    /// Experts each token runs through.
    pub top_k: usize,
    /// Each expert's MLP width.
    pub intermediate: usize,
    /// The experts' activation.
    pub activation: Activation,
    /// How the router's logits become the chosen experts' weights.
    pub routing: Routing,
    /// Biases on the router and on every expert's projections (gpt-oss).
    pub biases: bool,
    /// A shared expert of this width that every token passes through.
    pub shared: Option<usize>,
    /// The shared expert's output scaled by a sigmoid gate of its own
    /// (Qwen2-MoE, Qwen3-Next); else added as it is (GLM-4.5, DeepSeek-V3).
    pub shared_gated: bool,
    /// Each expert (and the shared one) a gated MLP, `down(act(gate) *
    /// up)`; else plain, `down(act(up))` (Nemotron 3's squared-ReLU experts).
    pub gated: bool,
}

/// More experts than any model has (DeepSeek-V3 has 256, Qwen3-Next 512):
/// a count past it is a corrupt file's, refused before anything is sized by it.
pub const MAX_EXPERTS: usize = 1 << 14;

impl MoeSpec {
    /// SiLU-gated experts `(experts, top_k, intermediate)` routed by
    /// `routing`, beside `shared_count` shared experts of their width,
    /// summed into one and added ungated (GLM-4.5, DeepSeek).
    pub fn silu_with_shared(
        (experts, top_k, intermediate): (usize, usize, usize),
        routing: Routing,
        shared_count: usize,
    ) -> Self {
        MoeSpec {
            experts,
            top_k,
            intermediate,
            activation: Activation::Silu,
            routing,
            biases: false,
            shared: Some(intermediate * shared_count).filter(|&n| n > 0),
            shared_gated: false,
            gated: true,
        }
    }

    /// Checks the counts are usable.
    pub(crate) fn validate(&self) -> std::result::Result<(), String> {
        if self.experts == 0 || self.experts > MAX_EXPERTS {
            return Err(format!("{} experts (1 to {MAX_EXPERTS})", self.experts));
        }
        if self.top_k == 0 || self.top_k > self.experts {
            return Err(format!(
                "{} experts a token of {}",
                self.top_k, self.experts
            ));
        }
        if self.intermediate == 0 || self.shared == Some(0) {
            return Err(format!("zero expert width in {self:?}"));
        }
        self.routing.check(self.experts, self.top_k)?;
        if let Activation::SwigluOai { alpha, limit } = self.activation
            && !(alpha.is_finite() && limit.is_finite() && limit > 0.0)
        {
            return Err(format!("SwiGLU alpha {alpha}, limit {limit}"));
        }
        Ok(())
    }

    /// Whether a token's weight scales its input to the expert rather than
    /// the expert's output ([`Routing::TopKSigmoid`]).
    pub fn weights_input(&self) -> bool {
        self.routing == Routing::TopKSigmoid
    }

    /// Parameters of the routed experts, `(all, those one token runs)`:
    /// gate, up and down (and their biases) of each.
    pub fn expert_params(&self, hidden: usize) -> (u64, u64) {
        let (h, f) = (hidden as u64, self.intermediate as u64);
        let mats = if self.gated { 3 } else { 2 };
        let bias = if self.biases { (mats - 1) * f + h } else { 0 };
        let one = mats * h * f + bias;
        (one * self.experts as u64, one * self.top_k as u64)
    }
}

/// How a router's logits choose experts and weigh them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Routing {
    /// Softmax over every expert, the `top_k` largest kept; `normalize`:
    /// then divided by their sum (Mixtral always; Qwen's `norm_topk_prob`).
    SoftmaxTopK {
        /// Renormalise the kept probabilities.
        normalize: bool,
    },
    /// The `top_k` largest logits, softmax over those alone (gpt-oss).
    TopKSoftmax,
    /// The `top_k` largest logits, each weighed by its sigmoid; the weight
    /// scales the token going into the expert, not what comes out (Llama
    /// 4's router, llama.cpp's `weight_before_ffn`).
    TopKSigmoid,
    /// Softmax over every expert; the `top_k` largest kept among the
    /// `topk_groups` best of `groups` equal groups (a group's best
    /// probability), times `scale`, not renormalised (DeepSeek-V2's
    /// `greedy`: one group; its `group_limited_greedy`).
    SoftmaxGroups {
        /// Groups the experts split into.
        groups: usize,
        /// Groups a token chooses from.
        topk_groups: usize,
        /// `routed_scaling_factor`.
        scale: f32,
    },
    /// Sigmoid scores; the choice by score plus the layer's correction
    /// bias, among the `topk_groups` best of `groups` equal groups of
    /// experts (a group's two best summed); the chosen scores as weights,
    /// divided by their sum when `normalize`, times `scale` (DeepSeek-V3,
    /// GLM-4.5).
    SigmoidGroups {
        /// Groups the experts split into.
        groups: usize,
        /// Groups a token chooses from.
        topk_groups: usize,
        /// Renormalise the chosen scores.
        normalize: bool,
        /// `routed_scaling_factor`.
        scale: f32,
    },
}

impl Routing {
    /// Checks the groups split `experts` evenly and hold `top_k` of them.
    fn check(&self, experts: usize, top_k: usize) -> std::result::Result<(), String> {
        let (groups, topk_groups, scale) = match *self {
            Routing::SigmoidGroups {
                groups,
                topk_groups,
                scale,
                ..
            }
            | Routing::SoftmaxGroups {
                groups,
                topk_groups,
                scale,
            } => (groups, topk_groups, scale),
            Routing::SoftmaxTopK { .. } | Routing::TopKSoftmax | Routing::TopKSigmoid => {
                return Ok(());
            }
        };
        let even = groups > 0 && experts.is_multiple_of(groups);
        if !even || topk_groups == 0 || topk_groups > groups {
            return Err(format!(
                "{experts} experts in {groups} groups, {topk_groups} kept"
            ));
        }
        let per = experts / groups;
        if top_k > per * topk_groups || !scale.is_finite() {
            return Err(format!(
                "{top_k} experts a token from {topk_groups} groups of {per}, scaled by {scale}"
            ));
        }
        Ok(())
    }
}
