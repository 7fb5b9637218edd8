//! Driving a `PagedModel` the way the worker does, for tests: a block pool
//! per pool of the model, by kind, a lease per pool per sequence, and the
//! window reclaim before every step (a windowed pool gives back the blocks
//! its window has left and reserves only its window plus a chunk).

use ferrox_core::{BatchModel, BlockLease, BlockPool, DecodeRow, Reservation, Table};
use ferrox_plan::CacheKind;

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

/// A sequence's block tables, one per pool of the model, by kind.
pub trait SeqKv {
    /// Before a step computes `n` tokens at `pos`: what the worker's row
    /// does (a window reclaims, then draws up to `pos + n`).
    fn prepare(&mut self, pos: usize, n: usize);

    /// The tables, one per pool, named by kind.
    fn tables(&self) -> Vec<Table<'_>>;
}

/// One lease of a model with one full-attention pool, every block drawn at
/// once.
impl SeqKv for BlockLease {
    fn prepare(&mut self, _pos: usize, _n: usize) {}

    fn tables(&self) -> Vec<Table<'_>> {
        vec![Table {
            kind: CacheKind::Full,
            blocks: self.blocks(),
        }]
    }
}

/// A sequence's one table in the full-attention pool (a model with no
/// other kind of cache).
pub fn full(lease: &BlockLease) -> [Table<'_>; 1] {
    [Table {
        kind: CacheKind::Full,
        blocks: lease.blocks(),
    }]
}

/// A block pool per pool of a model, by kind (a state pool's blocks are its
/// slots: a sequence holds one).
pub struct Pools {
    pools: Vec<(CacheKind, BlockPool)>,
    block_size: usize,
    /// Whether windowed pools give back what their window has left.
    reclaim: bool,
    /// Whether a sequence lists its tables in the reverse of the model's
    /// order (they are found by kind, so nothing may change).
    reversed: bool,
}

impl Pools {
    /// Pools of `m`'s sizes, windows reclaimed as the worker does.
    pub fn of(m: &PagedModel) -> Self {
        Pools {
            pools: m
                .cache_pools()
                .iter()
                .map(|p| (p.kind, BlockPool::new(p.blocks)))
                .collect(),
            block_size: m.block_size(),
            reclaim: true,
            reversed: false,
        }
    }

    /// These pools, each sequence's tables listed in reverse.
    pub fn reversed(self) -> Self {
        Pools {
            reversed: true,
            ..self
        }
    }

    /// Pools of `m`'s sizes where nothing is given back before the end (a
    /// reference for the reclaim).
    pub fn keeping(m: &PagedModel) -> Self {
        Pools {
            reclaim: false,
            ..Self::of(m)
        }
    }

    /// The leases of a sequence of `tokens` tokens prefilled in chunks of
    /// `chunk`: its whole length in a full-attention pool (drawn at once),
    /// and with reclaim the worker's reservation in a windowed one.
    pub fn seq(&self, tokens: usize, chunk: usize) -> Leases {
        let bs = self.block_size;
        let whole = tokens.div_ceil(bs);
        let mut leases: Vec<(CacheKind, bool, BlockLease)> = self
            .pools
            .iter()
            .map(|&(kind, ref pool)| {
                let reclaim = self.reclaim && kind.window().is_some();
                let lease = match kind {
                    CacheKind::State => pool.allocate(1),
                    CacheKind::Window(w) if reclaim => {
                        let most = ferrox_plan::window_blocks(w, chunk as u64, bs as u64);
                        pool.reserve(&Reservation {
                            total: whole.min(most as usize),
                            ..Reservation::default()
                        })
                    }
                    CacheKind::Full | CacheKind::Window(_) => pool.allocate(whole),
                };
                (kind, reclaim, lease.unwrap())
            })
            .collect();
        if self.reversed {
            leases.reverse();
        }
        Leases {
            leases,
            block_size: bs,
        }
    }

    /// Blocks reserved, over every pool (state slots too).
    pub fn used(&self) -> usize {
        self.pools.iter().map(|(_, p)| p.used()).sum::<usize>()
    }
}

/// One sequence's leases, one per pool, by kind ([`Pools::seq`]).
pub struct Leases {
    /// Each pool's kind, whether it reclaims, and the lease there.
    leases: Vec<(CacheKind, bool, BlockLease)>,
    block_size: usize,
}

impl SeqKv for Leases {
    fn prepare(&mut self, pos: usize, n: usize) {
        let bs = self.block_size;
        for (kind, reclaim, lease) in &mut self.leases {
            let Some(w) = kind.window().filter(|_| *reclaim) else {
                continue;
            };
            lease.release_before(pos.saturating_sub(w as usize) / bs);
            lease.grow((pos + n).div_ceil(bs)).unwrap();
        }
    }

    fn tables(&self) -> Vec<Table<'_>> {
        let leases = self.leases.iter();
        leases
            .map(|(kind, _, lease)| Table {
                kind: *kind,
                blocks: lease.blocks(),
            })
            .collect()
    }
}

/// Prefills `prompt` in chunks of `chunk`, returning the last logits.
pub fn prefill(m: &mut PagedModel, kv: &mut impl SeqKv, prompt: &[u32], chunk: usize) -> Vec<f32> {
    let mut logits = None;
    let mut pos = 0;
    for part in prompt.chunks(chunk) {
        let last = pos + part.len() == prompt.len();
        kv.prepare(pos, part.len());
        logits = m.prefill(&kv.tables(), part, pos, last).unwrap();
        pos += part.len();
    }
    logits.expect("last chunk returns logits")
}

/// The logits of `token` at `pos`, decoded alone.
pub fn decode(m: &mut PagedModel, kv: &mut impl SeqKv, token: u32, pos: usize) -> Vec<f32> {
    kv.prepare(pos, 1);
    let tables = kv.tables();
    let row = DecodeRow {
        token,
        pos,
        tables: &tables,
    };
    m.decode(&[row]).unwrap().remove(0)
}

/// Greedy continuation of one sequence alone.
pub fn greedy_alone(
    m: &mut PagedModel,
    pools: &Pools,
    prompt: &[u32],
    n: usize,
    chunk: usize,
) -> Vec<u32> {
    let mut kv = pools.seq(prompt.len() + n, chunk);
    let mut out = vec![argmax(&prefill(m, &mut kv, prompt, chunk))];
    while out.len() < n {
        let pos = prompt.len() + out.len() - 1;
        out.push(argmax(&decode(m, &mut kv, *out.last().unwrap(), pos)));
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
    pools: &Pools,
    seqs: &[Joiner],
    chunk: usize,
) -> Vec<Vec<u32>> {
    let mut leases: Vec<Option<Leases>> = seqs.iter().map(|_| None).collect();
    let mut out: Vec<Vec<u32>> = seqs.iter().map(|_| Vec::new()).collect();
    for step in 0.. {
        for (i, s) in seqs.iter().enumerate() {
            if s.join == step {
                let mut kv = pools.seq(s.prompt.len() + s.n, chunk);
                out[i].push(argmax(&prefill(m, &mut kv, &s.prompt, chunk)));
                leases[i] = Some(kv);
            }
        }
        let active: Vec<usize> = (0..seqs.len())
            .filter(|&i| leases[i].is_some() && out[i].len() < seqs[i].n)
            .collect();
        if active.is_empty() && seqs.iter().all(|s| s.join <= step) {
            break;
        }
        let pos = |i: usize| seqs[i].prompt.len() + out[i].len() - 1;
        for &i in &active {
            leases[i].as_mut().unwrap().prepare(pos(i), 1);
        }
        let tables: Vec<Vec<Table<'_>>> = active
            .iter()
            .map(|&i| leases[i].as_ref().unwrap().tables())
            .collect();
        let rows: Vec<DecodeRow<'_>> = active
            .iter()
            .zip(&tables)
            .map(|(&i, tables)| DecodeRow {
                token: *out[i].last().unwrap(),
                pos: pos(i),
                tables,
            })
            .collect();
        let logits = m.decode(&rows).unwrap();
        drop(tables);
        for (j, &i) in active.iter().enumerate() {
            out[i].push(argmax(&logits[j]));
            if out[i].len() == seqs[i].n {
                leases[i] = None; // leaves the batch; its blocks go back
            }
        }
    }
    out
}
