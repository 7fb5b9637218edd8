//! The fused CPU mixture of experts: the step's normed activations
//! quantised once, every token routed, then each chosen expert once over
//! the tokens that chose it (their quantised rows gathered, one matmul a
//! projection), its outputs weighted into each token's sum as it finishes
//! (experts in ascending order, as the op-by-op path adds them, so a
//! token's sum never depends on the batch). Experts no token chose are
//! not touched.

use std::sync::{Arc, Mutex};

use candle_core::{CpuStorage, InplaceOp1, Layout, Tensor};
use ferrox_kernels::QActs;

use super::ops::{kernel_err, lock, quantize_activation, rms_norm_rows, rows_of, slice_mut};
use super::{FusedMlp, Scratch, host_opt};
use crate::error::Result;
use crate::ffn::moe::dispatch::Dispatch;
use crate::ffn::moe::reads::ExpertReads;
use crate::ffn::moe::route::{on_host, router_logits, shared_gate};
use crate::ffn::moe::weights::MoeWeights;
use crate::spec::{Activation, MoeSpec};

/// One mixture-of-experts layer in the form the fused op reads.
#[derive(Debug)]
pub(crate) struct FusedMoe {
    spec: MoeSpec,
    /// The router `[experts, hidden]`, f32 (the layer's own tensor).
    router: Tensor,
    router_bias: Option<Vec<f32>>,
    correction: Option<Vec<f32>>,
    experts: Vec<FusedMlp>,
    /// The shared expert and its gate `[hidden]` where it has one.
    shared: Option<(FusedMlp, Option<Vec<f32>>)>,
    reads: Arc<ExpertReads>,
}

/// The op's buffers, kept between steps.
#[derive(Debug, Default)]
pub(crate) struct MoeScratch {
    normed: Vec<f32>,
    logits: Vec<f32>,
    /// One expert's gathered activations, then its activation's.
    rows: QActs,
    gate_up: Vec<f32>,
    out: Vec<f32>,
    /// Each token's weighted sum of its experts' outputs so far.
    acc: Vec<f32>,
    /// One expert's rows scaled by their weights, before quantising
    /// (Llama 4's experts are weighted on the way in).
    scaled: Vec<f32>,
}

impl FusedMoe {
    /// The fused form of `m`, if every expert's matrices are packed.
    pub(crate) fn of(m: &MoeWeights) -> Result<Option<Self>> {
        // Its kernels run gated experts only.
        if !m.spec.gated {
            return Ok(None);
        }
        let router = m.router.to_dtype(candle_core::DType::F32)?.contiguous()?;
        let mut experts = Vec::with_capacity(m.experts.len());
        for e in &m.experts {
            match FusedMlp::of(e)? {
                Some(f) => experts.push(f),
                None => return Ok(None),
            }
        }
        let shared = match &m.shared {
            Some((mlp, gate)) => match FusedMlp::of(mlp)? {
                Some(f) => Some((f, host_opt(gate)?)),
                None => return Ok(None),
            },
            None => None,
        };
        Ok(Some(FusedMoe {
            spec: m.spec,
            router,
            router_bias: host_opt(&m.router_bias)?,
            correction: host_opt(&m.correction)?,
            experts,
            shared,
            reads: m.reads.clone(),
        }))
    }

    /// Router logits of the normed rows, `[token][expert]`.
    fn logits(&self, normed: &[f32], hidden: usize, out: &mut Vec<f32>) -> Result<()> {
        let bias = self.router_bias.as_deref();
        on_host(&self.router, |r| {
            router_logits(normed, hidden, r, bias, out)
        })
    }
}

/// One gated MLP of width `inter` over the quantised rows in `s.rows`,
/// into `s.out` (`rows x hidden`); `s.rows` is scratch afterwards.
fn run_mlp(
    m: &FusedMlp,
    inter: usize,
    act: Activation,
    s: &mut MoeScratch,
) -> candle_core::Result<()> {
    let n = s.rows.batch();
    s.gate_up.resize(n * 2 * inter, 0.0);
    let (gate, up) = s.gate_up.split_at_mut(n * inter);
    m.gate_up
        .matmul(&s.rows, &mut [&mut *gate, &mut *up])
        .map_err(kernel_err)?;
    if let Some(b) = &m.gate_up_bias {
        let (bg, bu) = b.split_at(inter);
        for (sec, b) in [(&mut *gate, bg), (&mut *up, bu)] {
            for row in sec.chunks_exact_mut(inter) {
                row.iter_mut().zip(b).for_each(|(x, b)| *x += b);
            }
        }
    }
    quantize_activation(act, &mut s.rows, (gate, up), n)?;
    s.out.resize(n * m.down.rows(), 0.0);
    m.down
        .matmul_acts(&s.rows, &mut [&mut s.out], false)
        .map_err(kernel_err)?;
    if let Some(b) = &m.down_bias {
        for row in s.out.chunks_exact_mut(b.len()) {
            row.iter_mut().zip(b).for_each(|(x, b)| *x += b);
        }
    }
    Ok(())
}

pub(super) struct MoeOp<'a> {
    pub(super) moe: &'a FusedMoe,
    /// The input norm, where the block has one.
    pub(super) norm: Option<&'a [f32]>,
    pub(super) post_norm: Option<&'a [f32]>,
    pub(super) eps: f32,
    pub(super) scratch: &'a Mutex<Scratch>,
}

impl MoeOp<'_> {
    /// Every chosen expert over its tokens, in ascending order, each
    /// output weighted into its token's sum in `s.acc`.
    fn experts(
        &self,
        d: &Dispatch,
        (acts, hidden): (&QActs, usize),
        s: &mut MoeScratch,
    ) -> candle_core::Result<()> {
        let m = self.moe;
        s.acc.clear();
        s.acc.resize(d.tokens() * hidden, 0.0);
        let mut rows = Vec::new();
        for (e, cells) in d.active() {
            m.reads.record(e);
            if m.spec.weights_input() {
                s.scaled.clear();
                for &c in cells {
                    let (row, w) = (&s.normed[d.token(c) * hidden..][..hidden], d.weight(c));
                    s.scaled.extend(row.iter().map(|v| v * w));
                }
                s.rows
                    .quantize(&s.scaled, cells.len())
                    .map_err(kernel_err)?;
            } else {
                rows.clear();
                rows.extend(cells.iter().map(|&c| d.token(c)));
                s.rows.gather(acts, &rows).map_err(kernel_err)?;
            }
            run_mlp(&m.experts[e], m.spec.intermediate, m.spec.activation, s)?;
            for (&c, y) in cells.iter().zip(s.out.chunks_exact(hidden)) {
                // An input-weighted expert's output is already weighted.
                let w = if m.spec.weights_input() {
                    1.0
                } else {
                    d.weight(c)
                };
                let o = &mut s.acc[d.token(c) * hidden..][..hidden];
                o.iter_mut().zip(y).for_each(|(o, y)| *o += y * w);
            }
        }
        Ok(())
    }
}

impl InplaceOp1 for MoeOp<'_> {
    fn name(&self) -> &'static str {
        "ferrox-fused-moe"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let (m, (_, hidden)) = (self.moe, layout.shape().dims2()?);
        let tokens = rows_of(layout, hidden, "residual")?;
        if m.router.dims() != [m.spec.experts, hidden] || m.experts.len() != m.spec.experts {
            candle_core::bail!("fused moe: router or experts do not match the layer");
        }
        let x = slice_mut(storage, layout, "residual")?;
        let mut guard = lock(self.scratch);
        let sc = &mut *guard;
        let s = &mut sc.moe;
        s.normed.clear();
        s.normed.extend_from_slice(x);
        if let Some(w) = self.norm {
            rms_norm_rows(&mut s.normed, w, self.eps);
        }
        sc.acts.quantize(&s.normed, tokens).map_err(kernel_err)?;
        m.logits(&s.normed, hidden, &mut s.logits)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        let d = Dispatch::new(&m.spec, &s.logits, m.correction.as_deref());
        self.experts(&d, (&sc.acts, hidden), s)?;
        std::mem::swap(&mut s.out, &mut s.acc);
        if let (Some((mlp, gate)), Some(width)) = (&m.shared, m.spec.shared) {
            let moe_out = std::mem::take(&mut s.out);
            s.rows
                .gather(&sc.acts, &(0..tokens).collect::<Vec<_>>())
                .map_err(kernel_err)?;
            run_mlp(mlp, width, m.spec.activation, s)?;
            let shared = std::mem::replace(&mut s.out, moe_out);
            for ((o, y), h) in s
                .out
                .chunks_exact_mut(hidden)
                .zip(shared.chunks_exact(hidden))
                .zip(s.normed.chunks_exact(hidden))
            {
                let g = gate.as_ref().map_or(1.0, |g| shared_gate(h, g));
                o.iter_mut().zip(y).for_each(|(o, y)| *o += y * g);
            }
        }
        if let Some(w) = self.post_norm {
            rms_norm_rows(&mut s.out, w, self.eps);
        }
        x.iter_mut().zip(&s.out).for_each(|(x, o)| *x += o);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::*;
    use crate::fixtures::{random_moe, random_values};
    use crate::spec::Routing;

    /// The fused op and the op-by-op forward of one layer on one input.
    fn both(spec: MoeSpec, tokens: usize) -> (Vec<f32>, Vec<f32>, Vec<u64>) {
        let hidden = 64;
        let w = random_moe(spec, hidden, 7);
        let d = Device::Cpu;
        let x =
            Tensor::from_vec(random_values(tokens * hidden, 3, 2.0), (tokens, hidden), &d).unwrap();
        let norm = random_values(hidden, 4, 0.2)
            .into_iter()
            .map(|v| v + 1.0)
            .collect::<Vec<f32>>();
        let normt = Tensor::new(norm.as_slice(), &d).unwrap();
        let h = candle_nn::ops::rms_norm(&x, &normt, 1e-6).unwrap();
        let want = (&x + crate::ffn::moe::forward(&w, &h).unwrap()).unwrap();
        let reads_ops = w.reads.counts();
        let fused = FusedMoe::of(&w).unwrap().unwrap();
        let scratch = Mutex::new(Scratch::default());
        let got = x.copy().unwrap();
        let op = MoeOp {
            moe: &fused,
            norm: Some(&norm),
            post_norm: None,
            eps: 1e-6,
            scratch: &scratch,
        };
        got.inplace_op1(&op).unwrap();
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let reads: Vec<u64> = w
            .reads
            .counts()
            .iter()
            .zip(&reads_ops)
            .map(|(a, b)| a - b)
            .collect();
        assert_eq!(reads, reads_ops, "both paths read the same experts once");
        (flat(&got), flat(&want), reads)
    }

    #[test]
    fn the_fused_experts_compute_the_op_by_op_path_s_bits() {
        let base = MoeSpec {
            experts: 6,
            top_k: 2,
            intermediate: 32,
            activation: Activation::Silu,
            routing: Routing::SoftmaxTopK { normalize: true },
            biases: false,
            shared: None,
            shared_gated: false,
            gated: true,
        };
        let oai = Activation::SwigluOai {
            alpha: 1.702,
            limit: 7.0,
        };
        let cases = [
            base,
            MoeSpec {
                routing: Routing::SoftmaxTopK { normalize: false },
                shared: Some(64),
                shared_gated: true,
                ..base
            },
            MoeSpec {
                activation: oai,
                routing: Routing::TopKSoftmax,
                biases: true,
                top_k: 3,
                ..base
            },
            // Llama 4: top-1 by sigmoid, weighted on the way in, a shared
            // expert added as it is.
            MoeSpec {
                routing: Routing::TopKSigmoid,
                top_k: 1,
                shared: Some(32),
                ..base
            },
        ];
        for spec in cases {
            for tokens in [1, 5, 17] {
                let (got, want, reads) = both(spec, tokens);
                let diff = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                // One arithmetic on both paths: the same bits.
                assert_eq!(diff, 0.0, "{spec:?} x{tokens}");
                let total: u64 = reads.iter().sum();
                assert!(total >= 1 && total <= spec.experts as u64, "{reads:?}");
            }
        }
    }
}
