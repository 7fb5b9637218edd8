//! Chunked attention (Llama 4's): a query sees only the positions of its
//! own chunk.

use super::*;

#[test]
fn a_chunk_sees_only_its_own_positions() {
    // (chunk, pos, first seen, one past the last query that sees pos).
    for (chunk, pos, first, until) in [
        (8, 0, 0, 8),
        (8, 7, 0, 8),
        (8, 8, 8, 16),
        (8, 21, 16, 24),
        (1, 5, 5, 6),
        (5, 14, 10, 15),
    ] {
        let p = AttnParams {
            chunk: Some(chunk),
            ..AttnParams::causal(16)
        };
        assert_eq!(p.first_seen(pos), first, "chunk {chunk} pos {pos}");
        assert_eq!(p.seen_until(pos), until, "chunk {chunk} pos {pos}");
    }
    // Chunks shorter than a block, a block and several blocks; prefill
    // runs that start inside a chunk and cross one or more chunk edges;
    // decode rows far past the first.
    let table: Vec<u32> = (0..10).map(|i| (i * 7 % 10) as u32).collect();
    let g = geo(6, 2, 32, 4);
    for (i, chunk) in [1usize, 3, 4, 9, 16].into_iter().enumerate() {
        let p = AttnParams {
            scale: 0.13,
            softcap: (i % 2 == 1).then_some(3.0),
            window: None,
            chunk: Some(chunk),
        };
        let seqs = across_edges(&table);
        check_with(g, &p, 10, &seqs, 400 + i as u64);
    }
}

#[test]
fn a_chunk_reads_no_table_entry_before_its_first_block() {
    let g = geo(4, 2, 16, 4);
    let p = AttnParams {
        chunk: Some(8),
        ..AttnParams::causal(16)
    };
    let mut rng = Rng::new(23);
    let cache = 6 * g.block_size * g.kv_heads * g.head_dim;
    let (k, v) = (rng.vec(cache), rng.vec(cache));
    let full = [3u32, 1, 4, 0, 5, 2];
    // Position 21 sees its chunk 16..=21: blocks 4 and 5 only.
    let mut released = full;
    released[..4].fill(u32::MAX);
    let q = rng.vec(g.heads * g.head_dim);
    let seq = |blocks| {
        [AttnSeq {
            blocks,
            start_pos: 21,
            n_tokens: 1,
        }]
    };
    let want = run((&g, &p), &q, &k, &v, &seq(&full));
    assert_eq!(run((&g, &p), &q, &k, &v, &seq(&released)), want);
    let zero = AttnParams {
        chunk: Some(0),
        ..p
    };
    let err = paged_attention(&g, &zero, &q, &k, &v, &seq(&full), &mut vec![0f32; q.len()]);
    assert!(matches!(err, Err(Error::Geometry(_))), "{err:?}");
}
