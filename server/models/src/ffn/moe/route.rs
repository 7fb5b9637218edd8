//! The router's choice for each token, pure (a token's choice depends on
//! its own logits only), and the host arithmetic both CPU paths share, so
//! they choose and weigh alike to the bit.

use candle_core::Tensor;

use super::spec::{MoeSpec, Routing};

/// Token `logits` (one per expert) to its `top_k` experts and their
/// weights, slot by slot, into `out` (cleared first). Ties go to the lower
/// expert; the arithmetic is transformers' (softmax in f32, max first).
/// `correction`: the layer's per-expert bias on the choice
/// ([`Routing::SigmoidGroups`]).
pub fn route(
    spec: &MoeSpec,
    logits: &[f32],
    correction: Option<&[f32]>,
    out: &mut Vec<(u32, f32)>,
) {
    out.clear();
    let k = spec.top_k.min(logits.len());
    match spec.routing {
        Routing::SigmoidGroups { .. } => return sigmoid_groups(spec, logits, correction, out),
        Routing::SoftmaxGroups { .. } => return softmax_groups(spec, logits, out),
        Routing::SoftmaxTopK { .. } | Routing::TopKSoftmax | Routing::TopKSigmoid => {}
    }
    let probs: Vec<f32>;
    let scores = match spec.routing {
        Routing::SoftmaxTopK { .. } => {
            probs = softmax(logits);
            &probs[..]
        }
        _ => logits,
    };
    keep_largest(scores, k, out);
    match spec.routing {
        Routing::SoftmaxTopK { normalize: true } => normalize(out),
        Routing::TopKSoftmax => {
            let kept: Vec<f32> = out.iter().map(|&(_, v)| v).collect();
            for ((_, w), p) in out.iter_mut().zip(softmax(&kept)) {
                *w = p;
            }
        }
        Routing::TopKSigmoid => {
            for (_, w) in out.iter_mut() {
                *w = 1.0 / (1.0 + (-*w).exp());
            }
        }
        _ => {}
    }
}

/// The `k` largest of `scores` into `out`, largest first (a later equal
/// one after).
fn keep_largest(scores: &[f32], k: usize, out: &mut Vec<(u32, f32)>) {
    for (e, &s) in scores.iter().enumerate() {
        let at = out.iter().position(|&(_, v)| s > v).unwrap_or(out.len());
        if at < k {
            out.insert(at, (e as u32, s));
            out.truncate(k);
        }
    }
}

/// Divides the kept weights by their sum.
fn normalize(out: &mut [(u32, f32)]) {
    let sum: f32 = out.iter().map(|&(_, p)| p).sum();
    out.iter_mut().for_each(|(_, p)| *p /= sum);
}

/// DeepSeek-V3's and GLM-4.5's router (transformers' arithmetic): sigmoid
/// scores, the choice by score plus correction within the best groups.
fn sigmoid_groups(
    spec: &MoeSpec,
    logits: &[f32],
    correction: Option<&[f32]>,
    out: &mut Vec<(u32, f32)>,
) {
    let Routing::SigmoidGroups {
        groups,
        topk_groups,
        normalize: norm,
        scale,
    } = spec.routing
    else {
        return;
    };
    let scores: Vec<f32> = logits.iter().map(|&l| 1.0 / (1.0 + (-l).exp())).collect();
    let mut choice: Vec<f32> = match correction {
        Some(c) => scores.iter().zip(c).map(|(s, c)| s + c).collect(),
        None => scores.clone(),
    };
    let per = (choice.len() / groups.max(1)).max(1);
    let mut best = Vec::with_capacity(2);
    let group_scores: Vec<f32> = choice
        .chunks(per)
        .map(|g| {
            best.clear();
            keep_largest(g, 2, &mut best);
            best.iter().map(|&(_, v)| v).sum()
        })
        .collect();
    let mut kept = Vec::with_capacity(topk_groups);
    keep_largest(&group_scores, topk_groups, &mut kept);
    for (g, c) in choice.chunks_mut(per).enumerate() {
        if !kept.iter().any(|&(k, _)| k as usize == g) {
            c.iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
        }
    }
    keep_largest(&choice, spec.top_k.min(choice.len()), out);
    for (e, w) in out.iter_mut() {
        *w = scores[*e as usize];
    }
    if norm {
        let sum: f32 = out.iter().map(|&(_, p)| p).sum::<f32>() + 1e-20;
        out.iter_mut().for_each(|(_, p)| *p /= sum);
    }
    out.iter_mut().for_each(|(_, p)| *p *= scale);
}

/// DeepSeek-V2's router (transformers' arithmetic): softmax, the experts
/// of groups outside the best `topk_groups` (by their best probability)
/// zeroed, the `top_k` largest kept and scaled.
fn softmax_groups(spec: &MoeSpec, logits: &[f32], out: &mut Vec<(u32, f32)>) {
    let Routing::SoftmaxGroups {
        groups,
        topk_groups,
        scale,
    } = spec.routing
    else {
        return;
    };
    let mut probs = softmax(logits);
    if groups > 1 {
        let per = (probs.len() / groups).max(1);
        let best: Vec<f32> = (probs.chunks(per))
            .map(|g| g.iter().copied().fold(f32::NEG_INFINITY, f32::max))
            .collect();
        let mut kept = Vec::with_capacity(topk_groups);
        keep_largest(&best, topk_groups, &mut kept);
        for (g, c) in probs.chunks_mut(per).enumerate() {
            if !kept.iter().any(|&(k, _)| k as usize == g) {
                c.iter_mut().for_each(|v| *v = 0.0);
            }
        }
    }
    keep_largest(&probs, spec.top_k.min(probs.len()), out);
    out.iter_mut().for_each(|(_, p)| *p *= scale);
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
