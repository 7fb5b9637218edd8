//! A mixture-of-experts layer's weights from any source, by GGUF names:
//! the router, each expert's gate, up and down from the stacked tensors,
//! their biases, and the shared expert.

use candle_core::{Device, Tensor};

use super::reads::ExpertReads;
use super::spec::{MoeSpec, Routing};
use super::weights::MoeWeights;
use crate::error::Result;
use crate::ffn::mlp::{self, Mlp};
use crate::projection::single;
use crate::weights::source::WeightSource;

/// Layer `i`'s experts, router and shared expert.
pub(crate) fn load(
    src: &mut dyn WeightSource,
    m: &MoeSpec,
    i: usize,
    hidden: usize,
    device: &Device,
) -> Result<MoeWeights> {
    let n = |s: &str| format!("blk.{i}.{s}");
    let (e, inter) = (m.experts, m.intermediate);
    let router = src.router(&n("ffn_gate_inp.weight"), e, hidden, device)?;
    let (gate, up, down) = (
        n("ffn_gate_exps.weight"),
        n("ffn_up_exps.weight"),
        n("ffn_down_exps.weight"),
    );
    // A plain expert's `gate_up` holds up alone; llama.cpp's Gemma 4 files
    // stack gate and up in one tensor, gate's rows first.
    let fused = n("ffn_gate_up_exps.weight");
    let gate_ups = match (m.gated, src.has(&fused)) {
        (true, true) => src.experts(&[(&fused, 2 * inter)], e, hidden, device)?,
        (true, false) => src.experts(&[(&gate, inter), (&up, inter)], e, hidden, device)?,
        (false, _) => src.experts(&[(&up, inter)], e, hidden, device)?,
    };
    let downs = src.experts(&[(&down, hidden)], e, inter, device)?;
    let mut biases = Vec::new();
    if m.biases {
        let gate = src.expert_vectors(&n("ffn_gate_exps.bias"), e, inter, device)?;
        let up = src.expert_vectors(&n("ffn_up_exps.bias"), e, inter, device)?;
        let down = src.expert_vectors(&n("ffn_down_exps.bias"), e, hidden, device)?;
        for ((g, u), d) in gate.into_iter().zip(up).zip(down) {
            biases.push((Some(Tensor::cat(&[g, u], 0)?), Some(d)));
        }
    }
    biases.resize(e, (None, None));
    let experts = gate_ups
        .into_iter()
        .zip(downs)
        .zip(biases)
        .map(|((gate_up, down), (gate_up_bias, down_bias))| Mlp {
            gate_up,
            down: single(down),
            gate_up_bias,
            down_bias,
        })
        .collect();
    let router_bias = match m.biases {
        true => Some(src.vector(&n("ffn_gate_inp.bias"), e, device)?),
        false => None,
    };
    let correction = match m.routing {
        Routing::SigmoidGroups { .. } => Some(src.vector(&n("exp_probs_b.bias"), e, device)?),
        _ => None,
    };
    let shared = match m.shared {
        Some(width) => Some((
            match m.gated {
                true => mlp::load(src, i, "_shexp", (hidden, width), device)?,
                false => mlp::load_plain(src, i, "_shexp", (hidden, width), device)?,
            },
            match m.shared_gated {
                true => Some(src.vector(&n("ffn_gate_inp_shexp.weight"), hidden, device)?),
                false => None,
            },
        )),
        None => None,
    };
    Ok(MoeWeights {
        spec: *m,
        router,
        router_bias,
        correction,
        experts,
        shared,
        reads: std::sync::Arc::new(ExpertReads::new(e)),
    })
}
