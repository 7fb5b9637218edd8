//! The tick's one step: plans its rows (prompt chunks under the token
//! budget shared round-robin, every decoding row, and draft tokens where
//! they pay), checks each row's input, runs one forward (retried once) and
//! applies its logits: prompt cursors move, decoding rows sample, and rows
//! with drafts verify them.

use std::collections::HashMap;
use std::time::Instant;

use ferrox_core::BatchModel;
use ferrox_core::batch_model::StepLogits;
use rayon::prelude::*;

use super::Scheduler;
use super::prefill_plan::plan_prefill;
use super::step_batch::{StepRows, chunk_input, decode_input, model_failed, run_step, take_logits};
use super::verify::{Verified, verify};
use crate::job::RequestId;
use crate::row::Row;

/// Tries of one step before its rows fail.
const FORWARD_TRIES: usize = 2;

/// What a decoding row does with this step's logits.
enum Work<'a> {
    /// Samples its next token.
    Decode(&'a [f32]),
    /// Verifies its drafts: the logits after its pending token and after
    /// each draft token, and the drafts.
    Verify(&'a [Vec<f32>], &'a [u32]),
}

impl<M: BatchModel> Scheduler<M> {
    /// One forward over this tick's prefill chunks (a token budget shared
    /// round-robin) and every decoding row, some with drafts to verify. A
    /// row whose last chunk runs now samples its first token from that
    /// chunk and decodes from the next tick. A row whose input the model
    /// refuses leaves the step and ends alone; a forward that fails is
    /// retried once, then ends every row in it. Returns the step's rows and
    /// what each verification accepted.
    pub(super) fn step(&mut self, now: Instant) -> (StepRows, Vec<Verified>) {
        let rows = &self.rows;
        let left = |id| {
            rows.get(&id)
                .filter(|r| r.finish.is_none())
                .map_or(0, |r| r.prompt.len() - r.cursor)
        };
        let chunks = plan_prefill(
            &mut self.prefill_order,
            left,
            self.shared.config.prefill_chunk,
        );
        let decode: Vec<RequestId> = self
            .rows
            .values()
            .filter(|r| r.finish.is_none() && !r.is_prefilling() && r.pending.is_some())
            .map(|r| r.id)
            .collect();
        let mut batch = StepRows {
            chunks,
            verify: Vec::new(),
            decode,
        };
        self.plan_drafts(&mut batch);
        let batch = self.checked_inputs(batch);
        if batch.is_empty() {
            return (batch, Vec::new());
        }
        let verified = match self.forward(&batch) {
            Ok(logits) => self.apply(&batch, logits, now),
            Err(why) => {
                self.fail(batch.ids(), &why);
                Vec::new()
            }
        };
        (batch, verified)
    }

    /// Keeps the rows whose input the model accepts, each row's window
    /// pools first giving back the blocks their windows have left and
    /// drawing those the step writes (the window reclaim, at the step
    /// boundary), and each verifying row drawing the blocks of its drafts
    /// from its reservation; ends each of the others with the reason. A
    /// verification the model refuses decodes its pending token alone.
    fn checked_inputs(&mut self, batch: StepRows) -> StepRows {
        let model = &self.model;
        let rows = &mut self.rows;
        let mut decode = batch.decode;
        let mut verify = Vec::with_capacity(batch.verify.len());
        for (id, input) in batch.verify {
            let Some(row) = rows.get_mut(&id) else {
                continue;
            };
            let pos = row.decode_pos();
            let fits = row.kv.grow(pos + input.len());
            match fits.and_then(|()| model.check_input(&row.kv.tables(), &input, pos)) {
                Ok(()) => verify.push((id, input)),
                Err(e) => {
                    tracing::debug!(id, error = %e, "a row's drafts were refused; it decodes alone");
                    row.release_rejected();
                    decode.push(id);
                }
            }
        }
        let mut accept = |id: RequestId, input: fn(&Row, usize) -> (&[u32], usize), n: usize| {
            let Some(row) = rows.get_mut(&id) else {
                return false;
            };
            let (len, pos) = {
                let (tokens, pos) = input(row, n);
                (tokens.len(), pos)
            };
            if let Err(e) = row.kv.prepare(pos, len) {
                tracing::warn!(id, error = %e, "a row's window pool ran dry");
                row.end(model_failed(e));
                return false;
            }
            let (tokens, pos) = input(row, n);
            match model.check_input(&row.kv.tables(), tokens, pos) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(id, error = %e, "the model refused a row's input");
                    row.end(model_failed(e));
                    false
                }
            }
        };
        let chunks = batch
            .chunks
            .into_iter()
            .filter(|&(id, n)| accept(id, chunk_input, n))
            .collect();
        let decode = decode
            .into_iter()
            .filter(|&id| accept(id, decode_input, 1))
            .collect();
        StepRows {
            chunks,
            verify,
            decode,
        }
    }

    /// Runs the step, once more if it fails (a panic in the model counts as
    /// a failure); the error of the last try otherwise.
    fn forward(&mut self, batch: &StepRows) -> Result<StepLogits, String> {
        let mut why = String::new();
        let chunks = batch.chunks.len() + batch.verify.len();
        for attempt in 1..=FORWARD_TRIES {
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run_step(&mut self.model, &self.rows, batch)
            }));
            why = match ran {
                Ok(Ok(l)) if l.prefill.len() == chunks && l.decode.len() == batch.decode.len() => {
                    return Ok(l);
                }
                Ok(Ok(l)) => format!(
                    "{} prefill and {} decode logit rows for {chunks} chunks and {} rows",
                    l.prefill.len(),
                    l.decode.len(),
                    batch.decode.len()
                ),
                Ok(Err(e)) => e.to_string(),
                Err(panic) => format!("the model panicked: {}", panic_message(&*panic)),
            };
            tracing::warn!(attempt, error = %why, "model step failed");
        }
        Err(why)
    }

    /// Advances the prefill cursors, samples where the step gave logits and
    /// verifies the drafts; returns what each verification accepted.
    fn apply(&mut self, batch: &StepRows, logits: StepLogits, now: Instant) -> Vec<Verified> {
        let vocab = self.model.vocab_size();
        let mut prompt_rows = logits.prompt.into_iter();
        for (&(id, n), l) in batch.chunks.iter().zip(logits.prefill) {
            let all = prompt_rows.next().unwrap_or_default();
            let Some(row) = self.rows.get_mut(&id) else {
                continue;
            };
            if row.wants_prompt_logits() {
                if all.len() != n {
                    row.end(model_failed(format!(
                        "{} prompt logit rows for a chunk of {n}",
                        all.len()
                    )));
                    continue;
                }
                row.take_prompt_logits(row.cursor, &all);
            }
            row.cursor += n;
            match (row.is_prefilling(), l) {
                (true, _) => {}
                (false, Some(l)) => take_logits(row, &l, vocab, now, &self.metrics),
                (false, None) => row.end(model_failed("prefill returned no logits")),
            }
        }
        // What remains of the chunks' logits is the verifications'.
        let verify_logits: Vec<Vec<Vec<f32>>> = prompt_rows.collect();
        let mut work: HashMap<RequestId, Work<'_>> = batch
            .decode
            .iter()
            .copied()
            .zip(logits.decode.iter().map(|l| Work::Decode(l)))
            .collect();
        for ((id, input), all) in batch.verify.iter().zip(&verify_logits) {
            work.insert(*id, Work::Verify(all, &input[1..]));
        }
        // Decoding rows are independent, and each one's sampling reads its
        // whole vocabulary-wide row (and a grammar's mask): run in parallel,
        // they cost a fraction of the forward instead of as much as it.
        let mut decoding: Vec<(&mut Row, Work<'_>)> = self
            .rows
            .values_mut()
            .filter_map(|row| work.remove(&row.id).map(|w| (row, w)))
            .collect();
        let metrics = &self.metrics;
        decoding
            .par_iter_mut()
            .filter_map(|(row, w)| match *w {
                Work::Decode(l) => {
                    take_logits(row, l, vocab, now, metrics);
                    None
                }
                Work::Verify(all, drafts) => Some(verify(row, all, drafts, vocab, now, metrics)),
            })
            .collect()
    }

    pub(super) fn fail<'a>(&mut self, ids: impl IntoIterator<Item = &'a RequestId>, why: &str) {
        for id in ids {
            if let Some(row) = self.rows.get_mut(id) {
                row.end(model_failed(why));
            }
        }
    }
}

/// The text of a panic's payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}
