//! Speculative decoding's state in the worker: the n-gram lookup's bounds,
//! what a step costs by its size (measured between ticks, from the `now`
//! each tick is given), how often drafts are accepted over all rows, and
//! the choice, each step, of which rows verify how many drafts (none
//! while speculation does not pay). The proposer and the pay-off rule are
//! pure functions in the modules below; verification is part of the step
//! (`scheduler/verify.rs`).

use std::time::Instant;

use ferrox_plan::SpeculativeConfig;

use crate::job::RequestId;

mod acceptance;
mod draft_model;
mod ngram;
mod payoff;

pub(crate) use acceptance::Acceptance;
pub(crate) use draft_model::{DraftAsk, DraftModel};
pub(crate) use ngram::{Lookup, propose_following};
use payoff::{Offer, StepCosts, drafts_to_verify};

/// What a row's own acceptance keeps of the past at each verification.
pub(crate) const ROW_KEEP: f64 = 0.8;
/// What the acceptance over all rows (a new row's prior) keeps.
const OVERALL_KEEP: f64 = 0.98;
/// The acceptance assumed before any draft was verified.
const FIRST_PRIOR: f64 = 0.5;
/// Steps with drafts declined in a row after which one row's drafts are
/// verified anyway, so a cost measured in a busy moment is measured again.
const PROBE_EVERY: u64 = 64;

/// A decoding row's draft, offered to this step.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Proposal {
    /// The row.
    pub id: RequestId,
    /// Its draft tokens, in order.
    pub drafts: Vec<u32>,
    /// The chance each is accepted, given the ones before it were.
    pub acceptance: f64,
}

/// What a step did about speculation, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// No row had a draft.
    None,
    /// Drafts were found, and judged not worth their cost.
    Declined,
    /// Some rows verify drafts.
    Verified,
}

impl Decision {
    /// The `decision` label of the steps counter.
    pub fn label(self) -> &'static str {
        match self {
            Decision::None => "none",
            Decision::Declined => "declined",
            Decision::Verified => "verified",
        }
    }
}

/// The worker's speculative decoding.
#[derive(Debug)]
pub(crate) struct Speculation {
    config: SpeculativeConfig,
    costs: StepCosts,
    /// Over every row: the prior of each row's own estimate.
    overall: Acceptance,
    /// When the last tick that ran a step began, and the tokens it ran;
    /// measured when the next tick begins.
    last_step: Option<(Instant, usize)>,
    /// Steps declined since the last verified one.
    declined: u64,
}

impl Speculation {
    /// Speculation as `config` asks.
    pub fn new(config: SpeculativeConfig) -> Self {
        Speculation {
            config,
            costs: StepCosts::default(),
            overall: Acceptance::new(OVERALL_KEEP),
            last_step: None,
            declined: 0,
        }
    }

    /// Draft tokens one row verifies at most.
    pub fn max_drafts(&self) -> usize {
        self.config.num_speculative_tokens as usize
    }

    /// The lookup for a row that may take at most `room` more drafts.
    pub fn lookup(&self, room: usize) -> Lookup {
        Lookup {
            min: self.config.prompt_lookup_min as usize,
            max: self.config.prompt_lookup_max as usize,
            k: self.max_drafts().min(room),
        }
    }

    /// The acceptance a row with no verification of its own is given.
    pub fn prior(&self) -> f64 {
        self.overall.estimate(FIRST_PRIOR)
    }

    /// A tick begins at `now`: the step the last tick ran took until now.
    pub fn tick_began(&mut self, now: Instant) {
        if let Some((began, tokens)) = self.last_step.take() {
            let secs = now.saturating_duration_since(began).as_secs_f64();
            self.costs.observe(tokens, secs);
        }
    }

    /// The tick that began at `began` ran a step of `tokens` tokens,
    /// `prompt_tokens` of them prompt chunks. Only decode steps are
    /// measured: none, nothing to measure; a prompt's tokens skip the
    /// logits a verified draft pays for.
    pub fn step_ran(&mut self, began: Instant, tokens: usize, prompt_tokens: usize) {
        self.last_step = (tokens > 0 && prompt_tokens == 0).then_some((began, tokens));
    }

    /// The worker waits for work: the time until the next tick is no step's.
    pub fn idle(&mut self) {
        self.last_step = None;
    }

    /// How many of each proposal's drafts to verify in a step whose `rows`
    /// decoding rows yield a token each, with `budget` tokens of the step's
    /// budget left for drafts.
    pub fn choose(
        &mut self,
        proposals: &[Proposal],
        rows: usize,
        budget: usize,
    ) -> (Vec<usize>, Decision) {
        let offers: Vec<(usize, f64)> = (proposals.iter())
            .map(|p| (p.drafts.len(), p.acceptance))
            .collect();
        self.choose_offers(&offers, rows, budget)
    }

    /// As [`Speculation::choose`], for drafts not made yet: `offers` are
    /// each row's `(drafts it could make, acceptance)`. A draft model then
    /// drafts only what is kept, so no forward runs for a draft the rule
    /// would drop.
    pub fn choose_offers(
        &mut self,
        offers: &[(usize, f64)],
        rows: usize,
        budget: usize,
    ) -> (Vec<usize>, Decision) {
        let offers: Vec<Offer> = (offers.iter())
            .map(|&(drafts, acceptance)| Offer { drafts, acceptance })
            .collect();
        let mut kept = drafts_to_verify(&self.costs, rows, &offers, budget);
        if tracing::enabled!(tracing::Level::DEBUG) && !offers.is_empty() {
            let offered: usize = offers.iter().map(|o| o.drafts).sum();
            let line = self
                .costs
                .line(rows.max(1), rows.max(1) + offered.min(budget));
            let best = offers.iter().map(|o| o.acceptance).fold(0.0, f64::max);
            tracing::debug!(
                rows,
                offered,
                best,
                ?line,
                kept = kept.iter().sum::<usize>(),
                "drafts"
            );
        }
        if offers.is_empty() {
            return (kept, Decision::None);
        }
        if kept.iter().all(|&n| n == 0) {
            self.declined += 1;
            if self.declined < PROBE_EVERY {
                return (kept, Decision::Declined);
            }
            // A probe: the likeliest row's drafts alone.
            let best = (0..offers.len())
                .max_by(|&a, &b| offers[a].acceptance.total_cmp(&offers[b].acceptance));
            if let Some(i) = best {
                kept[i] = offers[i].drafts.min(budget);
            }
        }
        self.declined = 0;
        let decision = if kept.iter().any(|&n| n > 0) {
            Decision::Verified
        } else {
            Decision::Declined
        };
        (kept, decision)
    }

    /// Records a verification over all rows: `accepted` of `drafted`.
    pub fn record(&mut self, accepted: usize, drafted: usize) {
        self.overall.record(accepted, drafted);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn proposal(id: RequestId, drafts: usize, acceptance: f64) -> Proposal {
        Proposal {
            id,
            drafts: vec![1; drafts],
            acceptance,
        }
    }

    fn config(k: u32) -> SpeculativeConfig {
        SpeculativeConfig {
            num_speculative_tokens: k,
            prompt_lookup_min: 2,
            prompt_lookup_max: 4,
        }
    }

    #[test]
    fn steps_are_measured_tick_to_tick_and_not_across_an_idle_wait() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = Speculation::new(config(4));
        // A 1-token step takes 10 ms, a 5-token one 11 ms: worth it at 0.5.
        s.step_ran(t0, 1, 0);
        s.tick_began(t0 + ms(10));
        s.step_ran(t0 + ms(10), 5, 0);
        s.tick_began(t0 + ms(21));
        let offer = [proposal(0, 4, 0.5)];
        assert_eq!(s.choose(&offer, 1, 64), (vec![4], Decision::Verified));
        // An idle wait between ticks measures nothing: the 10 s do not
        // count against a 5-token step.
        s.step_ran(t0 + ms(21), 5, 0);
        s.idle();
        s.tick_began(t0 + ms(10_021));
        assert_eq!(s.choose(&offer, 1, 64).1, Decision::Verified);
        // Nothing proposed: nothing decided.
        assert_eq!(s.choose(&[], 1, 64), (vec![], Decision::None));
    }

    #[test]
    fn steps_with_prompt_chunks_are_not_measured() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = Speculation::new(config(4));
        let unlikely = [proposal(0, 4, 0.01)];
        s.step_ran(t0, 1, 0);
        s.tick_began(t0 + ms(10));
        // Four of the five tokens a prompt's: nothing learnt, so the cost
        // of a token is still unknown and the drafts are tried.
        s.step_ran(t0 + ms(10), 5, 4);
        s.tick_began(t0 + ms(21));
        assert_eq!(s.choose(&unlikely, 1, 64).1, Decision::Verified);
        // Five decode tokens in 11 ms: a token costs 0.25 ms, a fortieth
        // of a plain step, more than a draft accepted once in a hundred.
        s.step_ran(t0 + ms(21), 5, 0);
        s.tick_began(t0 + ms(32));
        assert_eq!(s.choose(&unlikely, 1, 64).1, Decision::Declined);
    }

    #[test]
    fn a_declining_server_probes_one_row_now_and_then() {
        let t0 = Instant::now();
        let mut s = Speculation::new(config(4));
        // Every token costs: verification never pays at 0.2.
        for (i, tokens) in [16usize, 32, 64].into_iter().enumerate() {
            let began = t0 + Duration::from_secs(i as u64);
            s.step_ran(began, tokens, 0);
            s.tick_began(began + Duration::from_millis(tokens as u64 * 2));
        }
        let offers = [proposal(0, 4, 0.2), proposal(1, 4, 0.3)];
        let mut probes = 0;
        for _ in 0..PROBE_EVERY * 3 {
            match s.choose(&offers, 16, 64) {
                (kept, Decision::Verified) => {
                    assert_eq!(kept, vec![0, 4], "the likelier row alone");
                    probes += 1;
                }
                (kept, d) => assert_eq!((kept, d), (vec![0, 0], Decision::Declined)),
            }
        }
        assert_eq!(probes, 3);
    }

    #[test]
    fn drafts_not_made_yet_are_chosen_as_made_ones_are() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = Speculation::new(config(5));
        // One row: 10 ms a token-step and 1 ms more a token. At 0.5 a
        // draft's j-th token gains 0.5^j against 1/10 of a token, charged
        // half again: two pay.
        for tokens in [1usize, 6] {
            s.step_ran(t0, tokens, 0);
            s.tick_began(t0 + ms(9 + tokens as u64));
        }
        let made = [proposal(0, 5, 0.5)];
        assert_eq!(s.choose(&made, 1, 64), (vec![2], Decision::Verified));
        assert_eq!(
            s.choose_offers(&[(5, 0.5)], 1, 64),
            (vec![2], Decision::Verified)
        );
        // Nothing worth a draft: declined, and no draft is made.
        assert_eq!(
            s.choose_offers(&[(5, 0.05)], 1, 64),
            (vec![0], Decision::Declined)
        );
    }

    #[test]
    fn the_lookup_is_bounded_by_the_room_a_row_has_left() {
        let s = Speculation::new(config(5));
        assert_eq!(
            (s.lookup(9), s.lookup(2).k, s.lookup(0).k),
            (
                Lookup {
                    min: 2,
                    max: 4,
                    k: 5
                },
                2,
                0
            )
        );
        assert_eq!(s.prior(), FIRST_PRIOR);
    }
}
