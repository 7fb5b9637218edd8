//! Verification of one row's draft tokens against the logits the step gave
//! after its pending token and after each draft token.
//!
//! Each position is sampled exactly as a step without speculation samples
//! it (the row's masks, grammar, penalties and seeded sampler), and the
//! token it gives is emitted; while it equals the draft token at that
//! position the next position is sampled too, since its logits were
//! computed after that very token. The first mismatch is the model's own
//! token (the correction), and a row whose every draft was accepted also
//! gets the token after its last draft (the bonus).
//!
//! For greedy rows this accepts the longest prefix of the drafts the
//! model agrees with. For sampled rows it is Leviathan et al.'s rejection
//! sampling for a draft that proposes token `x` with certainty: `x` is
//! accepted with probability `p(x)` (the sampled token is `x`), and
//! otherwise the token is drawn from `p` without `x`, renormalised (the
//! sampled token given that it is not `x`): the output is distributed
//! exactly as the target's. Drawing one uniform per position, as a step
//! without speculation does, makes it the coupling under which a seeded
//! request gives the same tokens with speculation on or off.
//!
//! The row's end (an end token, a stop string, `max_tokens`, a cancelled
//! caller, a finished grammar) ends the verification: tokens after it are
//! dropped, as they never existed.

use std::time::Instant;

use super::step_batch::{model_failed, take_logits};
use crate::job::RequestId;
use crate::metrics::Metrics;
use crate::row::Row;

/// What one row's verification did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    /// The row.
    pub id: RequestId,
    /// Draft tokens it verified.
    pub drafted: usize,
    /// Of them, those accepted.
    pub accepted: usize,
}

/// Verifies `drafts` on `row` with `logits` (one row after the pending
/// token and one after each draft), emits the accepted tokens and the
/// model's next one, gives back the blocks drawn for the rejected ones and
/// records the outcome.
pub(super) fn verify(
    row: &mut Row,
    logits: &[Vec<f32>],
    drafts: &[u32],
    vocab: usize,
    now: Instant,
    metrics: &Metrics,
) -> Verified {
    let mut accepted = 0;
    if logits.len() == drafts.len() + 1 {
        for (i, l) in logits.iter().enumerate() {
            let before = row.generated;
            take_logits(row, l, vocab, now, metrics);
            let emitted = row.generated > before;
            let hit = emitted && drafts.get(i).is_some_and(|&d| row.pending == Some(d));
            if !hit {
                break;
            }
            accepted += 1;
            if row.finish.is_some() {
                break;
            }
        }
    } else {
        let why = format!(
            "{} logit rows for a verification of {} draft tokens",
            logits.len(),
            drafts.len()
        );
        row.end(model_failed(why));
    }
    row.release_rejected();
    row.acceptance.record(accepted, drafts.len());
    metrics.spec_verified(drafts.len(), accepted);
    Verified {
        id: row.id,
        drafted: drafts.len(),
        accepted,
    }
}
