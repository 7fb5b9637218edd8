//! The CPU fast path of a decoder layer, when every matrix is one of
//! ferrox-kernels' packed ones: RMSNorm fused with the activation
//! quantisation, q/k/v written straight into contiguous sections with the
//! q/k norms and RoPE applied in place, the output and down projections
//! added onto the residual stream in place (through their post-norms where
//! the family has them), and SiLU-and-multiply fused with the down
//! projection's input quantisation. Scratch buffers are reused across
//! layers and steps, so a step allocates only the tensors candle hands on
//! (q/k/v, attention).
//!
//! LoRA adapters hook in after each targeted projection's base matmul (see
//! `crate::lora`): q/k/v before their biases, norms and RoPE, o and down
//! before their post-norms, gate and up before the activation.
//!
//! The op-by-op path (`decoder.rs` and each layer kind's forward) stays the
//! reference (and the path of every other device); the tests check the two
//! agree.

mod moe;
mod ops;

use std::sync::{Arc, Mutex};

use candle_core::Tensor;
use ferrox_kernels::{QActs, QMatrix};

use crate::error::Result;

type KernelResult = std::result::Result<(), ferrox_kernels::Error>;
use crate::ffn::mlp::Mlp;
use crate::layer::{Ffn, Layer, MixerWeights};
use crate::linear::Linear;
use crate::lora::LoraStep;
use crate::projection::Projection;
use crate::spec::{Activation, FeedForward, LayerSpec};

pub(crate) use moe::FusedMoe;

/// A step's adapters and the layer they are applied in (`None`: no row of
/// the step has an adapter).
pub(crate) type LoraAt<'a> = Option<(&'a LoraStep<'a>, usize)>;

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

/// Buffers every fused op reuses: quantised activations, the MLP's gate/up
/// output, a projection's output on its way through a post-norm, and a LoRA
/// update's f32 input (a normed residual, the MLP's activation).
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    acts: QActs,
    gate_up: Vec<f32>,
    out: Vec<f32>,
    lora_in: Vec<f32>,
    moe: moe::MoeScratch,
}

/// Matrices that read one input: one packed matrix holding every part's
/// rows, or one per part (parts of different quant types). Either way one
/// activation quantisation feeds them, and each part lands in its own
/// output section.
#[derive(Debug)]
pub(crate) enum Packed {
    /// One matrix; its rows split over the outputs in order.
    One(Arc<QMatrix>),
    /// A matrix per output section.
    Parts(Vec<Arc<QMatrix>>),
}

impl Packed {
    fn of(p: &Projection) -> Option<Self> {
        match p {
            Projection::Fused(Linear::Packed(w)) => Some(Packed::One(w.clone())),
            Projection::Split(parts) => parts
                .iter()
                .map(|l| match l {
                    Linear::Packed(w) => Some(w.clone()),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()
                .map(Packed::Parts),
            Projection::Fused(_) => None,
        }
    }

    fn cols(&self) -> usize {
        match self {
            Packed::One(w) => w.cols(),
            Packed::Parts(p) => p.first().map_or(0, |w| w.cols()),
        }
    }

    fn rows(&self) -> usize {
        match self {
            Packed::One(w) => w.rows(),
            Packed::Parts(p) => p.iter().map(|w| w.rows()).sum(),
        }
    }

    /// `acts @ W^T` into `outs`, section after section (one per part).
    fn matmul(&self, acts: &QActs, outs: &mut [&mut [f32]]) -> KernelResult {
        match self {
            Packed::One(w) => w.matmul_acts(acts, outs, false),
            Packed::Parts(parts) => {
                if parts.len() != outs.len() || parts.iter().any(|w| w.cols() != acts.cols()) {
                    return Err(ferrox_kernels::Error::Geometry(
                        "fused projection: parts and output sections differ",
                    ));
                }
                parts
                    .iter()
                    .zip(outs.iter_mut())
                    .try_for_each(|(w, out)| w.matmul_acts(acts, &mut [&mut **out], false))
            }
        }
    }
}

/// One layer's weights in the form the fused ops read: its feed-forward
/// always, its attention where that is plain q/k/v attention.
#[derive(Debug)]
pub(crate) struct FusedLayer {
    /// `None`: the layer's mixer runs op by op (latent attention, a
    /// recurrent layer, gated attention) and only its feed-forward here.
    attention: Option<FusedAttention>,
    ffn_norm: Option<Vec<f32>>,
    ffn: FusedFfn,
    post_ffn_norm: Option<Vec<f32>>,
}

/// A fused layer's attention half: its input norm, q/k/v with their
/// biases, norms and RoPE, and the output projection.
#[derive(Debug)]
pub(crate) struct FusedAttention {
    attn_norm: Option<Vec<f32>>,
    qkv: Packed,
    qkv_bias: Option<Vec<f32>>,
    qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    o: Arc<QMatrix>,
    o_bias: Option<Vec<f32>>,
    post_attn_norm: Option<Vec<f32>>,
    /// RoPE on q and k (false: a NoPE layer, as SmolLM3's every fourth).
    rotary: bool,
}

/// A fused layer's feed-forward.
#[derive(Debug)]
pub(crate) enum FusedFfn {
    /// One gated MLP (no biases).
    Dense {
        gate_up: Packed,
        act: Activation,
        down: Arc<QMatrix>,
    },
    /// A mixture of experts.
    Moe(Box<FusedMoe>),
}

/// A gated MLP's packed matrices and host biases.
#[derive(Debug)]
pub(crate) struct FusedMlp {
    gate_up: Packed,
    down: Arc<QMatrix>,
    gate_up_bias: Option<Vec<f32>>,
    down_bias: Option<Vec<f32>>,
}

impl FusedMlp {
    /// The fused form of `m`, if its matrices are packed.
    fn of(m: &Mlp) -> Result<Option<Self>> {
        let (Some(gate_up), Linear::Packed(down)) = (Packed::of(&m.gate_up), &m.down) else {
            return Ok(None);
        };
        Ok(Some(FusedMlp {
            gate_up,
            down: down.clone(),
            gate_up_bias: host_opt(&m.gate_up_bias)?,
            down_bias: host_opt(&m.down_bias)?,
        }))
    }
}

fn host_vec(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_dtype(candle_core::DType::F32)?.to_vec1::<f32>()?)
}

fn host_opt(t: &Option<Tensor>) -> Result<Option<Vec<f32>>> {
    t.as_ref().map(host_vec).transpose()
}

impl FusedAttention {
    /// The fused form of `l`'s mixer, if it is plain (ungated) q/k/v
    /// attention whose matrices are packed (CPU) ones.
    fn of(l: &Layer, spec: &LayerSpec) -> Result<Option<Self>> {
        let (MixerWeights::Attention(a), Some(attention)) = (&l.mixer, spec.attention()) else {
            return Ok(None);
        };
        // The fused q/k/v op has no output gate (Qwen3.5's), and makes and
        // keeps K and V the plain way.
        if attention.gated || attention.kv != crate::spec::KvLayout::default() {
            return Ok(None);
        }
        let (Some(qkv), Linear::Packed(o)) = (Packed::of(&a.qkv), &a.o) else {
            return Ok(None);
        };
        let qk_norm = match &a.qk_norm {
            Some((q, k)) => Some((host_vec(q)?, host_vec(k)?)),
            None => None,
        };
        Ok(Some(FusedAttention {
            attn_norm: host_opt(&l.norm)?,
            qkv,
            qkv_bias: host_opt(&a.qkv_bias)?,
            qk_norm,
            o: o.clone(),
            o_bias: host_opt(&a.o_bias)?,
            post_attn_norm: host_opt(&l.post_norm)?,
            rotary: !attention.nope,
        }))
    }

    /// `x` `(tokens, hidden)` -> a flat tensor `[q | k | v]`, each section
    /// `(tokens, dim)` row-major and contiguous, q and k normed and rotated
    /// by the RoPE rows `cos`, `sin`.
    pub(crate) fn qkv(
        &self,
        x: &Tensor,
        (cos, sin): (&Tensor, &Tensor),
        dims: Dims,
        lora: LoraAt<'_>,
        scratch: &Mutex<Scratch>,
    ) -> Result<Tensor> {
        let op = ops::QkvOp {
            layer: self,
            dims,
            lora,
            scratch,
        };
        Ok(x.apply_op3_no_bwd(cos, sin, &op)?)
    }

    /// `x += post_norm(o(attn))`, in place.
    pub(crate) fn attn_out(
        &self,
        x: &Tensor,
        attn: &Tensor,
        eps: f32,
        lora: LoraAt<'_>,
        scratch: &Mutex<Scratch>,
    ) -> Result<()> {
        let op = ops::ResidualOp {
            w: &self.o,
            bias: self.o_bias.as_deref(),
            post_norm: self.post_attn_norm.as_deref(),
            eps,
            lora,
            scratch,
        };
        Ok(x.inplace_op2(&attn.contiguous()?, &op)?)
    }
}

impl FusedLayer {
    /// The fused form of `l` (of spec `spec`), if it has a feed-forward
    /// whose matrices are packed (CPU) ones; its attention too where it
    /// can be ([`FusedAttention::of`]).
    pub(crate) fn from_layer(l: &Layer, spec: &LayerSpec) -> Result<Option<Self>> {
        let Some(f) = &l.ffn else {
            return Ok(None);
        };
        let ffn = match (&f.ffn, spec.ffn) {
            // The fused kernels have no exact (erf) GELU.
            (Ffn::Dense(_), FeedForward::Gated(Activation::Gelu)) => return Ok(None),
            (Ffn::Dense(m), FeedForward::Gated(act)) => match FusedMlp::of(m)? {
                Some(f) if f.gate_up_bias.is_none() && f.down_bias.is_none() => FusedFfn::Dense {
                    gate_up: f.gate_up,
                    act,
                    down: f.down,
                },
                _ => return Ok(None),
            },
            (Ffn::Moe(m), FeedForward::Moe(_)) => match FusedMoe::of(m)? {
                Some(f) => FusedFfn::Moe(Box::new(f)),
                None => return Ok(None),
            },
            _ => return Ok(None),
        };
        Ok(Some(FusedLayer {
            attention: FusedAttention::of(l, spec)?,
            ffn_norm: host_opt(&f.norm)?,
            ffn,
            post_ffn_norm: host_opt(&f.post_norm)?,
        }))
    }

    /// Its fused attention, where it has one.
    pub(crate) fn attention(&self) -> Option<&FusedAttention> {
        self.attention.as_ref()
    }

    /// `x += post_norm(ffn(h))` with `h = rms_norm(x)`, in place: the
    /// gated MLP (with its LoRA hook), or the mixture of experts (adapters
    /// never target experts: `LoraShapes` refuses them).
    pub(crate) fn mlp(
        &self,
        x: &Tensor,
        dims: Dims,
        lora: LoraAt<'_>,
        scratch: &Mutex<Scratch>,
    ) -> Result<()> {
        match &self.ffn {
            FusedFfn::Dense { gate_up, act, down } => {
                let op = ops::MlpOp {
                    layer: self,
                    mlp: (gate_up, *act, down),
                    dims,
                    lora,
                    scratch,
                };
                Ok(x.inplace_op1(&op)?)
            }
            FusedFfn::Moe(m) => {
                let op = moe::MoeOp {
                    moe: m,
                    norm: self.ffn_norm.as_deref(),
                    post_norm: self.post_ffn_norm.as_deref(),
                    eps: dims.eps,
                    scratch,
                };
                Ok(x.inplace_op1(&op)?)
            }
        }
    }
}

/// The final norm and the vocabulary projection, fused the same way.
#[derive(Debug)]
pub(crate) struct FusedHead {
    norm: Vec<f32>,
    w: Arc<QMatrix>,
    softcap: Option<f32>,
}

impl FusedHead {
    /// The fused head, if the output projection is packed; logits
    /// soft-capped by `softcap`.
    pub(crate) fn new(
        norm: &Tensor,
        lm_head: &Linear,
        softcap: Option<f32>,
    ) -> Result<Option<Self>> {
        let Linear::Packed(w) = lm_head else {
            return Ok(None);
        };
        Ok(Some(FusedHead {
            norm: host_vec(norm)?,
            w: w.clone(),
            softcap,
        }))
    }

    /// Logits `(rows, vocab)` of `x` `(rows, hidden)`.
    pub(crate) fn forward(&self, x: &Tensor, eps: f32, scratch: &Mutex<Scratch>) -> Result<Tensor> {
        Ok(x.contiguous()?.apply_op1_no_bwd(&ops::HeadOp {
            head: self,
            eps,
            scratch,
        })?)
    }
}
