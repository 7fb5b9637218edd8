//! What the recurrent mixers (Mamba-2, Gated DeltaNet) share: the runs a
//! step's spans go through them in (each prefill span alone, consecutive
//! decode rows together), the softplus of their time steps and decays, and
//! the causal convolution ([`conv`]).

use candle_core::Tensor;

use crate::error::Result;
use crate::seq_span::SeqSpan;

pub(crate) mod conv;

/// The runs a step's spans go through a recurrent mixer in: each prefill
/// span alone, consecutive single-token spans (decode rows) together; each
/// run's span range and its first token.
fn runs(spans: &[SeqSpan]) -> Vec<(std::ops::Range<usize>, usize)> {
    let mut out = Vec::new();
    let (mut first, mut token) = (0, 0);
    while first < spans.len() {
        let mut last = first + 1;
        if spans[first].n_tokens == 1 {
            while last < spans.len() && spans[last].n_tokens == 1 {
                last += 1;
            }
        }
        out.push((first..last, token));
        token += (last - first) * spans[first].n_tokens;
        first = last;
    }
    out
}

/// One run's place in the step: its first token, rows and tokens a row.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run {
    token: usize,
    rows: usize,
    len: usize,
}

impl Run {
    /// The run's rows of `t` `(tokens, width)`: `(rows, len, width)`.
    pub(crate) fn take(&self, t: &Tensor) -> Result<Tensor> {
        let width = t.dim(1)?;
        Ok(t.narrow(0, self.token, self.rows * self.len)?
            .reshape((self.rows, self.len, width))?)
    }
}

/// `f` over each run of `spans` (see [`runs`]); its outputs, `width` wide,
/// back in the step's token order `(tokens, width)`.
pub(crate) fn over_runs(
    spans: &[SeqSpan],
    width: usize,
    mut f: impl FnMut(&[SeqSpan], Run) -> Result<Tensor>,
) -> Result<Tensor> {
    let mut outs = Vec::new();
    for (range, token) in runs(spans) {
        let run = &spans[range];
        let r = Run {
            token,
            rows: run.len(),
            len: run[0].n_tokens,
        };
        outs.push(f(run, r)?.reshape((r.rows * r.len, width))?);
    }
    Ok(Tensor::cat(&outs, 0)?)
}

/// `log(1 + exp(x))`, without overflow.
pub(crate) fn softplus(x: &Tensor) -> Result<Tensor> {
    let tail = (x.abs()?.neg()?.exp()? + 1.0)?.log()?;
    Ok((x.relu()? + tail)?)
}
