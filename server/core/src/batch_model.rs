//! The interface the batching worker drives a model through.
//!
//! The model owns the KV storage, indexed by block id; the worker owns which
//! blocks belong to which sequence (through [`crate::BlockLease`]s) and passes
//! each sequence's block tables with every call.
//!
//! A model's layers fall in KV groups by attention kind (full attention, each
//! sliding window), each group with its own pool of blocks
//! ([`BatchModel::kv_pools`]); a sequence has one block table per group, in
//! the same order. A windowed group's table has [`crate::block_pool::RELEASED`]
//! in the entries its window has left, which the model never reads.

use crate::{AdapterRef, Error};

/// One KV pool of a model: the group of layers it serves and its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSpec {
    /// The group's sliding window in tokens; `None` for full attention.
    pub window: Option<usize>,
    /// Blocks in the pool.
    pub blocks: usize,
}

/// A sequence's block tables, one per KV pool in [`BatchModel::kv_pools`]'s
/// order; for a model with recurrent layers ([`BatchModel::state_slots`]
/// is `Some`), then one more table of one entry: the sequence's state slot.
pub type Tables<'a> = &'a [&'a [u32]];

/// The input check of a row's state slot: the one-entry table after the KV
/// pools' tables, inside `slots`; no table at all when `slots` is `None` (a
/// model without recurrent layers). Returns the KV pools' tables.
pub fn check_state_table<'a>(
    slots: Option<usize>,
    pools: usize,
    tables: Tables<'a>,
) -> Result<Tables<'a>, Error> {
    let Some(slots) = slots else {
        return Ok(tables);
    };
    match tables.split_last() {
        Some((&[slot], kv)) if kv.len() == pools && (*slot as usize) < slots => Ok(kv),
        _ => Err(Error::Forward(format!(
            "a row of a model with {slots} state slots needs its KV tables, then \
             one slot below {slots}"
        ))),
    }
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
/// tokens, each below `vocab`, one table per pool of `pools`, and room for the
/// tokens at `pos` in each, in blocks of `block_size` tokens. No arithmetic
/// here can wrap.
pub fn check_input(
    vocab: usize,
    block_size: usize,
    pools: usize,
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
    if tables.len() != pools {
        return Err(Error::Forward(format!(
            "{} block tables for a model with {pools} KV pools",
            tables.len()
        )));
    }
    let end = pos.checked_add(tokens.len());
    for blocks in tables {
        let room = blocks.len().checked_mul(block_size);
        match (end, room) {
            (Some(end), Some(room)) if end <= room => {}
            _ => {
                return Err(Error::Forward(format!(
                    "positions {pos}..+{} are past the sequence's {} blocks of {block_size}",
                    tokens.len(),
                    blocks.len(),
                )));
            }
        }
    }
    Ok(())
}

/// A decoder that runs many sequences, each with its own paged KV.
pub trait BatchModel: Send {
    /// Size of the logit rows returned.
    fn vocab_size(&self) -> usize;

    /// Tokens per KV block.
    fn block_size(&self) -> usize;

    /// The KV pools of the model's cache, one per group of layers: full
    /// attention first (if any layer has it), then each window, smallest
    /// first. The pools the scheduler hands out are exactly these.
    fn kv_pools(&self) -> Vec<PoolSpec>;

    /// Recurrent state slots: each running sequence of a model with
    /// recurrent layers holds one (its state, of fixed size, in every such
    /// layer); `None` for a model without. A row's slot is its last table.
    fn state_slots(&self) -> Option<usize> {
        None
    }

    /// Checks one row's input before a step: `tokens` at `pos` into the
    /// sequence with block tables `tables`. The worker leaves a row that fails
    /// out of the step and ends it alone, so one bad row never fails the
    /// others. The default checks what every model needs: some tokens, each
    /// inside the vocabulary, a table per pool and room for them in each.
    fn check_input(&self, tables: Tables<'_>, tokens: &[u32], pos: usize) -> Result<(), Error> {
        let pools = self.kv_pools().len();
        let tables = check_state_table(self.state_slots(), pools, tables)?;
        check_input(
            self.vocab_size(),
            self.block_size(),
            pools,
            tables,
            tokens,
            pos,
        )
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
        for (blocks, tokens, pos, want) in cases {
            match (check_input(10, 4, 1, &[blocks], tokens, pos), want) {
                (Ok(()), None) => {}
                (Err(e), Some(w)) => assert!(e.to_string().contains(w), "{e}"),
                (g, w) => panic!("{blocks:?} {tokens:?} {pos}: {g:?} vs {w:?}"),
            }
        }
        // One table per pool, each with room.
        let (short, long): (&[u32], &[u32]) = (&[0], &[0, 1]);
        assert!(check_input(10, 4, 2, &[long, long], &[1; 5], 0).is_ok());
        let err = check_input(10, 4, 2, &[long, short], &[1; 5], 0).unwrap_err();
        assert!(
            err.to_string().contains("past the sequence's 1 blocks"),
            "{err}"
        );
        let err = check_input(10, 4, 2, &[long], &[1], 0).unwrap_err();
        assert!(
            err.to_string()
                .contains("1 block tables for a model with 2 KV pools")
        );
    }
}
