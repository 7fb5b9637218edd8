//! The speculative decoding series, under vLLM's names (its counters, as
//! its client exposes them: `_total`) and Ferrox's count of steps by what
//! the pay-off rule decided. Exported only by a server that speculates.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use ferrox_plan::contract::metric;
use prometheus::{IntCounterVec, Opts, Registry};

use super::reg;

/// The `decision` labels of the steps counter, all exported from the start.
const DECISIONS: [&str; 3] = ["verified", "declined", "none"];

pub(super) struct SpecSeries {
    drafts: IntCounterVec,
    draft_tokens: IntCounterVec,
    accepted: IntCounterVec,
    per_pos: IntCounterVec,
    steps: IntCounterVec,
    /// Counted as they happen; copied into the labelled series at render.
    counts: OnceLock<Counts>,
}

/// The running totals, once the server speculates.
struct Counts {
    drafts: AtomicU64,
    draft_tokens: AtomicU64,
    accepted: AtomicU64,
    /// Accepted draft tokens by position in the draft.
    per_pos: Vec<AtomicU64>,
}

fn model_counter(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntCounterVec> {
    reg(r, IntCounterVec::new(Opts::new(name, help), labels)?)
}

impl SpecSeries {
    pub(super) fn new(r: &Registry) -> prometheus::Result<Self> {
        Ok(SpecSeries {
            drafts: model_counter(
                r,
                metric::SPEC_DRAFTS,
                "Rows that verified draft tokens, one a row a step (vLLM name).",
                &["model_name"],
            )?,
            draft_tokens: model_counter(
                r,
                metric::SPEC_DRAFT_TOKENS,
                "Draft tokens verified (vLLM name).",
                &["model_name"],
            )?,
            accepted: model_counter(
                r,
                metric::SPEC_ACCEPTED_TOKENS,
                "Draft tokens accepted (vLLM name).",
                &["model_name"],
            )?,
            per_pos: model_counter(
                r,
                metric::SPEC_ACCEPTED_PER_POS,
                "Draft tokens accepted, by position in the draft (vLLM name).",
                &["model_name", "position"],
            )?,
            steps: model_counter(
                r,
                metric::SPEC_STEPS,
                "Steps of a speculating server, by what the pay-off rule decided.",
                &["decision"],
            )?,
            counts: OnceLock::new(),
        })
    }

    /// Exports the series from now on, for drafts of up to `k` tokens.
    pub(super) fn enable(&self, k: usize) {
        let counts = Counts {
            drafts: AtomicU64::new(0),
            draft_tokens: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            per_pos: (0..k).map(|_| AtomicU64::new(0)).collect(),
        };
        if self.counts.set(counts).is_ok() {
            for d in DECISIONS {
                let _ = self.steps.get_metric_with_label_values(&[d]);
            }
        }
    }

    /// Counts one step's decision (`verified`, `declined`, `none`).
    pub(super) fn step(&self, decision: &str) {
        if let Ok(c) = self.steps.get_metric_with_label_values(&[decision]) {
            c.inc();
        }
    }

    /// Counts one row's verification: `accepted` of `drafted` tokens.
    pub(super) fn verified(&self, drafted: usize, accepted: usize) {
        let Some(c) = self.counts.get() else {
            return;
        };
        c.drafts.fetch_add(1, Ordering::Relaxed);
        c.draft_tokens.fetch_add(drafted as u64, Ordering::Relaxed);
        c.accepted.fetch_add(accepted as u64, Ordering::Relaxed);
        for pos in c.per_pos.iter().take(accepted) {
            pos.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Copies the totals into the series of `model_name`.
    pub(super) fn refresh(&self, model_name: &str) {
        let Some(c) = self.counts.get() else {
            return;
        };
        let label = [model_name];
        for (vec, value) in [
            (&self.drafts, &c.drafts),
            (&self.draft_tokens, &c.draft_tokens),
            (&self.accepted, &c.accepted),
        ] {
            vec.reset();
            if let Ok(counter) = vec.get_metric_with_label_values(&label) {
                counter.inc_by(value.load(Ordering::Relaxed));
            }
        }
        self.per_pos.reset();
        for (i, value) in c.per_pos.iter().enumerate() {
            let position = i.to_string();
            if let Ok(counter) = self
                .per_pos
                .get_metric_with_label_values(&[model_name, &position])
            {
                counter.inc_by(value.load(Ordering::Relaxed));
            }
        }
    }
}
