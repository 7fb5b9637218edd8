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
use crate::speculative::{Decision, DraftAsk, DraftModel, Proposal, Speculation, propose};

impl<M: BatchModel> Scheduler<M> {
    /// Moves the decode rows whose drafts pay into `batch.verify`, each
    /// with its pending token then the drafts kept. Draft tokens count in
    /// the step's token budget, after the prompt chunks.
    pub(super) fn plan_drafts(&mut self, batch: &mut StepRows) {
        let Some(spec) = self.spec.as_mut().filter(|_| !batch.decode.is_empty()) else {
            return;
        };
        let prior = spec.prior();
        let proposals: Vec<Proposal> = match self.draft.as_mut() {
            Some(draft) => {
                let budget = self.shared.config.prefill_chunk;
                let Some(proposals) = drafted(draft, &self.rows, batch, spec, budget) else {
                    self.metrics.spec_step(Decision::Declined.label());
                    return;
                };
                proposals
            }
            None => batch
                .decode
                .iter()
                .filter_map(|id| {
                    let row = self.rows.get(id)?;
                    let lookup = spec.lookup(row.draft_room());
                    if lookup.k == 0 {
                        return None;
                    }
                    let (prompt, output) = row.history();
                    let drafts = propose(prompt, output, lookup);
                    (!drafts.is_empty()).then(|| Proposal {
                        id: *id,
                        drafts,
                        acceptance: row.acceptance.estimate(prior),
                    })
                })
                .collect(),
        };
        let prompt_tokens: usize = batch.chunks.iter().map(|c| c.1).sum();
        let budget = self
            .shared
            .config
            .prefill_chunk
            .saturating_sub(prompt_tokens);
        let (kept, decision) = spec.choose(&proposals, batch.tokens(), batch.decode.len(), budget);
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

/// The draft model's proposals for the decoding rows of `batch` that may
/// speculate (as many drafts as each has room for), in one batched catch-up
/// forward and one batched decode forward per further draft token; a long
/// catch-up (a prompt) takes at most `budget` tokens a step. `None`: not
/// worth drafting this step (even every draft accepted as each row's
/// acceptance says would not pay), and no draft forward ran.
fn drafted(
    draft: &mut DraftModel,
    rows: &BTreeMap<RequestId, Row>,
    batch: &StepRows,
    spec: &mut Speculation,
    budget: usize,
) -> Option<Vec<Proposal>> {
    let prior = spec.prior();
    let asks: Vec<DraftAsk<'_>> = (batch.decode)
        .iter()
        .filter_map(|id| {
            let row = rows.get(id)?;
            let k = spec.max_drafts().min(row.draft_room());
            (k > 0).then(|| DraftAsk {
                id: *id,
                history: row.history(),
                k,
                most: row.prompt.len().saturating_add(row.max_tokens),
            })
        })
        .collect();
    let best: Vec<(usize, f64)> = (asks.iter())
        .filter_map(|a| Some((a.k, rows.get(&a.id)?.acceptance.estimate(prior))))
        .collect();
    let prompt_tokens: usize = batch.chunks.iter().map(|c| c.1).sum();
    let room = budget.saturating_sub(prompt_tokens);
    if !spec.worth_drafting(&best, batch.tokens(), batch.decode.len(), room) {
        return None;
    }
    let drafts = draft.propose(&asks, budget);
    let proposals = asks
        .iter()
        .zip(drafts)
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
    Some(proposals)
}
