//! The gated delta rule over one block of tokens, in the chunked (WY) form
//! transformers' `torch_chunk_gated_delta_rule` computes. Per value head,
//! with the state `S` (`key_dim x value_dim`), decays `g_t <= 0`, rates
//! `beta_t`, L2-normed keys `k_t` and scaled queries `q_t`, the recurrence
//!
//! - `S <- exp(g_t) S`, then `S <- S + k_t (beta_t (v_t - S^T k_t))^T`
//! - `o_t = S^T q_t`
//!
//! is, within a block with `G_t` the running sum of `g` and
//! `D_ts = exp(G_t - G_s)` (`s <= t`):
//!
//! - `T = I + strictly_lower(beta_t k_t . k_s D_ts)`, `U = T^-1 (beta v)`,
//!   `W = T^-1 (beta k exp(G))`, `V' = U - W S0` (the corrections written)
//! - `o = (q exp(G)) S0 + lower(q_t . k_s D_ts) V'`
//! - `S_end = exp(G_end) S0 + (k exp(G_end - G))^T V'`
//!
//! all matmuls but the inverse of the unit lower-triangular `T`, which
//! [`unit_lower_inverse`] builds by doubling blocks (log2 of the block's
//! length steps of batched matmuls, not a step a token). A block of one
//! token (a decode row) runs the recurrence step itself.

use candle_core::{D, Device, Tensor};

use crate::error::Result;

/// One block's inputs, `rows` sequences by `heads` value heads of `len`
/// tokens (q and k already repeated to the value heads, L2-normed, q
/// scaled by `key_dim^-1/2`).
pub(super) struct Block {
    /// `(rows, heads, len, key_dim)`.
    pub q: Tensor,
    /// `(rows, heads, len, key_dim)`.
    pub k: Tensor,
    /// `(rows, heads, len, value_dim)`.
    pub v: Tensor,
    /// `(rows, heads, len)`, in (0, 1).
    pub beta: Tensor,
    /// Log-decays `(rows, heads, len)`, each <= 0.
    pub g: Tensor,
}

/// `(len, len)` ones where `s <= t` (or `s < t` when `strict`), zeros above.
fn lower_mask(len: usize, strict: bool, device: &Device) -> Result<Tensor> {
    let mask: Vec<f32> = (0..len * len)
        .map(|i| {
            let (t, s) = (i / len, i % len);
            f32::from(u8::from(if strict { s < t } else { s <= t }))
        })
        .collect();
    Ok(Tensor::from_vec(mask, (len, len), device)?)
}

/// The block's output `(rows, heads, len, value_dim)` and the state after
/// it `(rows, heads, key_dim, value_dim)`, from the state `s0` before it.
pub(super) fn block(b: &Block, s0: &Tensor) -> Result<(Tensor, Tensor)> {
    let len = b.q.dim(2)?;
    if len == 1 {
        return step(b, s0);
    }
    let device = b.q.device();
    let sums = b.g.cumsum(D::Minus1)?;
    // exp(G_t - G_s) for s <= t; above the diagonal the difference is >= 0
    // (the sums only fall), clamped to 0 so exp stays finite before the
    // mask zeroes it.
    let diff = sums
        .unsqueeze(3)?
        .broadcast_sub(&sums.unsqueeze(2)?)?
        .minimum(0.0)?;
    let decay = diff
        .exp()?
        .broadcast_mul(&lower_mask(len, false, device)?)?;
    let beta = b.beta.unsqueeze(3)?;
    let k_beta = b.k.broadcast_mul(&beta)?;
    let v_beta = b.v.broadcast_mul(&beta)?;
    let kt = b.k.transpose(2, 3)?.contiguous()?;
    let strict = (k_beta.matmul(&kt)? * &decay)?.broadcast_mul(&lower_mask(len, true, device)?)?;
    let t_inv = unit_lower_inverse(&strict)?;
    let grow = sums.exp()?.unsqueeze(3)?;
    let u = t_inv.matmul(&v_beta)?;
    let w = t_inv.matmul(&k_beta.broadcast_mul(&grow)?.contiguous()?)?;
    let v_new = (u - w.matmul(s0)?)?;
    let attn = (b.q.matmul(&kt)? * decay)?;
    let o = (b.q.broadcast_mul(&grow)?.matmul(s0)? + attn.matmul(&v_new)?)?;
    let end = sums.narrow(2, len - 1, 1)?;
    let to_end = end.broadcast_sub(&sums)?.exp()?.unsqueeze(3)?;
    let keys = b.k.broadcast_mul(&to_end)?.transpose(2, 3)?.contiguous()?;
    let kept = s0.broadcast_mul(&end.exp()?.unsqueeze(3)?)?;
    Ok((o, (kept + keys.matmul(&v_new)?)?))
}

/// One token (a decode row): the recurrence itself, without the block
/// form's masks and inverse.
fn step(b: &Block, s0: &Tensor) -> Result<(Tensor, Tensor)> {
    let s = s0.broadcast_mul(&b.g.exp()?.unsqueeze(3)?)?;
    // S^T k as a row: k (1 x key_dim) S (key_dim x value_dim).
    let delta = (&b.v - b.k.matmul(&s)?)?.broadcast_mul(&b.beta.unsqueeze(3)?)?;
    let s = (s + b.k.transpose(2, 3)?.contiguous()?.matmul(&delta)?)?;
    Ok((b.q.matmul(&s)?, s))
}

/// `(I + l)^-1` for `l` `(.., n, n)` strictly lower-triangular: the
/// inverse of each diagonal block of size `s` known, each pair's of size
/// `2s` is `[[A^-1, 0], [-B^-1 C A^-1, B^-1]]` (`C` the pair's lower-left
/// block of `l`), all pairs at once; `n` padded to a power of two (the
/// padding's rows are the identity's, which leaves the rest alone).
pub(super) fn unit_lower_inverse(l: &Tensor) -> Result<Tensor> {
    let dims = l.dims().to_vec();
    let (lead, n) = (&dims[..dims.len() - 2], dims[dims.len() - 1]);
    let batch: usize = lead.iter().product();
    let p = n.next_power_of_two();
    let mut l = l.reshape((batch, n, n))?;
    if p > n {
        l = l.pad_with_zeros(1, 0, p - n)?.pad_with_zeros(2, 0, p - n)?;
    }
    let diagonal = diagonal_blocks(&l.reshape((batch, 1, p, p))?)?;
    // The inverses of the 1x1 diagonal blocks: ones.
    let mut inv = Tensor::ones((batch, p, 1, 1), l.dtype(), l.device())?;
    let mut s = 1;
    for pairs_of_l in diagonal.iter().rev() {
        let pairs = p / (2 * s);
        let c = pairs_of_l.narrow(2, s, s)?.narrow(3, 0, s)?.contiguous()?;
        let halves = inv.reshape((batch, pairs, 2, s, s))?;
        let a = halves.narrow(2, 0, 1)?.squeeze(2)?.contiguous()?;
        let b = halves.narrow(2, 1, 1)?.squeeze(2)?.contiguous()?;
        let x = b.matmul(&c.matmul(&a)?)?.neg()?;
        let top = Tensor::cat(&[&a, &a.zeros_like()?], 3)?;
        let bottom = Tensor::cat(&[&x, &b], 3)?;
        inv = Tensor::cat(&[&top, &bottom], 2)?;
        s *= 2;
    }
    let inv = inv
        .reshape((batch, p, p))?
        .narrow(1, 0, n)?
        .narrow(2, 0, n)?;
    let mut shape = lead.to_vec();
    shape.extend([n, n]);
    Ok(inv.contiguous()?.reshape(shape)?)
}

/// The diagonal blocks of `m` `(batch, 1, p, p)` of every size from `p`
/// down to 2, largest first, each `(batch, p / size, size, size)`: each
/// size's are the two halves on the diagonal of the size above's (views
/// and copies on the device, no index from the host).
fn diagonal_blocks(m: &Tensor) -> Result<Vec<Tensor>> {
    let (batch, _, p, _) = m.dims4()?;
    let mut out = Vec::new();
    let mut level = m.clone();
    let mut size = p;
    while size >= 2 {
        out.push(level.clone());
        let (blocks, h) = (p / size, size / 2);
        let top = level.narrow(2, 0, h)?.narrow(3, 0, h)?;
        let bottom = level.narrow(2, h, h)?.narrow(3, h, h)?;
        level = Tensor::stack(&[&top, &bottom], 2)?.reshape((batch, 2 * blocks, h, h))?;
        size = h;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::max_diff;

    /// The recurrence token by token: the reference the block form must equal.
    fn stepwise(b: &Block, s0: &Tensor) -> (Tensor, Tensor) {
        let len = b.q.dim(2).unwrap();
        let (mut s, mut outs) = (s0.clone(), Vec::new());
        let at = |t: &Tensor, i: usize| t.narrow(2, i, 1).unwrap();
        for i in 0..len {
            let (q, k, v) = (at(&b.q, i), at(&b.k, i), at(&b.v, i));
            let decay = at(&b.g, i).exp().unwrap().unsqueeze(3).unwrap();
            let beta = at(&b.beta, i).unsqueeze(3).unwrap();
            s = s.broadcast_mul(&decay).unwrap();
            // S^T k as a row: k (1 x dk) S (dk x dv).
            let mem = k.matmul(&s).unwrap();
            let delta = ((v - mem).unwrap().broadcast_mul(&beta)).unwrap();
            let kt = k.transpose(2, 3).unwrap().contiguous().unwrap();
            s = (s + kt.matmul(&delta).unwrap()).unwrap();
            outs.push(q.matmul(&s).unwrap());
        }
        (Tensor::cat(&outs, 2).unwrap(), s)
    }

    fn normed(t: Tensor) -> Tensor {
        let n = t
            .sqr()
            .unwrap()
            .sum_keepdim(D::Minus1)
            .unwrap()
            .sqrt()
            .unwrap();
        t.broadcast_div(&n).unwrap()
    }

    #[test]
    fn the_block_form_equals_the_recurrence_and_blocks_chain() {
        let dev = Device::Cpu;
        let (rows, heads, len, dk, dv) = (2, 3, 11, 8, 5);
        let r = |shape: &[usize]| Tensor::randn(0f32, 1.0, shape, &dev).unwrap();
        let blk = Block {
            q: (normed(r(&[rows, heads, len, dk])) * 0.35).unwrap(),
            k: normed(r(&[rows, heads, len, dk])),
            v: r(&[rows, heads, len, dv]),
            beta: candle_nn::ops::sigmoid(&r(&[rows, heads, len])).unwrap(),
            g: (r(&[rows, heads, len]).abs().unwrap() * -0.3).unwrap(),
        };
        let s0 = r(&[rows, heads, dk, dv]);
        let (o, s) = block(&blk, &s0).unwrap();
        let (o_ref, s_ref) = stepwise(&blk, &s0);
        assert!(max_diff(&o, &o_ref) < 1e-4, "{}", max_diff(&o, &o_ref));
        assert!(max_diff(&s, &s_ref) < 1e-4, "{}", max_diff(&s, &s_ref));
        // Blocks of every length carrying the state equal one block of all.
        let cut = |t: &Tensor, at: usize, n: usize| t.narrow(2, at, n).unwrap();
        for first in 1..len {
            let part = |at, n| Block {
                q: cut(&blk.q, at, n),
                k: cut(&blk.k, at, n),
                v: cut(&blk.v, at, n),
                beta: cut(&blk.beta, at, n),
                g: cut(&blk.g, at, n),
            };
            let (o1, s1) = block(&part(0, first), &s0).unwrap();
            let (o2, s2) = block(&part(first, len - first), &s1).unwrap();
            let o12 = Tensor::cat(&[o1, o2], 2).unwrap();
            assert!(max_diff(&o12, &o) < 1e-4, "cut at {first}");
            assert!(max_diff(&s2, &s) < 1e-4, "cut at {first}");
        }
    }

    #[test]
    fn the_doubling_inverse_inverts() {
        let dev = Device::Cpu;
        for n in [1, 2, 3, 5, 8, 13] {
            let l = Tensor::randn(0f32, 0.5, (2, n, n), &dev)
                .unwrap()
                .broadcast_mul(&lower_mask(n, true, &dev).unwrap())
                .unwrap();
            let eye = Tensor::eye(n, candle_core::DType::F32, &dev).unwrap();
            let m = l.broadcast_add(&eye).unwrap();
            let inv = unit_lower_inverse(&l).unwrap();
            let got = m.matmul(&inv).unwrap();
            let want = eye.unsqueeze(0).unwrap().broadcast_as((2, n, n)).unwrap();
            assert!(max_diff(&got, &want.contiguous().unwrap()) < 1e-4, "n {n}");
        }
    }
}
