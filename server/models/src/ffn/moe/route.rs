//! The router's choice for each token, pure (a token's choice depends on
//! its own logits only), and the host arithmetic both CPU paths share, so
//! they choose and weigh alike to the bit.

use candle_core::Tensor;

use super::spec::{MoeSpec, Routing};

/// Token `logits` (one per expert) to its `top_k` experts and their
/// weights, slot by slot, into `out` (cleared first). Ties go to the lower
/// expert; the arithmetic is transformers' (softmax in f32, max first).
pub fn route(spec: &MoeSpec, logits: &[f32], out: &mut Vec<(u32, f32)>) {
    out.clear();
    let k = spec.top_k.min(logits.len());
    let probs: Vec<f32>;
    let scores = match spec.routing {
        Routing::SoftmaxTopK { .. } => {
            probs = softmax(logits);
            &probs[..]
        }
        Routing::TopKSoftmax => logits,
    };
    for (e, &s) in scores.iter().enumerate() {
        // Insertion into the kept `k`, largest first (a later equal one after).
        let at = out.iter().position(|&(_, v)| s > v).unwrap_or(out.len());
        if at < k {
            out.insert(at, (e as u32, s));
            out.truncate(k);
        }
    }
    match spec.routing {
        Routing::SoftmaxTopK { normalize: true } => {
            let sum: f32 = out.iter().map(|&(_, p)| p).sum();
            out.iter_mut().for_each(|(_, p)| *p /= sum);
        }
        Routing::SoftmaxTopK { normalize: false } => {}
        Routing::TopKSoftmax => {
            let kept: Vec<f32> = out.iter().map(|&(_, v)| v).collect();
            for ((_, w), p) in out.iter_mut().zip(softmax(&kept)) {
                *w = p;
            }
        }
    }
}

/// Router logits `[token][expert]` of the normed rows `h` (`hidden` wide)
/// on the host, into `out`: the one arithmetic both CPU paths use, so they
/// choose and weigh alike to the bit.
pub(crate) fn router_logits(
    h: &[f32],
    hidden: usize,
    router: &[f32],
    bias: Option<&[f32]>,
    out: &mut Vec<f32>,
) {
    out.clear();
    for x in h.chunks_exact(hidden) {
        for (e, w) in router.chunks_exact(hidden).enumerate() {
            let dot = x.iter().zip(w).fold(0f32, |acc, (a, b)| acc + a * b);
            out.push(dot + bias.map_or(0.0, |b| b[e]));
        }
    }
}

/// A shared expert's gate for the normed row `h`: `sigmoid(h . gate)`, as
/// candle's sigmoid computes it.
pub(crate) fn shared_gate(h: &[f32], gate: &[f32]) -> f32 {
    let g = h.iter().zip(gate).fold(0f32, |acc, (a, b)| acc + a * b);
    ((-g).exp() + 1.0).recip()
}

/// `f` of `t`'s f32 elements on the host (a CPU tensor's own storage, else
/// a copy).
pub(crate) fn on_host<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> crate::Result<R> {
    use candle_core::{CpuStorage, Storage};
    if t.device().is_cpu() && t.dtype() == candle_core::DType::F32 {
        let (storage, layout) = t.storage_and_layout();
        if let (Storage::Cpu(CpuStorage::F32(v)), Some((a, b))) =
            (&*storage, layout.contiguous_offsets())
        {
            return Ok(f(&v[a..b]));
        }
    }
    let v: Vec<f32> = t
        .to_dtype(candle_core::DType::F32)?
        .flatten_all()?
        .to_vec1()?;
    Ok(f(&v))
}

/// Softmax of `x` in f32, as torch computes it (max subtracted first).
fn softmax(x: &[f32]) -> Vec<f32> {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = x.iter().map(|&v| (v - max).exp()).collect();
    let sum: f32 = e.iter().sum();
    e.into_iter().map(|v| v / sum).collect()
}
