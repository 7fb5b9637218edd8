//! A draft model proposing each speculating row's draft tokens: a smaller
//! model sharing the target's vocabulary, with its own KV pool and one
//! lease in it per row, proposing greedily with batched forwards over all
//! the rows that ask.
//!
//! A row's draft KV holds a prefix of the row's sequence (`tokens`). Before
//! proposing, the row is synced: whatever its draft KV holds past the
//! longest prefix it shares with the row's history now (the drafts the
//! target rejected or never verified) is dropped, and the blocks past it go
//! back to the draft pool through the lease's one release. Then the draft
//! catches up on the rest of the history (the prompt the first time, later
//! the accepted tokens and the target's own next token) in one batched
//! forward that also gives its first draft token, and decodes its further
//! drafts one batched forward each. The last draft is never fed to the
//! draft: nothing would read its KV.
//!
//! Greedy drafts: each draft token is the draft's argmax, so the draft's
//! distribution `q` is one-hot on it, and the verification's rejection
//! sampling for a one-hot `q` (accept `x` with `p(x)`, else sample `p`
//! without `x`) keeps the target's distribution exactly.
//!
//! The draft pool never blocks the target: a row the pool has no room for,
//! or whose draft forward fails, decodes without drafts.

use std::collections::HashMap;

use ferrox_core::batch_model::{DecodeRow, PrefillChunk};
use ferrox_core::{BatchModel, BlockLease, BlockPool, PoolStats, Reservation, Table};
use ferrox_plan::CacheKind;

use crate::EngineError;
use crate::job::RequestId;

/// One row's draft KV: its lease in the draft pool and the tokens it holds,
/// positions `0..tokens.len()`.
struct DraftRow {
    lease: BlockLease,
    tokens: Vec<u32>,
}

/// A row asking for drafts this step.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DraftAsk<'a> {
    /// The row.
    pub id: RequestId,
    /// Its prompt, then its output (whose last token is the pending one).
    pub history: (&'a [u32], &'a [u32]),
    /// Drafts wanted at most (at least 1).
    pub k: usize,
    /// Tokens the row may ever hold (prompt plus `max_tokens`): what its
    /// draft lease reserves.
    pub most: usize,
}

/// The draft model, its pool and each row's lease in it.
pub(crate) struct DraftModel {
    model: Box<dyn BatchModel>,
    pool: BlockPool,
    block_size: usize,
    rows: HashMap<RequestId, DraftRow>,
}

impl DraftModel {
    /// Drafts with `model`, over its own pool, for a target of `vocab`
    /// logits. Refused: a vocabulary of another size, and a model whose
    /// cache is not all full attention (a rejected draft token must leave
    /// no trace, which a window or a recurrent state cannot promise).
    pub fn new(model: Box<dyn BatchModel>, vocab: usize) -> Result<Self, EngineError> {
        if model.vocab_size() != vocab {
            return Err(EngineError::Config(format!(
                "the draft model's vocabulary has {} tokens, the target's {vocab}",
                model.vocab_size()
            )));
        }
        let pools = model.cache_pools();
        let blocks = match pools.as_slice() {
            [p] if p.kind == CacheKind::Full => p.blocks,
            _ => {
                let kinds: Vec<CacheKind> = pools.iter().map(|p| p.kind).collect();
                return Err(EngineError::Config(format!(
                    "the draft model's cache ({}) is not full attention alone: a rejected \
                     draft token would stay in its window or recurrent state",
                    ferrox_plan::spell_kinds(&kinds)
                )));
            }
        };
        Ok(DraftModel {
            block_size: model.block_size().max(1),
            model,
            pool: BlockPool::new(blocks),
            rows: HashMap::new(),
        })
    }

    /// Where the draft pool's blocks are.
    pub fn stats(&self) -> PoolStats {
        self.pool.stats()
    }

    /// Drops the draft KV of every row not `live` (ended rows): their
    /// leases' drop gives the blocks back.
    pub fn retain(&mut self, live: impl Fn(RequestId) -> bool) {
        self.rows.retain(|id, _| live(*id));
    }

    /// Drops what `id`'s draft KV holds past the longest prefix it shares
    /// with `history` (prompt, then output), giving back the blocks past it.
    /// The row's last token is always dropped too: the next proposal feeds
    /// it, for the logits after it.
    pub fn sync(&mut self, id: RequestId, history: (&[u32], &[u32])) {
        if let Some(row) = self.rows.get_mut(&id) {
            let (prompt, output) = history;
            let seq = prompt.iter().chain(output);
            let same = row.tokens.iter().zip(seq).take_while(|(a, b)| a == b);
            let last = (prompt.len() + output.len()).saturating_sub(1);
            let keep = same.count().min(last);
            row.tokens.truncate(keep);
            row.lease.truncate(keep.div_ceil(self.block_size));
        }
    }

    /// Up to `ask.k` greedy drafts for each row of `asks`, in order (empty
    /// where the row gets none this step). A row catching up on more than
    /// `k + 2` tokens (its prompt) takes its share of `budget` tokens, and
    /// proposes once it has caught up.
    pub fn propose(&mut self, asks: &[DraftAsk<'_>], budget: usize) -> Vec<Vec<u32>> {
        let mut drafts = vec![Vec::new(); asks.len()];
        // (ask index, tokens fed, whether it proposes)
        let first = self.prepare(asks, budget);
        if first.is_empty() {
            return drafts;
        }
        let Some(next) = self.forward(asks, &first) else {
            return drafts;
        };
        let mut going: Vec<usize> = Vec::new();
        for ((i, _, proposes), token) in first.iter().zip(next) {
            if let (true, Some(t)) = (*proposes, token) {
                drafts[*i].push(t);
                going.push(*i);
            }
        }
        while !going.is_empty() {
            going.retain(|&i| drafts[i].len() < asks[i].k);
            let feeds: Vec<(usize, Vec<u32>, bool)> = going
                .iter()
                .map(|&i| (i, vec![*drafts[i].last().unwrap_or(&0)], true))
                .collect();
            if feeds.is_empty() {
                break;
            }
            let Some(next) = self.forward(asks, &feeds) else {
                break;
            };
            for (&i, token) in going.iter().zip(next) {
                if let Some(t) = token {
                    drafts[i].push(t);
                }
            }
            going.retain(|&i| drafts[i].len() < asks[i].k);
        }
        drafts
    }

    /// Syncs each asking row (reserving its lease the first time) and
    /// picks what it feeds first: the history its draft KV lacks, or, for
    /// a long catch-up, a chunk of it within `budget`. Rows the pool has no
    /// room for are left out.
    fn prepare(&mut self, asks: &[DraftAsk<'_>], budget: usize) -> Vec<(usize, Vec<u32>, bool)> {
        let mut left = budget;
        let mut feeds = Vec::new();
        for (i, ask) in asks.iter().enumerate() {
            if ask.k == 0 || !self.admit(ask) {
                continue;
            }
            self.sync(ask.id, ask.history);
            let Some(row) = self.rows.get_mut(&ask.id) else {
                continue;
            };
            let (prompt, output) = ask.history;
            let seq: Vec<u32> = prompt.iter().chain(output).copied().collect();
            let lacking = &seq[row.tokens.len().min(seq.len())..];
            let n = if lacking.len() <= ask.k + 2 {
                lacking.len()
            } else {
                let n = lacking.len().min(left);
                left -= n;
                n
            };
            // The drafts' positions too: up to `k - 1` fed after the chunk.
            let need = row.tokens.len() + n + ask.k;
            if n == 0 || row.lease.grow(need.div_ceil(self.block_size)).is_err() {
                continue;
            }
            feeds.push((i, lacking[..n].to_vec(), n == lacking.len()));
        }
        feeds
    }

    /// Gives `ask` its draft lease if it has none; false if the pool has
    /// no room for it now.
    fn admit(&mut self, ask: &DraftAsk<'_>) -> bool {
        if self.rows.contains_key(&ask.id) {
            return true;
        }
        let total = ask.most.div_ceil(self.block_size);
        let reservation = Reservation {
            total,
            ..Reservation::default()
        };
        match self.pool.reserve(&reservation) {
            Ok(lease) => {
                let tokens = Vec::new();
                self.rows.insert(ask.id, DraftRow { lease, tokens });
                true
            }
            Err(e) => {
                tracing::debug!(id = ask.id, error = %e, "no room in the draft pool: no drafts");
                false
            }
        }
    }

    /// One batched forward of the draft: each feed's tokens at the end of
    /// its row's draft KV; the argmax after each feed that proposes. `None`
    /// if the forward failed (logged): nothing is taken as fed.
    fn forward(
        &mut self,
        asks: &[DraftAsk<'_>],
        feeds: &[(usize, Vec<u32>, bool)],
    ) -> Option<Vec<Option<u32>>> {
        let rows = &self.rows;
        let tables: Vec<[Table<'_>; 1]> = feeds
            .iter()
            .map(|(i, _, _)| {
                let blocks = rows.get(&asks[*i].id).map_or(&[][..], |r| r.lease.blocks());
                [Table {
                    kind: CacheKind::Full,
                    blocks,
                }]
            })
            .collect();
        let pos = |i: usize| rows.get(&asks[i].id).map_or(0, |r| r.tokens.len());
        let mut prefill = Vec::new();
        let mut decode = Vec::new();
        for ((i, tokens, proposes), tables) in feeds.iter().zip(&tables) {
            if let [token] = tokens.as_slice() {
                decode.push(DecodeRow {
                    token: *token,
                    pos: pos(*i),
                    tables,
                });
            } else {
                prefill.push(PrefillChunk {
                    tables,
                    tokens,
                    pos: pos(*i),
                    want_logits: *proposes,
                    all_logits: false,
                });
            }
        }
        // A draft that fails or panics costs this step's drafts, never the
        // target's rows.
        let model = &mut self.model;
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            model.step(&prefill, &decode)
        }));
        let logits = match ran {
            Ok(Ok(l)) if l.prefill.len() == prefill.len() && l.decode.len() == decode.len() => l,
            Ok(Ok(_)) => {
                tracing::warn!("the draft model gave the wrong number of logit rows");
                return None;
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "the draft model's step failed: no drafts");
                return None;
            }
            Err(_) => {
                tracing::warn!("the draft model panicked: no drafts");
                return None;
            }
        };
        let (mut chunks, mut singles) = (logits.prefill.into_iter(), logits.decode.into_iter());
        let mut out = Vec::with_capacity(feeds.len());
        for (i, tokens, proposes) in feeds {
            let l = if tokens.len() == 1 {
                singles.next()
            } else {
                chunks.next().flatten()
            };
            if let Some(row) = self.rows.get_mut(&asks[*i].id) {
                row.tokens.extend_from_slice(tokens);
            }
            out.push(l.filter(|_| *proposes).and_then(|l| argmax(&l)));
        }
        Some(out)
    }
}

/// The likeliest token of `logits` (the lowest id among equals); `None`
/// for an empty row.
fn argmax(logits: &[f32]) -> Option<u32> {
    let best = logits
        .iter()
        .enumerate()
        .reduce(|best, x| if x.1 > best.1 { x } else { best })?;
    u32::try_from(best.0).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_takes_the_first_of_equals() {
        assert_eq!(argmax(&[0.0, 2.0, 2.0, -1.0]), Some(1));
        assert_eq!(argmax(&[f32::NEG_INFINITY, 1.0]), Some(1));
        assert_eq!(argmax(&[]), None);
    }
}
