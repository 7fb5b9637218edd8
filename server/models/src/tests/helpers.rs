//! Driving a `PagedModel` the way the worker does, for tests.

use ferrox_core::{BatchModel, BlockLease, BlockPool, DecodeRow};

use crate::PagedModel;

pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Prefills `prompt` in chunks of `chunk`, returning the last logits.
pub fn prefill(m: &mut PagedModel, lease: &BlockLease, prompt: &[u32], chunk: usize) -> Vec<f32> {
    let mut logits = None;
    let mut pos = 0;
    for part in prompt.chunks(chunk) {
        let last = pos + part.len() == prompt.len();
        logits = m.prefill(&[lease.blocks()], part, pos, last).unwrap();
        pos += part.len();
    }
    logits.expect("last chunk returns logits")
}

/// Greedy continuation of one sequence alone.
pub fn greedy_alone(
    m: &mut PagedModel,
    pool: &BlockPool,
    prompt: &[u32],
    n: usize,
    chunk: usize,
) -> Vec<u32> {
    let bs = m.block_size();
    let lease = pool.allocate((prompt.len() + n).div_ceil(bs)).unwrap();
    let mut out = vec![argmax(&prefill(m, &lease, prompt, chunk))];
    while out.len() < n {
        let tables = [lease.blocks()];
        let row = DecodeRow {
            token: *out.last().unwrap(),
            pos: prompt.len() + out.len() - 1,
            tables: &tables,
        };
        out.push(argmax(&m.decode(&[row]).unwrap()[0]));
    }
    out
}

/// A sequence in a shared batch: joins at step `join`, generates `n` tokens.
pub struct Joiner {
    pub prompt: Vec<u32>,
    pub join: usize,
    pub n: usize,
}

/// Runs the joiners through shared decode steps; returns each one's tokens.
pub fn greedy_batched(
    m: &mut PagedModel,
    pool: &BlockPool,
    seqs: &[Joiner],
    chunk: usize,
) -> Vec<Vec<u32>> {
    let bs = m.block_size();
    let mut leases: Vec<Option<BlockLease>> = seqs.iter().map(|_| None).collect();
    let mut out: Vec<Vec<u32>> = seqs.iter().map(|_| Vec::new()).collect();
    for step in 0.. {
        for (i, s) in seqs.iter().enumerate() {
            if s.join == step {
                let lease = pool.allocate((s.prompt.len() + s.n).div_ceil(bs)).unwrap();
                out[i].push(argmax(&prefill(m, &lease, &s.prompt, chunk)));
                leases[i] = Some(lease);
            }
        }
        let active: Vec<usize> = (0..seqs.len())
            .filter(|&i| leases[i].is_some() && out[i].len() < seqs[i].n)
            .collect();
        if active.is_empty() && seqs.iter().all(|s| s.join <= step) {
            break;
        }
        let tables: Vec<[&[u32]; 1]> = active
            .iter()
            .map(|&i| [leases[i].as_ref().unwrap().blocks()])
            .collect();
        let rows: Vec<DecodeRow<'_>> = active
            .iter()
            .zip(&tables)
            .map(|(&i, tables)| DecodeRow {
                token: *out[i].last().unwrap(),
                pos: seqs[i].prompt.len() + out[i].len() - 1,
                tables,
            })
            .collect();
        let logits = m.decode(&rows).unwrap();
        for (j, &i) in active.iter().enumerate() {
            out[i].push(argmax(&logits[j]));
            if out[i].len() == seqs[i].n {
                leases[i] = None; // leaves the batch; its blocks go back
            }
        }
    }
    out
}
