//! Draft tokens for the step: each decoding row that may speculate
//! proposes from its own history, and the pay-off rule keeps the drafts
//! worth verifying at this batch's measured cost, within what is left of
//! the step's token budget.

use std::collections::HashSet;

use ferrox_core::BatchModel;

use super::Scheduler;
use super::step_batch::StepRows;
use crate::job::RequestId;
use crate::speculative::{Proposal, propose};

impl<M: BatchModel> Scheduler<M> {
    /// Moves the decode rows whose drafts pay into `batch.verify`, each
    /// with its pending token then the drafts kept. Draft tokens count in
    /// the step's token budget, after the prompt chunks.
    pub(super) fn plan_drafts(&mut self, batch: &mut StepRows) {
        let Some(spec) = self.spec.as_mut().filter(|_| !batch.decode.is_empty()) else {
            return;
        };
        let prior = spec.prior();
        let proposals: Vec<Proposal> = batch
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
            .collect();
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
