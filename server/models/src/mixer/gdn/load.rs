//! A Gated DeltaNet mixer's weights from any source, by GGUF names: the
//! in-projection as Qwen3.5 splits it (`attn_qkv`, `attn_gate`, `ssm_beta`,
//! `ssm_alpha`) or as Qwen3-Next fuses it (`ssm_in`: q, k, v, z interleaved
//! per key head; `ssm_ba`: b, a likewise), read as stored and put in one
//! column order by an index after the matmul (which any matrix type allows).

use candle_core::{Device, Tensor};

use super::forward::GdnWeights;
use super::spec::GdnSpec;
use crate::error::Result;
use crate::projection::single;
use crate::weights::source::WeightSource;

/// Layer `i`'s mixer, for a model of width `hidden`.
pub(crate) fn load(
    src: &mut dyn WeightSource,
    s: &GdnSpec,
    (i, hidden): (usize, usize),
    device: &Device,
) -> Result<GdnWeights> {
    let n = |t: &str| format!("blk.{i}.{t}");
    let (conv_dim, vw, heads) = (s.conv_dim(), s.value_width(), s.value_heads);
    let (qkv, gate, beta, alpha) = (
        n("attn_qkv.weight"),
        n("attn_gate.weight"),
        n("ssm_beta.weight"),
        n("ssm_alpha.weight"),
    );
    let (qkvz, ba) = (n("ssm_in.weight"), n("ssm_ba.weight"));
    let split_qkvz = src.has(&qkv);
    let split_ba = src.has(&beta);
    let mut parts: Vec<(&str, usize)> = match split_qkvz {
        true => vec![(&qkv, conv_dim), (&gate, vw)],
        false => vec![(&qkvz, conv_dim + vw)],
    };
    match split_ba {
        true => parts.extend([(beta.as_str(), heads), (alpha.as_str(), heads)]),
        false => parts.push((&ba, 2 * heads)),
    }
    let in_proj = src.projection(&parts, hidden, device)?;
    let order = match split_qkvz && split_ba {
        true => None,
        false => {
            let idx = column_order(s, split_qkvz, split_ba);
            let len = idx.len();
            Some(Tensor::from_vec(idx, len, device)?)
        }
    };
    let per_head = |src: &mut dyn WeightSource, name: &str| -> Result<Tensor> {
        Ok(src.small(&n(name), &[heads], device)?.reshape(heads)?)
    };
    // GGUF stores `A = -exp(A_log)`; checkpoints `A_log`.
    let a = match src.has(&n("ssm_a")) {
        true => per_head(src, "ssm_a")?,
        false => per_head(src, "ssm_a_log")?.exp()?.neg()?,
    };
    let out_proj = src.projection(&[(&n("ssm_out.weight"), hidden)], vw, device)?;
    Ok(GdnWeights {
        in_proj,
        order,
        conv: src.small(&n("ssm_conv1d.weight"), &[conv_dim, s.conv_kernel], device)?,
        dt_bias: per_head(src, "ssm_dt.bias")?,
        a,
        norm: src.vector(&n("ssm_norm.weight"), s.value_dim, device)?,
        out_proj: single(out_proj),
    })
}

/// The stored columns, in `[q k v | z | b | a]` order, of a projection
/// whose q, k, v, z (unless `split_qkvz`) and b, a (unless `split_ba`)
/// are interleaved per key head as Qwen3-Next stores them:
/// `[q_g k_g v_g z_g]` for each key head `g`, then `[b_g a_g]` for each.
pub(crate) fn column_order(s: &GdnSpec, split_qkvz: bool, split_ba: bool) -> Vec<u32> {
    let (kh, dk) = (s.key_heads, s.key_dim);
    let per = s.value_heads / kh;
    let vg = per * s.value_dim;
    let range = |from: usize, len: usize| (from..from + len).map(|c| c as u32);
    let mut out: Vec<u32> = Vec::with_capacity(s.in_proj());
    let first = if split_qkvz {
        out.extend(range(0, s.conv_dim() + s.value_width()));
        s.conv_dim() + s.value_width()
    } else {
        let group = 2 * dk + 2 * vg;
        // Each part's slice of every key head's group, part after part.
        for (at, len) in [(0, dk), (dk, dk), (2 * dk, vg), (2 * dk + vg, vg)] {
            for g in 0..kh {
                out.extend(range(g * group + at, len));
            }
        }
        kh * group
    };
    if split_ba {
        out.extend(range(first, 2 * s.value_heads));
    } else {
        for at in [0, per] {
            for g in 0..kh {
                out.extend(range(first + g * 2 * per + at, per));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen3_next_s_interleaved_columns_come_out_in_order() {
        // 2 key heads of 1, 4 value heads of 1 (two a key head).
        let s = GdnSpec {
            key_heads: 2,
            value_heads: 4,
            key_dim: 1,
            value_dim: 1,
            conv_kernel: 4,
            chunk: 64,
            tiled: false,
        };
        // Stored: [q0 k0 v0 v1 z0 z1 | q1 k1 v2 v3 z2 z3] [b0 b1 a0 a1 | b2 b3 a2 a3].
        let got = column_order(&s, false, false);
        let want = [
            0, 6, 1, 7, 2, 3, 8, 9, 4, 5, 10, 11, 12, 13, 16, 17, 14, 15, 18, 19,
        ];
        assert_eq!(got, want);
        let split: Vec<u32> = (0..s.in_proj() as u32).collect();
        assert_eq!(column_order(&s, true, true), split);
        // q, k, v and z split; b and a still interleaved.
        let ba = [12, 13, 16, 17, 14, 15, 18, 19];
        assert_eq!(column_order(&s, true, false)[..12], split[..12]);
        assert_eq!(column_order(&s, true, false)[12..], ba);
    }
}
