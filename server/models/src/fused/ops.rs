//! The fused layer's steps as candle custom ops on CPU storage.

use std::sync::{Mutex, MutexGuard};

use candle_core::{CpuStorage, CustomOp1, CustomOp3, InplaceOp1, InplaceOp2, Layout, Shape};
use ferrox_kernels::{QActs, QMatrix};

use super::{Dims, FusedAttention, FusedHead, FusedLayer, LoraAt, Packed, Scratch};
use crate::lora::Target;
use crate::rope::Rope;
use crate::spec::Activation;

pub(super) fn lock(s: &Mutex<Scratch>) -> MutexGuard<'_, Scratch> {
    // A panic mid-op leaves only stale numbers behind, which every op overwrites.
    s.lock().unwrap_or_else(|e| e.into_inner())
}

fn slice<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> candle_core::Result<&'a [f32]> {
    let CpuStorage::F32(data) = s else {
        candle_core::bail!("fused layer: {what} must be f32");
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&data[a..b]),
        None => candle_core::bail!("fused layer: {what} must be contiguous"),
    }
}

pub(super) fn slice_mut<'a>(
    s: &'a mut CpuStorage,
    l: &Layout,
    what: &str,
) -> candle_core::Result<&'a mut [f32]> {
    let CpuStorage::F32(data) = s else {
        candle_core::bail!("fused layer: {what} must be f32");
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&mut data[a..b]),
        None => candle_core::bail!("fused layer: {what} must be contiguous"),
    }
}

pub(super) fn kernel_err(e: ferrox_kernels::Error) -> candle_core::Error {
    candle_core::Error::Msg(e.to_string())
}

/// The LoRA hook on host slices: `out += ` the update of `target` for `x`'s
/// rows (nothing without adapters).
fn lora_add(
    lora: LoraAt<'_>,
    target: Target,
    x: &[f32],
    out: &mut [f32],
) -> candle_core::Result<()> {
    match lora {
        Some((step, layer)) => step
            .apply(target, layer, x, out)
            .map_err(|e| candle_core::Error::Msg(e.to_string())),
        None => Ok(()),
    }
}

/// `rms_norm(x) * w` row by row into `out` (a LoRA update's input: what the
/// quantised path normed on its way into the matmul); `x` itself where the
/// block has no input norm (OLMo 2).
fn normed_into(x: &[f32], w: Option<&[f32]>, eps: f32, out: &mut Vec<f32>) {
    out.clear();
    out.extend_from_slice(x);
    if let Some(w) = w {
        rms_norm_rows(out, w, eps);
    }
}

/// Quantises `rows` rows of `x` into `acts`, through the block's input
/// norm where it has one.
fn quantize_input(
    acts: &mut QActs,
    x: &[f32],
    rows: usize,
    norm: Option<&[f32]>,
    eps: f32,
) -> candle_core::Result<()> {
    match norm {
        Some(w) => acts.quantize_rms_norm(x, rows, w, eps),
        None => acts.quantize(x, rows),
    }
    .map_err(kernel_err)
}

/// Rows of a `(rows, cols)` input, checked against the weights' width.
pub(super) fn rows_of(l: &Layout, cols: usize, what: &str) -> candle_core::Result<usize> {
    let (rows, c) = l.shape().dims2()?;
    if c != cols {
        candle_core::bail!("fused layer: {what} has width {c}, weights expect {cols}");
    }
    Ok(rows)
}

/// RMSNorm of every `w.len()`-long row of `x` in place, as candle's
/// `rms_norm` computes it.
pub(super) fn rms_norm_rows(x: &mut [f32], w: &[f32], eps: f32) {
    for row in x.chunks_exact_mut(w.len()) {
        let sum2: f32 = row.iter().map(|&v| v * v).sum();
        let rms = (sum2 / w.len() as f32 + eps).sqrt();
        for (v, &g) in row.iter_mut().zip(w) {
            *v = *v / rms * g;
        }
    }
}

/// GELU (tanh approximation) of `gate` times `up`, into `gate`, as candle's
/// `gelu(gate) * up`.
fn gelu_mul(gate: &mut [f32], up: &[f32]) {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let inner = SQRT_2_OVER_PI * x * (1.0 + 0.044_715 * x * x);
        *g = 0.5 * x * (1.0 + inner.tanh()) * u;
    }
}

/// gpt-oss's clamped SwiGLU of `gate` and `up`, into `gate`, as the
/// op-by-op path computes it.
fn swiglu_oai(gate: &mut [f32], up: &[f32], alpha: f32, limit: f32) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = g.min(limit);
        let u = u.clamp(-limit, limit);
        *g = (u + 1.0) * (x * (1.0 / (1.0 + (-(x * alpha)).exp())));
    }
}

/// `act(gate) * up` (each `tokens` rows) quantised into `acts`; `gate` is
/// scratch afterwards.
pub(super) fn quantize_activation(
    act: Activation,
    acts: &mut QActs,
    (gate, up): (&mut [f32], &[f32]),
    tokens: usize,
) -> candle_core::Result<()> {
    if act == Activation::Gelu {
        // `FusedLayer::from_layer` never fuses a layer of it.
        return Err(candle_core::Error::Msg(
            "the fused path has no exact GELU".into(),
        ));
    }
    match act {
        Activation::Silu => acts.quantize_silu_mul(gate, up, tokens),
        Activation::GeluTanh => {
            gelu_mul(gate, up);
            acts.quantize(gate, tokens)
        }
        Activation::SwigluOai { alpha, limit } => {
            swiglu_oai(gate, up, alpha, limit);
            acts.quantize(gate, tokens)
        }
        Activation::Relu2 => {
            for (g, &u) in gate.iter_mut().zip(up) {
                let r = g.max(0.0);
                *g = r * r * u;
            }
            acts.quantize(gate, tokens)
        }
        Activation::Gelu => acts.quantize(gate, tokens),
    }
    .map_err(kernel_err)
}

pub(super) struct QkvOp<'a> {
    pub(super) layer: &'a FusedAttention,
    pub(super) dims: Dims,
    pub(super) lora: LoraAt<'a>,
    pub(super) scratch: &'a Mutex<Scratch>,
}

impl QkvOp<'_> {
    /// Biases, q/k norms and RoPE on the projected sections.
    fn finish(&self, (q, k, v): (&mut [f32], &mut [f32], &mut [f32]), cos: &[f32], sin: &[f32]) {
        let (l, d) = (self.layer, self.dims);
        if let Some(bias) = &l.qkv_bias {
            let (bq, rest) = bias.split_at(d.q_dim());
            let (bk, bv) = rest.split_at(d.kv_dim());
            for (sec, b) in [(&mut *q, bq), (&mut *k, bk), (&mut *v, bv)] {
                for row in sec.chunks_exact_mut(b.len()) {
                    row.iter_mut().zip(b).for_each(|(x, b)| *x += b);
                }
            }
        }
        if let Some((qn, kn)) = &l.qk_norm {
            rms_norm_rows(q, qn, d.eps);
            rms_norm_rows(k, kn, d.eps);
        }
        if l.rotary {
            Rope::apply_in_place(q, d.heads, d.head_dim, cos, sin);
            Rope::apply_in_place(k, d.kv_heads, d.head_dim, cos, sin);
        }
    }
}

impl CustomOp3 for QkvOp<'_> {
    fn name(&self) -> &'static str {
        "ferrox-fused-qkv"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (l, d) = (self.layer, self.dims);
        let tokens = rows_of(l1, l.qkv.cols(), "input")?;
        let (x, cos, sin) = (
            slice(s1, l1, "x")?,
            slice(s2, l2, "cos")?,
            slice(s3, l3, "sin")?,
        );
        let (q_dim, kv_dim) = (d.q_dim(), d.kv_dim());
        let half = cos.len() / tokens.max(1);
        if l.qkv.rows() != q_dim + 2 * kv_dim
            || cos.len() != tokens * half
            || 2 * half > d.head_dim
            || sin.len() != cos.len()
        {
            candle_core::bail!("fused qkv: weights or RoPE tables do not match the heads");
        }
        let mut out = vec![0f32; tokens * l.qkv.rows()];
        {
            let mut guard = lock(self.scratch);
            let s = &mut *guard;
            quantize_input(&mut s.acts, x, tokens, l.attn_norm.as_deref(), d.eps)?;
            let (q, rest) = out.split_at_mut(tokens * q_dim);
            let (k, v) = rest.split_at_mut(tokens * kv_dim);
            l.qkv
                .matmul(&s.acts, &mut [&mut *q, &mut *k, &mut *v])
                .map_err(kernel_err)?;
            // LoRA hook: onto the projections, before biases, norms and RoPE.
            if self.lora.is_some() {
                normed_into(x, l.attn_norm.as_deref(), d.eps, &mut s.lora_in);
                for (t, sec) in [(Target::Q, q), (Target::K, k), (Target::V, v)] {
                    lora_add(self.lora, t, &s.lora_in, sec)?;
                }
            }
        }
        let (q, rest) = out.split_at_mut(tokens * q_dim);
        let (k, v) = rest.split_at_mut(tokens * kv_dim);
        self.finish((q, k, v), cos, sin);
        let len = out.len();
        Ok((CpuStorage::F32(out), Shape::from(len)))
    }
}

/// A projection added onto the residual: its weights, bias and post-norm
/// (with the norms' epsilon), and its LoRA hook (the target).
struct Residual<'a> {
    w: &'a QMatrix,
    bias: Option<&'a [f32]>,
    post_norm: Option<&'a [f32]>,
    eps: f32,
    lora: LoraAt<'a>,
    target: Target,
}

impl Residual<'_> {
    /// `w @ acts` (plus the LoRA update of `input`) added onto `dst`, in
    /// place; in the op-by-op path's order: the bias, the post-norm, then
    /// the residual.
    fn add(
        &self,
        acts: &QActs,
        out: &mut Vec<f32>,
        input: &[f32],
        dst: &mut [f32],
    ) -> candle_core::Result<()> {
        if self.bias.is_none() && self.post_norm.is_none() {
            self.w
                .matmul_acts(acts, &mut [&mut *dst], true)
                .map_err(kernel_err)?;
            return lora_add(self.lora, self.target, input, dst);
        }
        out.resize(dst.len(), 0.0);
        self.w
            .matmul_acts(acts, &mut [&mut *out], false)
            .map_err(kernel_err)?;
        lora_add(self.lora, self.target, input, out)?;
        if let Some(b) = self.bias {
            for row in out.chunks_exact_mut(b.len()) {
                row.iter_mut().zip(b).for_each(|(x, b)| *x += b);
            }
        }
        if let Some(norm) = self.post_norm {
            rms_norm_rows(out, norm, self.eps);
        }
        dst.iter_mut().zip(out.iter()).for_each(|(x, o)| *x += o);
        Ok(())
    }
}

pub(super) struct ResidualOp<'a> {
    pub(super) w: &'a QMatrix,
    pub(super) bias: Option<&'a [f32]>,
    pub(super) post_norm: Option<&'a [f32]>,
    pub(super) eps: f32,
    pub(super) lora: LoraAt<'a>,
    pub(super) scratch: &'a Mutex<Scratch>,
}

impl InplaceOp2 for ResidualOp<'_> {
    fn name(&self) -> &'static str {
        "ferrox-fused-residual"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dst_l: &Layout,
        src: &CpuStorage,
        src_l: &Layout,
    ) -> candle_core::Result<()> {
        let tokens = rows_of(src_l, self.w.cols(), "attention output")?;
        if rows_of(dst_l, self.w.rows(), "residual")? != tokens {
            candle_core::bail!("fused residual: row counts differ");
        }
        let a = slice(src, src_l, "attention output")?;
        let x = slice_mut(dst, dst_l, "residual")?;
        let mut guard = lock(self.scratch);
        let s = &mut *guard;
        s.acts.quantize(a, tokens).map_err(kernel_err)?;
        let residual = Residual {
            w: self.w,
            bias: self.bias,
            post_norm: self.post_norm,
            eps: self.eps,
            lora: self.lora,
            target: Target::O,
        };
        residual.add(&s.acts, &mut s.out, a, x)
    }
}

pub(super) struct MlpOp<'a> {
    pub(super) layer: &'a FusedLayer,
    /// `(gate_up, activation, down)`.
    pub(super) mlp: (&'a Packed, Activation, &'a QMatrix),
    pub(super) dims: Dims,
    pub(super) lora: LoraAt<'a>,
    pub(super) scratch: &'a Mutex<Scratch>,
}

impl InplaceOp1 for MlpOp<'_> {
    fn name(&self) -> &'static str {
        "ferrox-fused-mlp"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let (l, (gate_up, act, down)) = (self.layer, self.mlp);
        let inter = self.dims.intermediate;
        let tokens = rows_of(layout, gate_up.cols(), "residual")?;
        if gate_up.rows() != 2 * inter || down.cols() != inter {
            candle_core::bail!("fused mlp: weights do not match the intermediate size");
        }
        let x = slice_mut(storage, layout, "residual")?;
        let mut guard = lock(self.scratch);
        let s = &mut *guard;
        quantize_input(&mut s.acts, x, tokens, l.ffn_norm.as_deref(), self.dims.eps)?;
        s.gate_up.resize(tokens * 2 * inter, 0.0);
        let (gate, up) = s.gate_up.split_at_mut(tokens * inter);
        gate_up
            .matmul(&s.acts, &mut [&mut *gate, &mut *up])
            .map_err(kernel_err)?;
        // LoRA hook: gate and up before the activation (down below).
        if self.lora.is_some() {
            normed_into(x, l.ffn_norm.as_deref(), self.dims.eps, &mut s.lora_in);
            lora_add(self.lora, Target::Gate, &s.lora_in, gate)?;
            lora_add(self.lora, Target::Up, &s.lora_in, up)?;
        }
        // Down's update reads `act(gate) * up`: left in `gate` by every
        // activation but SiLU, whose product is fused with the
        // quantisation, so it is computed apart first.
        let silu = matches!(act, Activation::Silu);
        if self.lora.is_some() && silu {
            s.lora_in.clear();
            let act = gate.iter().zip(up.iter());
            s.lora_in
                .extend(act.map(|(&g, &u)| g / (1.0 + (-g).exp()) * u));
        }
        quantize_activation(act, &mut s.acts, (gate, up), tokens)?;
        if self.lora.is_some() && !silu {
            s.lora_in.clear();
            s.lora_in.extend_from_slice(gate);
        }
        let residual = Residual {
            w: down,
            bias: None,
            post_norm: l.post_ffn_norm.as_deref(),
            eps: self.dims.eps,
            lora: self.lora,
            target: Target::Down,
        };
        residual.add(&s.acts, &mut s.out, &s.lora_in, x)
    }
}

pub(super) struct HeadOp<'a> {
    pub(super) head: &'a FusedHead,
    pub(super) eps: f32,
    pub(super) scratch: &'a Mutex<Scratch>,
}

impl CustomOp1 for HeadOp<'_> {
    fn name(&self) -> &'static str {
        "ferrox-fused-head"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let w = &self.head.w;
        let rows = rows_of(l, w.cols(), "final hidden state")?;
        let x = slice(s, l, "final hidden state")?;
        let mut out = vec![0f32; rows * w.rows()];
        let mut sc = lock(self.scratch);
        sc.acts
            .quantize_rms_norm(x, rows, &self.head.norm, self.eps)
            .map_err(kernel_err)?;
        w.matmul_acts(&sc.acts, &mut [&mut out], false)
            .map_err(kernel_err)?;
        if let Some(cap) = self.head.softcap {
            out.iter_mut().for_each(|x| *x = (*x / cap).tanh() * cap);
        }
        Ok((CpuStorage::F32(out), Shape::from((rows, w.rows()))))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::*;

    #[test]
    fn row_norm_and_gelu_match_candle() {
        let x: Vec<f32> = (0..24).map(|i| (i as f32 * 0.7).sin() * 3.0).collect();
        let w: Vec<f32> = (0..8).map(|i| 0.5 + i as f32 * 0.1).collect();
        let t = Tensor::from_vec(x.clone(), (3, 8), &Device::Cpu).unwrap();
        let wt = Tensor::new(w.as_slice(), &Device::Cpu).unwrap();
        let want = candle_nn::ops::rms_norm(&t, &wt, 1e-6).unwrap();
        let want = want.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let mut got = x.clone();
        rms_norm_rows(&mut got, &w, 1e-6);
        let diff = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(diff < 1e-5, "{diff}");
        let up: Vec<f32> = x.iter().map(|v| v * 0.5 + 1.0).collect();
        let want = (t.gelu().unwrap()
            * Tensor::from_vec(up.clone(), (3, 8), &Device::Cpu).unwrap())
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
        let mut got = x;
        gelu_mul(&mut got, &up);
        let diff = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(diff < 1e-5, "{diff}");
    }
}
