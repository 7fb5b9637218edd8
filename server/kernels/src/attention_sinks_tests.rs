//! Attention sinks (gpt-oss): a logit per query head that joins each
//! softmax and attends to nothing.

use super::*;

#[test]
fn sinks_take_their_share_and_minus_infinity_is_plain_attention() {
    let g = geo(4, 2, 8, 4);
    let seqs = [
        AttnSeq {
            blocks: &[3, 0, 2],
            start_pos: 5,
            n_tokens: 4,
        },
        AttnSeq {
            blocks: &[1],
            start_pos: 0,
            n_tokens: 1,
        },
    ];
    let mut rng = Rng::new(17);
    let cache = 4 * g.block_size * g.kv_heads * g.head_dim;
    let (k, v) = (rng.vec(cache), rng.vec(cache));
    let q = rng.vec(5 * g.heads * g.head_dim);
    let sinks = [0.5f32, -1.0, 2.0, 0.0];
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for window in [None, Some(3)] {
        let p = AttnParams {
            window,
            ..AttnParams::causal(8)
        };
        let run = |s: Option<&[f32]>, fast: bool| {
            let mut out = vec![f32::NAN; q.len()];
            match fast {
                true => paged_attention_with_sinks(&g, (&p, s), &q, (&k, &v), &seqs, &mut out),
                false => attention_on(false, (&g, &p, s), &q, (&k, &v), &seqs, &mut out),
            }
            .unwrap();
            out
        };
        let want = reference_with((&g, &p), Some(&sinks), &q, (&k, &v), &seqs);
        let got = run(Some(&sinks), true);
        assert_matches(&got, &want, &format!("sinks, window {window:?}"));
        assert_eq!(
            bits(&got),
            bits(&run(Some(&sinks), false)),
            "SIMD and portable"
        );
        let none = [f32::NEG_INFINITY; 4];
        assert_eq!(bits(&run(Some(&none), true)), bits(&run(None, true)));
        // A sink only takes probability away: the output shrinks.
        let plain = run(None, true);
        assert!(got.iter().zip(&plain).any(|(a, b)| a.abs() < b.abs()));
    }
    let mut out = vec![0f32; q.len()];
    let short = paged_attention_with_sinks(
        &g,
        (&AttnParams::causal(8), Some(&sinks[..3])),
        &q,
        (&k, &v),
        &seqs,
        &mut out,
    );
    assert!(short.is_err(), "a sink per query head");
}
