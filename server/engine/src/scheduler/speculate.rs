//! Draft tokens for the step: each decoding row that may speculate
//! proposes from its own history (by n-gram lookup, or the draft model's
//! greedy tokens), and the pay-off rule keeps the drafts
//! worth verifying at this batch's measured cost, within what is left of
//! the step's token budget.

use std::collections::HashSet;

use std::collections::BTreeMap;

use ferrox_core::BatchModel;

use super::Scheduler;
use super::step_batch::StepRows;
use crate::job::RequestId;
use crate::row::Row;
use crate::speculative::{
    Decision, DraftAsk, DraftModel, Proposal, Speculation, propose_following,
};

impl<M: BatchModel> Scheduler<M> {
    /// Moves the decode rows whose drafts pay into `batch.verify`, each
    /// with its pending token then the drafts kept. Draft tokens count in
    /// the step's token budget, after the prompt chunks.
    pub(super) fn plan_drafts(&mut self, batch: &mut StepRows) {
        let Some(spec) = self.spec.as_mut().filter(|_| !batch.decode.is_empty()) else {
            return;
        };
        let prior = spec.prior();
        let prompt_tokens: usize = batch.chunks.iter().map(|c| c.1).sum();
        let budget = self
            .shared
            .config
            .prefill_chunk
            .saturating_sub(prompt_tokens);
        let (proposals, kept, decision) = match self.draft.as_mut() {
            // The rule chooses before the draft model drafts, so it drafts
            // only what is verified.
            Some(draft) => {
                let chunk = self.shared.config.prefill_chunk;
                let (mut proposals, decision) = drafted(draft, &self.rows, batch, spec, chunk);
                for p in &mut proposals {
                    if let Some(row) = self.rows.get_mut(&p.id) {
                        row.grammar_cut(&mut p.drafts);
                    }
                }
                // What the draft made, and the grammar allows, is verified.
                let kept: Vec<usize> = proposals.iter().map(|p| p.drafts.len()).collect();
                let none_left = decision == Decision::Verified && kept.iter().all(|&n| n == 0);
                (
                    proposals,
                    kept,
                    if none_left { Decision::None } else { decision },
                )
            }
            None => {
                let rows = &mut self.rows;
                let proposals: Vec<Proposal> = (batch.decode.iter())
                    .filter_map(|id| looked_up(rows.get_mut(id)?, *id, spec, prior))
                    .collect();
                let (kept, decision) = spec.choose(&proposals, batch.decode.len(), budget);
                (proposals, kept, decision)
            }
        };
        self.metrics.spec_step(decision.label());
        let mut verifying: HashSet<RequestId> = HashSet::new();
        for (p, n) in proposals.into_iter().zip(kept) {
            let Some(pending) = self.rows.get(&p.id).and_then(|r| r.pending) else {
                continue;
            };
            if n > 0 {
                let mut input = Vec::with_capacity(n + 1);
                input.push(pending);
                input.extend_from_slice(&p.drafts[..n]);
                batch.verify.push((p.id, input));
                verifying.insert(p.id);
            }
        }
        batch.decode.retain(|id| !verifying.contains(id));
    }
}

/// A row's draft by n-gram lookup over its own history (following the copy
/// its last draft was read from), as much of it as its grammar allows, if
/// it finds one.
fn looked_up(row: &mut Row, id: RequestId, spec: &Speculation, prior: f64) -> Option<Proposal> {
    let lookup = spec.lookup(row.draft_room());
    if lookup.k == 0 {
        return None;
    }
    let (prompt, output) = row.history();
    let len = prompt.len() + output.len();
    let follow = row
        .copying
        .map(|(end, then)| end + len.saturating_sub(then));
    let found = propose_following(prompt, output, lookup, follow);
    row.copying = found.as_ref().map(|(_, end)| (*end, len));
    let mut drafts = found.map_or_else(Vec::new, |(d, _)| d);
    row.grammar_cut(&mut drafts);
    (!drafts.is_empty()).then(|| Proposal {
        id,
        drafts,
        acceptance: row.acceptance.estimate(prior),
    })
}

/// The draft model's proposals for the decoding rows of `batch` that may
/// speculate, each as many drafts as the pay-off rule keeps of what the row
/// has room for (a row kept none of is not drafted for; fewer where the
/// draft pool had no room or a forward failed), and the step's decision. One batched catch-up forward and
/// one batched decode forward per further draft token; a long catch-up (a
/// prompt) takes at most `chunk` tokens a step, and the drafts at most what
/// the prompt chunks leave of it. Declined: no draft forward ran.
fn drafted(
    draft: &mut DraftModel,
    rows: &BTreeMap<RequestId, Row>,
    batch: &StepRows,
    spec: &mut Speculation,
    chunk: usize,
) -> (Vec<Proposal>, Decision) {
    let prior = spec.prior();
    let prompt_tokens: usize = batch.chunks.iter().map(|c| c.1).sum();
    let budget = chunk.saturating_sub(prompt_tokens);
    let room: Vec<(RequestId, &Row, usize)> = (batch.decode.iter())
        .filter_map(|id| {
            let row = rows.get(id)?;
            let k = spec.max_drafts().min(row.draft_room());
            (k > 0).then_some((*id, row, k))
        })
        .collect();
    let offers: Vec<(usize, f64)> = (room.iter())
        .map(|(_, row, k)| (*k, row.acceptance.estimate(prior)))
        .collect();
    let (kept, decision) = spec.choose_offers(&offers, batch.decode.len(), budget);
    if decision != Decision::Verified {
        return (Vec::new(), decision);
    }
    let asks: Vec<DraftAsk<'_>> = (room.iter().zip(&kept))
        .filter(|(_, n)| **n > 0)
        .map(|((id, row, _), n)| DraftAsk {
            id: *id,
            history: row.history(),
            k: *n,
            most: row.prompt.len().saturating_add(row.max_tokens),
        })
        .collect();
    let drafts = draft.propose(&asks, chunk);
    let proposals: Vec<Proposal> = (asks.iter().zip(drafts))
        .filter(|(_, d)| !d.is_empty())
        .filter_map(|(ask, drafts)| {
            let row = rows.get(&ask.id)?;
            Some(Proposal {
                id: ask.id,
                drafts,
                acceptance: row.acceptance.estimate(prior),
            })
        })
        .collect();
    (proposals, decision)
}
