//! The causal depthwise convolution of the recurrent mixers (Mamba-2's and
//! Gated DeltaNet's), carrying each sequence's last inputs between steps.

use candle_core::Tensor;

use crate::error::Result;

/// Convolves `x` `(rows, len, channels)`, each row after the `kernel - 1`
/// inputs `held` `(rows, (kernel - 1) * channels)` before it, with the
/// depthwise weights `w` `(channels, kernel)` and `bias`; returns the
/// outputs (before any activation) and the inputs to hold for the next
/// step, `(rows, (kernel - 1) * channels)`.
pub(crate) fn causal_conv(
    x: &Tensor,
    held: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    let (rows, len, channels) = x.dims3()?;
    let kernel = w.dim(1)?;
    let k1 = kernel - 1;
    // The convolution's window: the last k-1 inputs, then these.
    let win = Tensor::cat(&[&held.reshape((rows, k1, channels))?, x], 1)?;
    let mut out = win
        .narrow(1, 0, len)?
        .broadcast_mul(&w.narrow(1, 0, 1)?.squeeze(1)?)?;
    for k in 1..kernel {
        let wk = w.narrow(1, k, 1)?.squeeze(1)?;
        out = (out + win.narrow(1, k, len)?.broadcast_mul(&wk)?)?;
    }
    if let Some(b) = bias {
        out = out.broadcast_add(b)?;
    }
    let next = win.narrow(1, len, k1)?.reshape((rows, k1 * channels))?;
    Ok((out, next))
}
