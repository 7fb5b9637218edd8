//! One step's batch as the model takes it: each row's tables, its chunk of
//! prompt or its pending token, and its position.

use std::collections::BTreeMap;

use ferrox_core::batch_model::{PrefillChunk, StepLogits};
use ferrox_core::{AdapterRef, BatchModel, DecodeRow, Pool, Table};

use crate::job::RequestId;
use crate::row::Row;

/// Runs `chunks` (prompt chunks by row id and length) and the decode rows
/// `ids` through one [`BatchModel::step`].
pub(super) fn run_step<M: BatchModel>(
    model: &mut M,
    rows: &BTreeMap<RequestId, Row>,
    chunks: &[(RequestId, usize)],
    ids: &[RequestId],
) -> Result<StepLogits, ferrox_core::Error> {
    let chunk_rows: Vec<(&Row, usize)> = chunks
        .iter()
        .filter_map(|&(id, n)| rows.get(&id).map(|r| (r, n)))
        .collect();
    let decode_rows: Vec<&Row> = ids.iter().filter_map(|id| rows.get(id)).collect();
    // Each row's tables, made once and borrowed by its chunk or row.
    let chunk_tables: Vec<Vec<Table<'_>>> = chunk_rows.iter().map(|(r, _)| r.kv.tables()).collect();
    let decode_tables: Vec<Vec<Table<'_>>> = decode_rows.iter().map(|r| r.kv.tables()).collect();
    let prefill: Vec<PrefillChunk<'_>> = chunk_rows
        .iter()
        .zip(&chunk_tables)
        .map(|(&(r, n), tables)| {
            let (tokens, pos) = chunk_input(r, n);
            PrefillChunk {
                tables,
                tokens,
                pos,
                want_logits: pos + tokens.len() == r.prompt.len(),
                all_logits: r.wants_prompt_logits(),
            }
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
    let adapters: Vec<Option<AdapterRef>> = (chunk_rows.iter().map(|(r, _)| *r))
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
