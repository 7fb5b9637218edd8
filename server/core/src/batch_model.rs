//! The interface the batching worker drives a model through.
//!
//! The model owns the cache storage, indexed by block id; the worker owns
//! which blocks belong to which sequence (through [`crate::BlockLease`]s) and
//! passes each sequence's block tables with every call.
//!
//! A model's cache is a list of pools, one per kind of cache its layers keep
//! ([`BatchModel::cache_pools`]: full attention, each sliding window, the
//! recurrent state slots); a sequence has one block table per pool, each
//! named by its kind ([`Table`]), never matched by position. A windowed
//! pool's table has [`crate::block_pool::RELEASED`] in the entries its
//! window has left, which the model never reads; a state pool's table is
//! the sequence's one slot.

use ferrox_plan::CacheKind;

use crate::{AdapterRef, Error};

/// One pool of a model's cache: its kind and its size in blocks (a state
/// pool's block is one sequence's slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool {
    /// The kind of cache, which names the pool.
    pub kind: CacheKind,
    /// Blocks in the pool.
    pub blocks: usize,
}

/// One of a sequence's block tables: the blocks it holds in the pool of
/// `kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Table<'a> {
    /// The pool's kind.
    pub kind: CacheKind,
    /// Block ids, in sequence order (a state table: the one slot).
    pub blocks: &'a [u32],
}

/// A sequence's block tables, one per pool of [`BatchModel::cache_pools`],
/// each named by its kind.
pub type Tables<'a> = &'a [Table<'a>];

/// The table of `kind` among `tables`.
pub fn table_of<'a>(tables: Tables<'a>, kind: CacheKind) -> Option<&'a [u32]> {
    tables.iter().find(|t| t.kind == kind).map(|t| t.blocks)
}

/// One row of a batched decode step.
#[derive(Debug, Clone, Copy)]
pub struct DecodeRow<'a> {
    /// The token to feed.
    pub token: u32,
    /// Its position in the sequence (tokens already in the KV).
    pub pos: usize,
    /// The sequence's block tables.
    pub tables: Tables<'a>,
}

/// A chunk of one sequence's prompt in a mixed step.
#[derive(Debug, Clone, Copy)]
pub struct PrefillChunk<'a> {
    /// The sequence's block tables.
    pub tables: Tables<'a>,
    /// The prompt tokens to run, starting at `pos`.
    pub tokens: &'a [u32],
    /// Position of the first token (prompt tokens already in the KV).
    pub pos: usize,
    /// Whether the logits after the chunk's last token are wanted (the final
    /// chunk of a prompt).
    pub want_logits: bool,
    /// Whether the logits after every token of the chunk are wanted (a
    /// request that asked for its prompt's logprobs); costs a vocabulary-wide
    /// row per token, so only such requests ask.
    pub all_logits: bool,
}

/// Logits of a mixed step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepLogits {
    /// One per prefill chunk, in order: `Some` where the chunk wanted logits.
    pub prefill: Vec<Option<Vec<f32>>>,
    /// One per prefill chunk, in order: the logits after each of its tokens
    /// where it asked for `all_logits`, else empty.
    pub prompt: Vec<Vec<Vec<f32>>>,
    /// One per decode row, in order.
    pub decode: Vec<Vec<f32>>,
}

/// The input check every model needs (see [`BatchModel::check_input`]): some
/// tokens, each below `vocab`, exactly one table for each pool of `pools` and
/// none else, room for the tokens at `pos` in each attention table, in
/// blocks of `block_size` tokens, and one slot inside its pool in a state
/// table. No arithmetic here can wrap.
pub fn check_input(
    vocab: usize,
    block_size: usize,
    pools: &[Pool],
    tables: Tables<'_>,
    tokens: &[u32],
    pos: usize,
) -> Result<(), Error> {
    if tokens.is_empty() {
        return Err(Error::Forward("a row with no tokens".into()));
    }
    if let Some(bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(Error::Forward(format!(
            "token {bad} is outside the vocabulary of {vocab}"
        )));
    }
    let named = |k: CacheKind| tables.iter().filter(|t| t.kind == k).count();
    let unknown = tables
        .iter()
        .map(|t| t.kind)
        .find(|&k| !pools.iter().any(|p| p.kind == k));
    let not_once = pools.iter().map(|p| p.kind).find(|&k| named(k) != 1);
    if let Some(kind) = unknown.or(not_once) {
        return Err(Error::Forward(format!(
            "a row's block tables ({}) must be one for each of the model's pools ({}): \
             the {kind} table is missing, repeated or of no pool",
            spell(tables.iter().map(|t| t.kind)),
            spell(pools.iter().map(|p| p.kind)),
        )));
    }
    for pool in pools {
        let blocks = table_of(tables, pool.kind).unwrap_or_default();
        room(pool, blocks, block_size, tokens.len(), pos)?;
    }
    Ok(())
}

/// Kinds as a message lists them.
fn spell(kinds: impl Iterator<Item = CacheKind>) -> String {
    let kinds: Vec<CacheKind> = kinds.collect();
    ferrox_plan::spell_kinds(&kinds)
}

/// Whether `blocks` of `pool` hold a step of `n` tokens at `pos`: an
/// attention table covers them, a state table is one slot in the pool.
fn room(pool: &Pool, blocks: &[u32], block_size: usize, n: usize, pos: usize) -> Result<(), Error> {
    if !pool.kind.holds_tokens() {
        return match blocks {
            [slot] if (*slot as usize) < pool.blocks => Ok(()),
            _ => Err(Error::Forward(format!(
                "a row's {} table must be one slot below {}, not {blocks:?}",
                pool.kind, pool.blocks
            ))),
        };
    }
    let end = pos.checked_add(n);
    let room = blocks.len().checked_mul(block_size);
    match (end, room) {
        (Some(end), Some(room)) if end <= room => Ok(()),
        _ => Err(Error::Forward(format!(
            "positions {pos}..+{n} are past the sequence's {} blocks of {block_size} in its {} pool",
            blocks.len(),
            pool.kind,
        ))),
    }
}

/// A decoder that runs many sequences, each with its own paged KV.
pub trait BatchModel: Send {
    /// Size of the logit rows returned.
    fn vocab_size(&self) -> usize;

    /// Tokens per KV block.
    fn block_size(&self) -> usize;

    /// The pools of the model's cache, one per kind of cache its layers
    /// keep, in [`CacheKind`] order. The pools the scheduler hands out are
    /// exactly these.
    fn cache_pools(&self) -> Vec<Pool>;

    /// Checks one row's input before a step: `tokens` at `pos` into the
    /// sequence with block tables `tables`. The worker leaves a row that fails
    /// out of the step and ends it alone, so one bad row never fails the
    /// others. The default checks what every model needs: some tokens, each
    /// inside the vocabulary, a table per pool and room for them in each.
    fn check_input(&self, tables: Tables<'_>, tokens: &[u32], pos: usize) -> Result<(), Error> {
        let pools = self.cache_pools();
        check_input(
            self.vocab_size(),
            self.block_size(),
            &pools,
            tables,
            tokens,
            pos,
        )
    }

    /// Block `block` of the pool of `kind`, every layer's share, as bytes:
    /// what a lower KV tier keeps and [`BatchModel::write_block`] puts back.
    /// A model whose cache cannot be copied out says so.
    fn read_block(&self, kind: CacheKind, block: u32) -> Result<Vec<u8>, Error> {
        let _ = block;
        Err(Error::Forward(format!(
            "this model cannot copy out a {kind} block"
        )))
    }

    /// Writes `bytes` (from [`BatchModel::read_block`] of the same model)
    /// into block `block` of the pool of `kind`; a block of the wrong size is
    /// refused, writing nothing.
    fn write_block(&mut self, kind: CacheKind, block: u32, bytes: &[u8]) -> Result<(), Error> {
        let _ = (block, bytes);
        Err(Error::Forward(format!(
            "this model cannot copy in a {kind} block"
        )))
    }

    /// Runs `tokens`, a chunk of one sequence's prompt starting at position
    /// `pos`, into that sequence's KV. Returns the logits after the chunk's last
    /// token when `want_logits` (the final chunk), else `None`. Chunks of any
    /// size give the same result as one whole prefill.
    fn prefill(
        &mut self,
        tables: Tables<'_>,
        tokens: &[u32],
        pos: usize,
        want_logits: bool,
    ) -> Result<Option<Vec<f32>>, Error>;

    /// One batched decode step: feeds each row's token at its position and
    /// returns one row of logits per input row, in the same order.
    fn decode(&mut self, rows: &[DecodeRow<'_>]) -> Result<Vec<Vec<f32>>, Error>;

    /// One mixed step: prefill chunks of several prompts and decode rows,
    /// which a model may run as a single forward pass. The default runs each
    /// chunk through [`BatchModel::prefill`] (one token at a time where it
    /// wants every token's logits), then the rows (if any) through one
    /// [`BatchModel::decode`].
    fn step(
        &mut self,
        prefill: &[PrefillChunk<'_>],
        decode: &[DecodeRow<'_>],
    ) -> Result<StepLogits, Error> {
        let mut out = StepLogits::default();
        for c in prefill {
            if c.all_logits {
                let mut rows = Vec::with_capacity(c.tokens.len());
                for (i, t) in c.tokens.iter().enumerate() {
                    let pos = c.pos.saturating_add(i);
                    let row = self.prefill(c.tables, std::slice::from_ref(t), pos, true)?;
                    rows.push(row.ok_or_else(|| Error::Forward("prefill gave no logits".into()))?);
                }
                out.prefill
                    .push(c.want_logits.then(|| rows.last().cloned()).flatten());
                out.prompt.push(rows);
            } else {
                out.prefill
                    .push(self.prefill(c.tables, c.tokens, c.pos, c.want_logits)?);
                out.prompt.push(Vec::new());
            }
        }
        if !decode.is_empty() {
            out.decode = self.decode(decode)?;
        }
        Ok(out)
    }

    /// One mixed step whose rows may run with LoRA adapters: `adapters` has
    /// one entry per prefill chunk, then one per decode row (`None`: the
    /// base model), or is empty when no row has one. A model that serves
    /// adapters overrides this; the default runs [`BatchModel::step`] and
    /// refuses a step that names an adapter.
    fn step_with_adapters(
        &mut self,
        prefill: &[PrefillChunk<'_>],
        decode: &[DecodeRow<'_>],
        adapters: &[Option<AdapterRef>],
    ) -> Result<StepLogits, Error> {
        if let Some(a) = adapters.iter().flatten().next() {
            return Err(Error::Forward(format!(
                "this model runs no LoRA adapters (asked for {:?})",
                a.name()
            )));
        }
        self.step(prefill, decode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_input_check_refuses_what_no_model_can_run() {
        // Vocabulary 10, blocks of 4. (blocks, tokens, pos, expected error)
        type Case<'a> = (&'a [u32], &'a [u32], usize, Option<&'a str>);
        let cases: [Case; 7] = [
            (&[0, 1], &[1, 2, 3], 5, None),
            (
                &[0, 1],
                &[1, 2, 3],
                6,
                Some("past the sequence's 2 blocks of 4"),
            ),
            (&[], &[1], 0, Some("0 blocks")),
            (&[0], &[], 0, Some("no tokens")),
            (
                &[0],
                &[10],
                0,
                Some("token 10 is outside the vocabulary of 10"),
            ),
            (&[0], &[1], usize::MAX, Some("past")),
            (&[0; 3], &[9; 12], 0, None),
        ];
        let full = |blocks| Pool {
            kind: CacheKind::Full,
            blocks,
        };
        for (blocks, tokens, pos, want) in cases {
            let tables = [Table {
                kind: CacheKind::Full,
                blocks,
            }];
            match (check_input(10, 4, &[full(8)], &tables, tokens, pos), want) {
                (Ok(()), None) => {}
                (Err(e), Some(w)) => assert!(e.to_string().contains(w), "{e}"),
                (g, w) => panic!("{blocks:?} {tokens:?} {pos}: {g:?} vs {w:?}"),
            }
        }
        // One table per pool, by kind, each with room; a state table is one
        // slot inside its pool.
        let (short, long): (&[u32], &[u32]) = (&[0], &[0, 1]);
        let w = CacheKind::Window(8);
        let pools = [
            full(8),
            Pool { kind: w, blocks: 8 },
            Pool {
                kind: CacheKind::State,
                blocks: 2,
            },
        ];
        let t = |kind, blocks| Table { kind, blocks };
        let good = [
            t(CacheKind::State, &[1]),
            t(w, long),
            t(CacheKind::Full, long),
        ];
        assert!(check_input(10, 4, &pools, &good, &[1; 5], 0).is_ok());
        type Bad<'a> = (Vec<Table<'a>>, &'a str);
        let bad: [Bad; 5] = [
            (
                vec![
                    t(CacheKind::Full, long),
                    t(w, short),
                    t(CacheKind::State, &[1]),
                ],
                "past the sequence's 1 blocks of 4 in its window:8 pool",
            ),
            (
                vec![t(CacheKind::Full, long), t(CacheKind::State, &[1])],
                "the window:8 table is missing",
            ),
            (
                vec![
                    t(CacheKind::Full, long),
                    t(w, long),
                    t(w, long),
                    t(CacheKind::State, &[0]),
                ],
                "(full, window:8, window:8, state) must be one for each of the model's pools (full, window:8, state)",
            ),
            (
                vec![
                    t(CacheKind::Full, long),
                    t(w, long),
                    t(CacheKind::State, &[2]),
                ],
                "state table must be one slot below 2",
            ),
            (
                vec![
                    t(CacheKind::Full, long),
                    t(w, long),
                    t(CacheKind::Window(9), long),
                    t(CacheKind::State, &[0]),
                ],
                "the window:9 table",
            ),
        ];
        for (tables, want) in bad {
            let err = check_input(10, 4, &pools, &tables, &[1; 5], 0).unwrap_err();
            assert!(err.to_string().contains(want), "{err}");
        }
    }
}
