use half::{bf16, f16};

use super::*;
use crate::test_util::{Rng, rel_err};

/// Naive attention over each sequence's KV gathered into contiguous rows.
fn reference(
    gp: (&AttnGeometry, &AttnParams),
    q: &[f32],
    k: &[f32],
    v: &[f32],
    seqs: &[AttnSeq<'_>],
) -> Vec<f32> {
    reference_with(gp, None, q, (k, v), seqs)
}

/// [`reference`] with a sink logit per query head in each softmax.
fn reference_with(
    (g, p): (&AttnGeometry, &AttnParams),
    sinks: Option<&[f32]>,
    q: &[f32],
    (k, v): (&[f32], &[f32]),
    seqs: &[AttnSeq<'_>],
) -> Vec<f32> {
    let (hd, row) = (g.head_dim, g.kv_heads * g.head_dim);
    let mut out = Vec::new();
    let mut t = 0;
    for s in seqs {
        for pos in s.start_pos..s.start_pos + s.n_tokens {
            for h in 0..g.heads {
                let kvh = h / (g.heads / g.kv_heads);
                let qr = &q[(t * g.heads + h) * hd..][..hd];
                let at = |c: &[f32], p: usize| {
                    let slot =
                        s.blocks[p / g.block_size] as usize * g.block_size + p % g.block_size;
                    c[slot * row + kvh * hd..][..hd].to_vec()
                };
                let first = p.first_seen(pos);
                let scores: Vec<f64> = (first..=pos)
                    .map(|j| {
                        let kr = at(k, j);
                        let s = qr
                            .iter()
                            .zip(&kr)
                            .map(|(a, b)| f64::from(a * b))
                            .sum::<f64>()
                            * f64::from(p.scale);
                        match p.softcap {
                            Some(cap) => f64::from(cap) * (s / f64::from(cap)).tanh(),
                            None => s,
                        }
                    })
                    .collect();
                let sink = sinks.map_or(f64::NEG_INFINITY, |s| f64::from(s[h]));
                let max = scores.iter().cloned().fold(sink, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = e.iter().sum::<f64>() + (sink - max).exp();
                let mut o = vec![0f64; hd];
                for (j, w) in e.iter().enumerate() {
                    for (o, vv) in o.iter_mut().zip(at(v, first + j)) {
                        *o += w / sum * f64::from(vv);
                    }
                }
                out.extend(o.iter().map(|&x| x as f32));
            }
            t += 1;
        }
    }
    out
}

fn check(g: AttnGeometry, num_blocks: usize, seqs: &[AttnSeq<'_>], seed: u64) {
    check_with(g, &AttnParams::causal(g.head_dim), num_blocks, seqs, seed);
}

fn check_with(g: AttnGeometry, p: &AttnParams, num_blocks: usize, seqs: &[AttnSeq<'_>], seed: u64) {
    let mut rng = Rng::new(seed);
    let cache = num_blocks * g.block_size * g.kv_heads * g.head_dim;
    // Scaled keys give peaked softmaxes, which test the max-subtraction.
    let k: Vec<f32> = rng.vec(cache).iter().map(|x| x * 4.0).collect();
    let v = rng.vec(cache);
    let total: usize = seqs.iter().map(|s| s.n_tokens).sum();
    let q = rng.vec(total * g.heads * g.head_dim);
    let gp = (&g, p);
    let want = reference(gp, &q, &k, &v, seqs);
    assert_matches(
        &run(gp, &q, &k, &v, seqs),
        &want,
        &format!("{g:?} {p:?} f32"),
    );
    // Half-width caches: the same attention over the rounded values.
    let (k16, v16) = (narrow(&k, f16::from_f32), narrow(&v, f16::from_f32));
    let want16 = reference(gp, &q, &widen(&k16), &widen(&v16), seqs);
    assert_matches(
        &run(gp, &q, &k16, &v16, seqs),
        &want16,
        &format!("{g:?} f16"),
    );
    let (kb, vb) = (narrow(&k, bf16::from_f32), narrow(&v, bf16::from_f32));
    let wantb = reference(gp, &q, &widen(&kb), &widen(&vb), seqs);
    assert_matches(&run(gp, &q, &kb, &vb, seqs), &wantb, &format!("{g:?} bf16"));
    // Rounding K and V to f16 moves the output by about f16's precision.
    assert!(rel_err(&want16, &want) < 2e-3);
}

/// The attention through the public entry, checked to give the same bits
/// as the portable loops (the SIMD ones reorder nothing).
fn run<T: KvElem>(
    (g, p): (&AttnGeometry, &AttnParams),
    q: &[f32],
    k: &[T],
    v: &[T],
    seqs: &[AttnSeq<'_>],
) -> Vec<f32> {
    let mut out = vec![f32::NAN; q.len()];
    paged_attention(g, p, q, k, v, seqs, &mut out).unwrap();
    let mut portable = vec![f32::NAN; q.len()];
    attention_on(false, (g, p, None), q, (k, v), seqs, &mut portable).unwrap();
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&out),
        bits(&portable),
        "{g:?}: SIMD and portable loops differ"
    );
    out
}

fn assert_matches(got: &[f32], want: &[f32], what: &str) {
    let err = rel_err(got, want);
    assert!(err < 1e-5, "{what}: rel err {err}");
}

fn narrow<T>(x: &[f32], f: impl Fn(f32) -> T) -> Vec<T> {
    x.iter().map(|&v| f(v)).collect()
}

fn widen<T: KvElem>(x: &[T]) -> Vec<f32> {
    let mut buf = vec![0f32; x.len()];
    T::widen(x, &mut buf).to_vec()
}

const fn geo(heads: usize, kv_heads: usize, head_dim: usize, block_size: usize) -> AttnGeometry {
    AttnGeometry {
        heads,
        kv_heads,
        head_dim,
        block_size,
    }
}

#[test]
fn decode_at_various_positions() {
    let table = [5u32, 2, 7, 0, 3];
    for (i, pos) in [0usize, 1, 15, 16, 17, 40, 79].into_iter().enumerate() {
        let seqs = [AttnSeq {
            blocks: &table,
            start_pos: pos,
            n_tokens: 1,
        }];
        check(geo(9, 3, 64, 16), 8, &seqs, i as u64);
    }
}

#[test]
fn chunked_prefill_mid_block_and_mixed_batch() {
    let (a, b, c) = ([3u32, 1, 4], [0u32, 2], [6u32, 5, 7, 8]);
    let cases: [(AttnGeometry, Vec<AttnSeq<'_>>); 4] = [
        // Whole prompt from position 0 across blocks, MHA.
        (
            geo(4, 4, 32, 8),
            vec![AttnSeq {
                blocks: &a,
                start_pos: 0,
                n_tokens: 20,
            }],
        ),
        // A chunk that starts mid-block, GQA 3:1.
        (
            geo(9, 3, 64, 8),
            vec![AttnSeq {
                blocks: &c,
                start_pos: 11,
                n_tokens: 13,
            }],
        ),
        // Decodes and a prefill chunk in one call; head_dim not a multiple of 8.
        (
            geo(4, 2, 12, 4),
            vec![
                AttnSeq {
                    blocks: &b,
                    start_pos: 5,
                    n_tokens: 1,
                },
                AttnSeq {
                    blocks: &c,
                    start_pos: 6,
                    n_tokens: 7,
                },
                AttnSeq {
                    blocks: &a,
                    start_pos: 0,
                    n_tokens: 1,
                },
            ],
        ),
        // Empty sequences are skipped; MQA.
        (
            geo(8, 1, 64, 16),
            vec![
                AttnSeq {
                    blocks: &[],
                    start_pos: 0,
                    n_tokens: 0,
                },
                AttnSeq {
                    blocks: &b,
                    start_pos: 30,
                    n_tokens: 2,
                },
            ],
        ),
    ];
    for (i, (g, seqs)) in cases.into_iter().enumerate() {
        check(g, 9, &seqs, 100 + i as u64);
    }
}

#[test]
fn a_token_gets_the_same_bits_in_any_query_tile() {
    // Two sequences' chunks (37 tokens from position 5: tiles of 16, 16 and
    // 5; 3 tokens from 14) against every token attended alone, as in decode:
    // tiling query tokens shares K/V widening, never an operation on a cell.
    let g = geo(9, 3, 64, 16);
    let (a, b) = ([4u32, 0, 6], [1u32, 3]);
    let chunk = [
        AttnSeq {
            blocks: &a,
            start_pos: 5,
            n_tokens: 37,
        },
        AttnSeq {
            blocks: &b,
            start_pos: 14,
            n_tokens: 3,
        },
    ];
    let mut rng = Rng::new(11);
    let cache = 8 * g.block_size * g.kv_heads * g.head_dim;
    let (k, v) = (rng.vec(cache), rng.vec(cache));
    let (k, v) = (narrow(&k, f16::from_f32), narrow(&v, f16::from_f32));
    let width = g.heads * g.head_dim;
    let q = rng.vec(40 * width);
    let p = AttnParams::causal(g.head_dim);
    let all = run((&g, &p), &q, &k, &v, &chunk);
    let mut token = 0;
    for s in &chunk {
        for pos in s.start_pos..s.start_pos + s.n_tokens {
            let alone = [AttnSeq {
                blocks: s.blocks,
                start_pos: pos,
                n_tokens: 1,
            }];
            let got = run((&g, &p), &q[token * width..][..width], &k, &v, &alone);
            let want = &all[token * width..][..width];
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(want), "token {token} at position {pos}");
            token += 1;
        }
    }
}

#[test]
fn blocked_v_sums_equal_row_by_row_axpy() {
    // The V pass adds a block's rows with the output held in registers; each
    // element must still be `o + w * v` row after row, as one axpy a row
    // computes it (head sizes with and without a 64-element tail).
    let mut rng = Rng::new(12);
    for hd in [64, 128, 80, 32] {
        let rows = 13;
        let w = rng.vec(rows);
        let v = rng.vec(rows * hd);
        let start = rng.vec(hd);
        let mut blocked = start.clone();
        weighted_sum(&mut blocked, &w, &v);
        let mut by_row = start;
        for (t, &wt) in w.iter().enumerate() {
            axpy(&mut by_row, wt, &v[t * hd..(t + 1) * hd]);
        }
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&blocked), bits(&by_row), "head_dim {hd}");
    }
}

#[test]
fn rejects_bad_inputs() {
    let g = geo(4, 2, 8, 4);
    let cache = vec![0f32; 3 * 4 * 2 * 8];
    let q = vec![0f32; 4 * 8];
    let seq = |blocks, start_pos| {
        [AttnSeq {
            blocks,
            start_pos,
            n_tokens: 1,
        }]
    };
    let run = |g: AttnGeometry, k: &[f32], v: &[f32], s: &[AttnSeq<'_>], q: &[f32], o: usize| {
        paged_attention(&g, &AttnParams::causal(8), q, k, v, s, &mut vec![0f32; o])
    };
    let cases: [(&str, Result<(), Error>, Error); 7] = [
        (
            "zero head_dim",
            run(geo(4, 2, 0, 4), &cache, &cache, &[], &[], 0),
            Error::Geometry("all sizes must be positive"),
        ),
        (
            "heads not multiple",
            run(geo(3, 2, 8, 4), &cache, &cache, &[], &[], 0),
            Error::Geometry("heads must be a multiple of kv_heads"),
        ),
        (
            "partial cache block",
            run(g, &cache[1..], &cache[1..], &[], &[], 0),
            Error::Geometry("k_cache is not a whole number of blocks"),
        ),
        (
            "v length",
            run(g, &cache, &cache[64..], &[], &[], 0),
            Error::Length {
                what: "v_cache",
                expected: 192,
                got: 128,
            },
        ),
        (
            "table too short",
            run(g, &cache, &cache, &seq(&[0], 4), &q, 32),
            Error::BlockTable {
                seq: 0,
                last_pos: 4,
                need: 2,
                have: 1,
            },
        ),
        (
            "block id",
            run(g, &cache, &cache, &seq(&[0, 3], 4), &q, 32),
            Error::BlockId {
                seq: 0,
                block: 3,
                num_blocks: 3,
            },
        ),
        (
            "output length",
            run(g, &cache, &cache, &seq(&[0, 1], 4), &q, 31),
            Error::Length {
                what: "attention output",
                expected: 32,
                got: 31,
            },
        ),
    ];
    for (name, got, want) in cases {
        assert_eq!(got, Err(want), "{name}");
    }
}

/// A prefill from 0, a decode row far on and a prefill from 13, over one
/// table: runs that start before, on and past a window's or chunk's edge.
fn across_edges(table: &[u32]) -> [AttnSeq<'_>; 3] {
    [(0, 23), (37, 1), (13, 18)].map(|(start_pos, n_tokens)| AttnSeq {
        blocks: table,
        start_pos,
        n_tokens,
    })
}

#[test]
fn sliding_windows_soft_caps_and_scales_match_the_reference() {
    // Windows shorter than a block, a block, and several blocks; chunks that
    // start before, on and past a window edge; decode rows far past it.
    let table: Vec<u32> = (0..10).map(|i| (i * 7 % 10) as u32).collect();
    let g = geo(6, 2, 32, 4);
    for (i, window) in [1usize, 3, 4, 9, 16].into_iter().enumerate() {
        let p = AttnParams {
            scale: 0.11,
            softcap: (i % 2 == 0).then_some(3.0),
            window: Some(window),
            chunk: None,
        };
        let seqs = across_edges(&table);
        check_with(g, &p, 10, &seqs, 200 + i as u64);
    }
    // A cap without a window, and a scale other than 1/sqrt(head_dim).
    let p = AttnParams {
        scale: 0.5,
        softcap: Some(1.5),
        window: None,
        chunk: None,
    };
    let seqs = [AttnSeq {
        blocks: &table,
        start_pos: 5,
        n_tokens: 20,
    }];
    check_with(g, &p, 10, &seqs, 300);
}

#[test]
fn a_window_reads_no_table_entry_before_its_first_block() {
    // Released blocks hold a sentinel: reading one would be out of the pool.
    let g = geo(4, 2, 16, 4);
    let p = AttnParams {
        window: Some(6),
        ..AttnParams::causal(16)
    };
    let mut rng = Rng::new(21);
    let cache = 6 * g.block_size * g.kv_heads * g.head_dim;
    let (k, v) = (rng.vec(cache), rng.vec(cache));
    let full = [3u32, 1, 4, 0, 5, 2];
    // Position 21 sees 16..=21: blocks 4 and 5 only; a chunk 18..=21
    // sees from 13: blocks 3 to 5.
    for (start_pos, n_tokens, gone) in [(21, 1, 4), (18, 4, 3)] {
        let mut released = full;
        released[..gone].fill(u32::MAX);
        let seq = |blocks| {
            [AttnSeq {
                blocks,
                start_pos,
                n_tokens,
            }]
        };
        let q = rng.vec(n_tokens * g.heads * g.head_dim);
        let want = run((&g, &p), &q, &k, &v, &seq(&full));
        let got = run((&g, &p), &q, &k, &v, &seq(&released));
        assert_eq!(got, want, "chunk at {start_pos}");
    }
    // The window's own first block must still be in the pool.
    let mut released = full;
    released[..5].fill(u32::MAX);
    let q = rng.vec(g.heads * g.head_dim);
    let seq = [AttnSeq {
        blocks: &released,
        start_pos: 21,
        n_tokens: 1,
    }];
    let err = paged_attention(&g, &p, &q, &k, &v, &seq, &mut vec![0f32; q.len()]);
    assert!(
        matches!(
            err,
            Err(Error::BlockId {
                block: u32::MAX,
                ..
            })
        ),
        "{err:?}"
    );
    let zero = AttnParams {
        window: Some(0),
        ..p
    };
    let err = paged_attention(&g, &zero, &q, &k, &v, &seq, &mut vec![0f32; q.len()]);
    assert!(matches!(err, Err(Error::Geometry(_))), "{err:?}");
}

#[test]
fn fast_exp_matches_std() {
    for i in 0..=87_000 {
        let x = -(i as f32) / 1000.0;
        let (got, want) = (exp_nonpositive(x), x.exp());
        assert!(
            (got - want).abs() <= 1e-6 * want,
            "exp({x}) = {got}, want {want}"
        );
    }
    assert!(exp_nonpositive(-1000.0) < 1e-37);
    assert!(exp_nonpositive(f32::NEG_INFINITY) < 1e-37);
}

#[path = "attention_chunk_tests.rs"]
mod chunk;

#[path = "attention_sinks_tests.rs"]
mod sinks;
