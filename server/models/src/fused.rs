//! The CPU fast path of a decoder layer, when every matrix is one of
//! ferrox-kernels' packed ones: RMSNorm fused with the activation
//! quantisation, q/k/v written straight into contiguous sections with RoPE
//! applied in place, the output and down projections added onto the residual
//! stream in place, and SiLU-and-multiply fused with the down projection's
//! input quantisation. Scratch buffers are reused across layers and steps,
//! so a step allocates only the tensors candle hands on (q/k/v, attention).
//!
//! The op-by-op path in `llama.rs` stays the reference (and the path of
//! every other device); the tests check the two agree.

use std::sync::{Arc, Mutex, MutexGuard};

use candle_core::{
    CpuStorage, CustomOp1, CustomOp3, InplaceOp1, InplaceOp2, Layout, Shape, Tensor,
};
use ferrox_kernels::{QActs, QMatrix};

use crate::error::Result;
use crate::layer::{Layer, Projection};
use crate::linear::Linear;
use crate::rope::Rope;

/// Head and MLP sizes the fused ops need.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dims {
    pub(crate) heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) intermediate: usize,
    pub(crate) eps: f32,
}

impl Dims {
    fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

/// Buffers every fused op reuses: quantised activations and the MLP's
/// gate/up output.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    acts: QActs,
    gate_up: Vec<f32>,
}

/// One layer's weights in the form the fused ops read.
#[derive(Debug)]
pub(crate) struct FusedLayer {
    attn_norm: Vec<f32>,
    qkv: Packed,
    qkv_bias: Option<Vec<f32>>,
    o: Arc<QMatrix>,
    ffn_norm: Vec<f32>,
    gate_up: Packed,
    down: Arc<QMatrix>,
}

/// Packed matrices that read one input: one matrix holding every part's
/// rows, or one matrix per part where their block types differ (a Q4_K_M
/// file's q and k in Q4_K beside v in Q6_K). Either way the input is
/// quantised once.
#[derive(Debug)]
struct Packed(Vec<Arc<QMatrix>>);

impl Packed {
    fn of(p: &Projection) -> Option<Self> {
        let parts = match p {
            Projection::Fused(l) => std::slice::from_ref(l),
            Projection::Split(parts) => parts.as_slice(),
        };
        let packed = parts.iter().map(|l| match l {
            Linear::Packed(w) => Some(w.clone()),
            _ => None,
        });
        packed.collect::<Option<Vec<_>>>().map(Packed)
    }

    /// Input features.
    fn cols(&self) -> usize {
        self.0.first().map_or(0, |w| w.cols())
    }

    /// Output features, all parts together.
    fn rows(&self) -> usize {
        self.0.iter().map(|w| w.rows()).sum()
    }

    /// The product written into `sections` (`[tokens][width]` each, widths
    /// summing to `rows`): one call over every section for a single matrix,
    /// else each part's matrix into its own section.
    fn matmul(&self, acts: &QActs, sections: &mut [&mut [f32]]) -> candle_core::Result<()> {
        match self.0.as_slice() {
            [w] => w.matmul_acts(acts, sections, false).map_err(kernel_err),
            parts if parts.len() == sections.len() => {
                for (w, out) in parts.iter().zip(sections.iter_mut()) {
                    w.matmul_acts(acts, &mut [&mut **out], false)
                        .map_err(kernel_err)?;
                }
                Ok(())
            }
            parts => candle_core::bail!(
                "fused layer: {} matrices for {} output sections",
                parts.len(),
                sections.len()
            ),
        }
    }
}

fn host_vec(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_dtype(candle_core::DType::F32)?.to_vec1::<f32>()?)
}

impl FusedLayer {
    /// The fused form of `l`, if all its matrices are packed (CPU) ones.
    pub(crate) fn from_layer(l: &Layer) -> Result<Option<Self>> {
        let (Some(qkv), Some(gate_up)) = (Packed::of(&l.qkv), Packed::of(&l.gate_up)) else {
            return Ok(None);
        };
        let (Linear::Packed(o), Linear::Packed(down)) = (&l.o, &l.down) else {
            return Ok(None);
        };
        Ok(Some(FusedLayer {
            attn_norm: host_vec(&l.attn_norm)?,
            qkv,
            qkv_bias: l.qkv_bias.as_ref().map(host_vec).transpose()?,
            o: o.clone(),
            ffn_norm: host_vec(&l.ffn_norm)?,
            gate_up,
            down: down.clone(),
        }))
    }

    /// `x` `(tokens, hidden)` -> a flat tensor `[q | k | v]`, each section
    /// `(tokens, dim)` row-major and contiguous, q and k rotated.
    pub(crate) fn qkv(
        &self,
        x: &Tensor,
        (cos, sin): (&Tensor, &Tensor),
        dims: Dims,
        scratch: &Mutex<Scratch>,
    ) -> Result<Tensor> {
        let op = QkvOp {
            layer: self,
            dims,
            scratch,
        };
        Ok(x.apply_op3_no_bwd(cos, sin, &op)?)
    }

    /// `x += o(attn)`, in place.
    pub(crate) fn attn_out(
        &self,
        x: &Tensor,
        attn: &Tensor,
        scratch: &Mutex<Scratch>,
    ) -> Result<()> {
        let op = ResidualOp {
            w: &self.o,
            scratch,
        };
        Ok(x.inplace_op2(&attn.contiguous()?, &op)?)
    }

    /// `x += down(silu(gate(h)) * up(h))` with `h = rms_norm(x)`, in place.
    pub(crate) fn mlp(&self, x: &Tensor, dims: Dims, scratch: &Mutex<Scratch>) -> Result<()> {
        let op = MlpOp {
            layer: self,
            dims,
            scratch,
        };
        Ok(x.inplace_op1(&op)?)
    }
}

/// The final norm and the vocabulary projection, fused the same way.
#[derive(Debug)]
pub(crate) struct FusedHead {
    norm: Vec<f32>,
    w: Arc<QMatrix>,
}

impl FusedHead {
    /// The fused head, if the output projection is packed.
    pub(crate) fn new(norm: &Tensor, lm_head: &Linear) -> Result<Option<Self>> {
        let Linear::Packed(w) = lm_head else {
            return Ok(None);
        };
        Ok(Some(FusedHead {
            norm: host_vec(norm)?,
            w: w.clone(),
        }))
    }

    /// Logits `(rows, vocab)` of `x` `(rows, hidden)`.
    pub(crate) fn forward(&self, x: &Tensor, eps: f32, scratch: &Mutex<Scratch>) -> Result<Tensor> {
        Ok(x.contiguous()?.apply_op1_no_bwd(&HeadOp {
            head: self,
            eps,
            scratch,
        })?)
    }
}

fn lock(s: &Mutex<Scratch>) -> MutexGuard<'_, Scratch> {
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

fn slice_mut<'a>(
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

fn kernel_err(e: ferrox_kernels::Error) -> candle_core::Error {
    candle_core::Error::Msg(e.to_string())
}

/// Rows of a `(rows, cols)` input, checked against the weights' width.
fn rows_of(l: &Layout, cols: usize, what: &str) -> candle_core::Result<usize> {
    let (rows, c) = l.shape().dims2()?;
    if c != cols {
        candle_core::bail!("fused layer: {what} has width {c}, weights expect {cols}");
    }
    Ok(rows)
}

struct QkvOp<'a> {
    layer: &'a FusedLayer,
    dims: Dims,
    scratch: &'a Mutex<Scratch>,
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
        if l.qkv.rows() != q_dim + 2 * kv_dim || cos.len() != tokens * d.head_dim / 2 {
            candle_core::bail!("fused qkv: weights or RoPE tables do not match the heads");
        }
        let mut out = vec![0f32; tokens * l.qkv.rows()];
        {
            let mut s = lock(self.scratch);
            s.acts
                .quantize_rms_norm(x, tokens, &l.attn_norm, d.eps)
                .map_err(kernel_err)?;
            let (q, rest) = out.split_at_mut(tokens * q_dim);
            let (k, v) = rest.split_at_mut(tokens * kv_dim);
            l.qkv.matmul(&s.acts, &mut [q, k, v])?;
        }
        let (q, rest) = out.split_at_mut(tokens * q_dim);
        let (k, v) = rest.split_at_mut(tokens * kv_dim);
        if let Some(bias) = &l.qkv_bias {
            let (bq, rest) = bias.split_at(q_dim);
            let (bk, bv) = rest.split_at(kv_dim);
            for (sec, b) in [(&mut *q, bq), (&mut *k, bk), (&mut *v, bv)] {
                for row in sec.chunks_exact_mut(b.len()) {
                    row.iter_mut().zip(b).for_each(|(x, b)| *x += b);
                }
            }
        }
        Rope::apply_in_place(q, d.heads, d.head_dim, cos, sin);
        Rope::apply_in_place(k, d.kv_heads, d.head_dim, cos, sin);
        let len = out.len();
        Ok((CpuStorage::F32(out), Shape::from(len)))
    }
}

struct ResidualOp<'a> {
    w: &'a QMatrix,
    scratch: &'a Mutex<Scratch>,
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
        let mut s = lock(self.scratch);
        s.acts.quantize(a, tokens).map_err(kernel_err)?;
        self.w
            .matmul_acts(&s.acts, &mut [x], true)
            .map_err(kernel_err)
    }
}

struct MlpOp<'a> {
    layer: &'a FusedLayer,
    dims: Dims,
    scratch: &'a Mutex<Scratch>,
}

impl InplaceOp1 for MlpOp<'_> {
    fn name(&self) -> &'static str {
        "ferrox-fused-mlp"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let l = self.layer;
        let inter = self.dims.intermediate;
        let tokens = rows_of(layout, l.gate_up.cols(), "residual")?;
        if l.gate_up.rows() != 2 * inter || l.down.cols() != inter {
            candle_core::bail!("fused mlp: weights do not match the intermediate size");
        }
        let x = slice_mut(storage, layout, "residual")?;
        let mut guard = lock(self.scratch);
        let s = &mut *guard;
        s.acts
            .quantize_rms_norm(x, tokens, &l.ffn_norm, self.dims.eps)
            .map_err(kernel_err)?;
        s.gate_up.resize(tokens * 2 * inter, 0.0);
        let (gate, up) = s.gate_up.split_at_mut(tokens * inter);
        l.gate_up.matmul(&s.acts, &mut [&mut *gate, &mut *up])?;
        s.acts
            .quantize_silu_mul(gate, up, tokens)
            .map_err(kernel_err)?;
        l.down
            .matmul_acts(&s.acts, &mut [x], true)
            .map_err(kernel_err)
    }
}

struct HeadOp<'a> {
    head: &'a FusedHead,
    eps: f32,
    scratch: &'a Mutex<Scratch>,
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
        Ok((CpuStorage::F32(out), Shape::from((rows, w.rows()))))
    }
}
