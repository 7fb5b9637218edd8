//! The SSD scan of one block of tokens (Mamba-2's state-space duality):
//! with `a_t = dt_t * A` and `S_t` its running sum within the block,
//!
//! - `y_t = sum_{s<=t} exp(S_t - S_s) (C_t . B_s) dt_s x_s + exp(S_t) C_t h0`
//! - `h_end = exp(S_end) h0 + sum_s exp(S_end - S_s) dt_s x_s B_s^T`
//!
//! which is the recurrence `h_t = exp(a_t) h_{t-1} + dt_t x_t B_t^T`,
//! `y_t = h_t C_t` computed as matmuls: quadratic in the block's length, so
//! callers cut long spans into blocks of the model's chunk. A block of one
//! token is exactly one recurrence step (a decode row).

use candle_core::{D, Tensor};

use crate::error::Result;

/// One block's inputs, `rows` sequences of `len` tokens each.
pub(super) struct Block {
    /// `(rows, len, heads, head_dim)`.
    pub x: Tensor,
    /// `(rows, len, groups, state)`.
    pub b: Tensor,
    /// `(rows, len, groups, state)`.
    pub c: Tensor,
    /// Time steps after softplus and clamp, `(rows, len, heads)`.
    pub dt: Tensor,
}

/// `(rows, len, groups, n)` to `(rows, heads, len, n)`, each group's row
/// shared by its `per_group` consecutive heads.
fn to_heads(t: &Tensor, per_group: usize) -> Result<Tensor> {
    let (rows, len, groups, n) = t.dims4()?;
    Ok(t.unsqueeze(3)?
        .broadcast_as((rows, len, groups, per_group, n))?
        .reshape((rows, len, groups * per_group, n))?
        .transpose(1, 2)?
        .contiguous()?)
}

/// The block's output `(rows, len, heads, head_dim)` (without the D skip)
/// and the state after it `(rows, heads, head_dim, state)`, from the state
/// `h0` before it; `a` is each head's (negative) rate.
pub(super) fn ssd(
    blk: &Block,
    a: &Tensor,
    h0: &Tensor,
    per_group: usize,
) -> Result<(Tensor, Tensor)> {
    let (rows, len, heads, _) = blk.x.dims4()?;
    // Log-decays, (rows, heads, len), and their running sums.
    let log_decay = blk.dt.broadcast_mul(a)?.transpose(1, 2)?.contiguous()?;
    let sums = log_decay.cumsum(D::Minus1)?;
    // exp(S_t - S_s) for s <= t, 0 above the diagonal: the sums only fall,
    // so the difference there is >= 0 and clamping it to 0 keeps exp finite
    // before the mask zeroes it.
    let diff = sums
        .unsqueeze(3)?
        .broadcast_sub(&sums.unsqueeze(2)?)?
        .minimum(0.0)?;
    let mask: Vec<f32> = (0..len * len)
        .map(|i| f32::from(u8::from(i % len <= i / len)))
        .collect();
    let mask = Tensor::from_vec(mask, (len, len), blk.x.device())?;
    let decay = diff.exp()?.broadcast_mul(&mask)?;
    let b = to_heads(&blk.b, per_group)?;
    let c = to_heads(&blk.c, per_group)?;
    // x dt, (rows, heads, len, head_dim).
    let xdt = blk
        .x
        .broadcast_mul(&blk.dt.unsqueeze(3)?)?
        .transpose(1, 2)?
        .contiguous()?;
    let scores = c.matmul(&b.transpose(2, 3)?.contiguous()?)?;
    let within = (scores * decay)?.matmul(&xdt)?;
    let from_h0 = c
        .matmul(&h0.transpose(2, 3)?.contiguous()?)?
        .broadcast_mul(&sums.exp()?.unsqueeze(3)?)?;
    let y = (within + from_h0)?.transpose(1, 2)?.contiguous()?;
    let end = sums.narrow(2, len - 1, 1)?;
    let to_end = end.broadcast_sub(&sums)?.exp()?.unsqueeze(3)?;
    let added = xdt
        .broadcast_mul(&to_end)?
        .transpose(2, 3)?
        .contiguous()?
        .matmul(&b)?;
    let kept = h0.broadcast_mul(&end.exp()?.unsqueeze(3)?)?;
    let h = (kept + added)?;
    debug_assert_eq!(h.dims4()?.1, heads);
    debug_assert_eq!(y.dims4()?.0, rows);
    Ok((y, h))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::max_diff;
    use candle_core::{DType, Device};

    /// The recurrence token by token, the reference the block form must equal.
    fn stepwise(blk: &Block, a: &Tensor, h0: &Tensor, per_group: usize) -> (Tensor, Tensor) {
        let len = blk.x.dims4().unwrap().1;
        let (mut h, mut ys) = (h0.clone(), Vec::new());
        for t in 0..len {
            let one = Block {
                x: blk.x.narrow(1, t, 1).unwrap(),
                b: blk.b.narrow(1, t, 1).unwrap(),
                c: blk.c.narrow(1, t, 1).unwrap(),
                dt: blk.dt.narrow(1, t, 1).unwrap(),
            };
            // One token: exp(a) h + dt x B^T, y = h C.
            let da = (one.dt.broadcast_mul(a).unwrap().exp().unwrap())
                .squeeze(1)
                .unwrap()
                .unsqueeze(2)
                .unwrap()
                .unsqueeze(3)
                .unwrap();
            let b = to_heads(&one.b, per_group).unwrap().squeeze(2).unwrap();
            let c = to_heads(&one.c, per_group).unwrap().squeeze(2).unwrap();
            let xdt = one
                .x
                .squeeze(1)
                .unwrap()
                .broadcast_mul(&one.dt.squeeze(1).unwrap().unsqueeze(2).unwrap())
                .unwrap();
            let outer = xdt
                .unsqueeze(3)
                .unwrap()
                .broadcast_mul(&b.unsqueeze(2).unwrap())
                .unwrap();
            h = (h.broadcast_mul(&da).unwrap() + outer).unwrap();
            let y = h
                .matmul(&c.unsqueeze(3).unwrap())
                .unwrap()
                .squeeze(3)
                .unwrap();
            ys.push(y.unsqueeze(1).unwrap());
        }
        (Tensor::cat(&ys, 1).unwrap(), h)
    }

    #[test]
    fn the_block_form_equals_the_recurrence_and_blocks_chain() {
        let dev = Device::Cpu;
        let (rows, len, heads, p, groups, n) = (2, 7, 4, 3, 2, 5);
        let r = |shape: &[usize]| Tensor::randn(0f32, 1.0, shape, &dev).unwrap();
        let blk = Block {
            x: r(&[rows, len, heads, p]),
            b: r(&[rows, len, groups, n]),
            c: r(&[rows, len, groups, n]),
            dt: (r(&[rows, len, heads]).abs().unwrap() * 0.3).unwrap(),
        };
        let a = Tensor::new(&[-0.5f32, -1.0, -2.0, -0.1], &dev).unwrap();
        let h0 = r(&[rows, heads, p, n]);
        let (y, h) = ssd(&blk, &a, &h0, heads / groups).unwrap();
        let (y_ref, h_ref) = stepwise(&blk, &a, &h0, heads / groups);
        assert!(max_diff(&y, &y_ref) < 1e-4, "{}", max_diff(&y, &y_ref));
        assert!(max_diff(&h, &h_ref) < 1e-4);
        // Two blocks carrying the state equal one block of both.
        let cut = |t: &Tensor, at: usize, n: usize| t.narrow(1, at, n).unwrap();
        let part = |at, n| Block {
            x: cut(&blk.x, at, n),
            b: cut(&blk.b, at, n),
            c: cut(&blk.c, at, n),
            dt: cut(&blk.dt, at, n),
        };
        let (y1, h1) = ssd(&part(0, 3), &a, &h0, 2).unwrap();
        let (y2, h2) = ssd(&part(3, 4), &a, &h1, 2).unwrap();
        let y12 = Tensor::cat(&[y1, y2], 1).unwrap();
        assert!(max_diff(&y12, &y) < 1e-4);
        assert!(max_diff(&h2, &h) < 1e-4);
        assert_eq!(y.dtype(), DType::F32);
    }
}
