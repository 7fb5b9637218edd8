//! The op-by-op mixture-of-experts forward on candle tensors: the path of
//! every device without the fused CPU one, and its reference. Tokens are
//! grouped by expert as there: each chosen expert runs once over its tokens.

use candle_core::{DType, Tensor};

use super::dispatch::Dispatch;
use super::route::{on_host, router_logits, shared_gate};
use super::spec::MoeSpec;
use super::weights::MoeWeights;
use crate::error::Result;
use crate::ffn::mlp::Mlp;

/// The layer's output for the normed hidden states `h` `(tokens, hidden)`.
pub(crate) fn forward(w: &MoeWeights, h: &Tensor) -> Result<Tensor> {
    forward_routed(w, (h, h), None)
}

/// The experts over `h`, each token's chosen by the router over its row of
/// `route` (Gemma 4 routes by another norm of the input than the experts
/// read), each chosen expert's weight times its `expert_scales` entry
/// where given.
pub(crate) fn forward_routed(
    w: &MoeWeights,
    (route, h): (&Tensor, &Tensor),
    expert_scales: Option<&[f32]>,
) -> Result<Tensor> {
    let s = &w.spec;
    let device = h.device();
    let hidden = h.dim(1)?;
    // In f32 on every device (the router's choice is discrete); on CPU by
    // the fused path's own arithmetic.
    let host = if device.is_cpu() {
        let bias = match &w.router_bias {
            Some(b) => Some(on_host(b, <[f32]>::to_vec)?),
            None => None,
        };
        let mut out = Vec::new();
        on_host(route, |hs| {
            on_host(&w.router, |r| {
                router_logits(hs, hidden, r, bias.as_deref(), &mut out)
            })
        })??;
        out
    } else {
        let mut logits = route.to_dtype(DType::F32)?.matmul(&w.router.t()?)?;
        if let Some(b) = &w.router_bias {
            logits = logits.broadcast_add(b)?;
        }
        logits.flatten_all()?.to_vec1()?
    };
    let correction = match &w.correction {
        Some(c) => Some(c.to_dtype(DType::F32)?.to_vec1::<f32>()?),
        None => None,
    };
    let d = Dispatch::new(s, &host, correction.as_deref());
    let mut out = h.zeros_like()?;
    for (e, cells) in d.active() {
        w.reads.record(e);
        let rows: Vec<u32> = cells.iter().map(|&c| d.token(c) as u32).collect();
        let scale = expert_scales.map_or(1.0, |s| s[e]);
        let weights: Vec<f32> = cells.iter().map(|&c| d.weight(c) * scale).collect();
        let idx = Tensor::new(rows.as_slice(), device)?;
        let wt = Tensor::from_vec(weights, (cells.len(), 1), device)?.to_dtype(h.dtype())?;
        let x = h.index_select(&idx, 0)?;
        let y = match s.weights_input() {
            // Llama 4: the weight scales what goes in.
            true => run(&w.experts[e], &x.broadcast_mul(&wt)?, s.intermediate, s)?,
            false => run(&w.experts[e], &x, s.intermediate, s)?.broadcast_mul(&wt)?,
        };
        out = out.index_add(&idx, &y, 0)?;
    }
    if let (Some((m, gate)), Some(width)) = (&w.shared, s.shared) {
        let y = run(m, h, width, s)?;
        let Some(gate) = gate else {
            return Ok((out + y)?);
        };
        let g = if device.is_cpu() {
            let gates = on_host(h, |hs| {
                on_host(gate, |g| {
                    hs.chunks_exact(hidden)
                        .map(|row| shared_gate(row, g))
                        .collect::<Vec<f32>>()
                })
            })??;
            Tensor::from_vec(gates, (y.dim(0)?, 1), device)?.to_dtype(y.dtype())?
        } else {
            candle_nn::ops::sigmoid(&h.matmul(&gate.to_dtype(h.dtype())?.unsqueeze(1)?)?)?
        };
        out = (out + y.broadcast_mul(&g)?)?;
    }
    Ok(out)
}

/// One expert of width `inter` over `h`: gated, or plain.
fn run(m: &Mlp, h: &Tensor, inter: usize, s: &MoeSpec) -> Result<Tensor> {
    match s.gated {
        true => m.forward(h, inter, s.activation),
        false => m.forward_plain(h, s.activation),
    }
}
