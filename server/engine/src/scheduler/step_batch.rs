//! One step's batch as the model takes it: each row's tables, its chunk of
//! prompt, its pending token and draft tokens, or its pending token alone,
//! and its position.

use std::collections::BTreeMap;
use std::time::Instant;

use ferrox_core::batch_model::{PrefillChunk, StepLogits};
use ferrox_core::{AdapterRef, BatchModel, DecodeRow, Pool, Table};

use crate::EngineError;
use crate::job::RequestId;
use crate::metrics::Metrics;
use crate::row::{Finish, Row};

/// One step's rows, by what each runs. Batch position j maps to an id in
/// one of these lists, never to an index into a table that may change
/// shape: the model sees the prompt chunks, then the verifications (as
/// chunks that want every position's logits), then the decode rows.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct StepRows {
    /// Prompt chunks: the row and the chunk's length.
    pub chunks: Vec<(RequestId, usize)>,
    /// Rows verifying drafts: the row, and its pending token followed by
    /// its draft tokens (fed at its decode position on).
    pub verify: Vec<(RequestId, Vec<u32>)>,
    /// Rows decoding their pending token alone.
    pub decode: Vec<RequestId>,
}

impl StepRows {
    /// True when the step runs nothing.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty() && self.verify.is_empty() && self.decode.is_empty()
    }

    /// Tokens the step runs.
    pub fn tokens(&self) -> usize {
        let chunks: usize = self.chunks.iter().map(|c| c.1).sum();
        let verify: usize = self.verify.iter().map(|v| v.1.len()).sum();
        chunks + verify + self.decode.len()
    }

    /// Every row in the step, in batch order.
    pub fn ids(&self) -> impl Iterator<Item = &RequestId> {
        let chunks = self.chunks.iter().map(|c| &c.0);
        chunks
            .chain(self.verify.iter().map(|v| &v.0))
            .chain(&self.decode)
    }

    /// The decoding rows (verifying or not), in batch order.
    pub fn decoding(&self) -> Vec<RequestId> {
        let verify = self.verify.iter().map(|v| v.0);
        verify.chain(self.decode.iter().copied()).collect()
    }
}

/// Runs `batch` through one [`BatchModel::step`].
pub(super) fn run_step<M: BatchModel>(
    model: &mut M,
    rows: &BTreeMap<RequestId, Row>,
    batch: &StepRows,
) -> Result<StepLogits, ferrox_core::Error> {
    // (row, tokens, position, whether it is a verification)
    let chunk_rows = batch.chunks.iter().filter_map(|&(id, n)| {
        let r = rows.get(&id)?;
        let (tokens, pos) = chunk_input(r, n);
        Some((r, tokens, pos, false))
    });
    let verify_rows = batch.verify.iter().filter_map(|(id, input)| {
        let r = rows.get(id)?;
        Some((r, input.as_slice(), r.decode_pos(), true))
    });
    let chunk_rows: Vec<(&Row, &[u32], usize, bool)> = chunk_rows.chain(verify_rows).collect();
    let decode_rows: Vec<&Row> = batch.decode.iter().filter_map(|id| rows.get(id)).collect();
    // Each row's tables, made once and borrowed by its chunk or row.
    let chunk_tables: Vec<Vec<Table<'_>>> = chunk_rows.iter().map(|c| c.0.kv.tables()).collect();
    let decode_tables: Vec<Vec<Table<'_>>> = decode_rows.iter().map(|r| r.kv.tables()).collect();
    let prefill: Vec<PrefillChunk<'_>> = chunk_rows
        .iter()
        .zip(&chunk_tables)
        .map(|(&(r, tokens, pos, verify), tables)| PrefillChunk {
            tables,
            tokens,
            pos,
            want_logits: !verify && pos + tokens.len() == r.prompt.len(),
            // A verification samples after every one of its tokens.
            all_logits: verify || r.wants_prompt_logits(),
        })
        .collect();
    let decode: Vec<DecodeRow<'_>> = decode_rows
        .iter()
        .zip(&decode_tables)
        .map(|(r, tables)| DecodeRow {
            token: r.pending.unwrap_or_default(),
            pos: r.decode_pos(),
            tables,
        })
        .collect();
    // One adapter per chunk, then per decode row; none at all without any.
    let adapters: Vec<Option<AdapterRef>> = (chunk_rows.iter().map(|c| c.0))
        .chain(decode_rows.iter().copied())
        .map(|r| r.adapter.clone())
        .collect();
    if adapters.iter().all(Option::is_none) {
        return model.step(&prefill, &decode);
    }
    model.step_with_adapters(&prefill, &decode, &adapters)
}

/// Prompt tokens and position of a row's next chunk of `n` tokens.
pub(super) fn chunk_input(r: &Row, n: usize) -> (&[u32], usize) {
    let end = r.cursor.saturating_add(n).min(r.prompt.len());
    (&r.prompt[r.cursor.min(end)..end], r.cursor)
}

/// The pending token and its position, of a decoding row.
pub(super) fn decode_input(r: &Row, _: usize) -> (&[u32], usize) {
    (r.pending.as_slice(), r.decode_pos())
}

/// Pools as an error message spells them: `full=32, window:16=8`.
pub(super) fn spell_pools(pools: &[Pool]) -> String {
    let spelt: Vec<String> = pools
        .iter()
        .map(|p| format!("{}={}", p.kind, p.blocks))
        .collect();
    spelt.join(", ")
}

/// Samples from a row's logits, or ends the row if the model gave a row of
/// the wrong size (that row's failure, not the batch's).
pub(super) fn take_logits(
    row: &mut Row,
    logits: &[f32],
    vocab: usize,
    now: Instant,
    metrics: &Metrics,
) {
    if logits.len() == vocab {
        row.take_logits(logits, now, metrics);
    } else {
        let why = format!("{} logits for a vocabulary of {vocab}", logits.len());
        row.end(model_failed(why));
    }
}

/// A row's end for a model failure: `why`, as the row's error.
pub(super) fn model_failed(why: impl ToString) -> Finish {
    Finish::Failed(EngineError::Model(why.to_string()))
}
