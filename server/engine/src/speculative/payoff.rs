//! Whether speculation pays this step, and where: from the measured cost of
//! a step by the tokens it runs, and each row's measured acceptance. Pure.
//!
//! A step of `n` tokens costs `t(n)` (measured: one memory-bound read of
//! the weights at a few rows, so `t` is nearly flat there; compute-bound at
//! many, so `t` grows with every token). Verifying `j` drafts of a row
//! whose drafts are each accepted with chance `a` (given the ones before)
//! adds `a + a^2 + ... + a^j` expected tokens, and the time the longer step
//! takes. That time is charged at the rate the decoding rows make tokens
//! without drafts (`rows / t(rows)`): drafts pay only where they make more
//! tokens than plain decoding would in the same time. (Charging the whole
//! step instead would let a step that also runs a long prompt chunk make
//! drafts look free.) The rule verifies the drafts with the best expected
//! gain first, as many as give the most tokens net of their time, and none
//! when no number of them gains a margin.

use std::collections::BTreeMap;

/// What each new measurement of a step size counts for in its estimate.
const NEW_WEIGHT: f64 = 0.2;
/// The net gain, as a share of the step's rows (tokens), that drafts must
/// show: noise in the timings should not flip the choice.
const MARGIN: f64 = 0.02;

/// Measured seconds of a step, by the tokens it ran (a moving average per
/// size).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepCosts {
    by_tokens: BTreeMap<usize, f64>,
}

impl StepCosts {
    /// Records that a step of `tokens` tokens took `secs`.
    pub fn observe(&mut self, tokens: usize, secs: f64) {
        if tokens == 0 || !secs.is_finite() || secs <= 0.0 {
            return;
        }
        self.by_tokens
            .entry(tokens)
            .and_modify(|t| *t += NEW_WEIGHT * (secs - *t))
            .or_insert(secs);
    }

    /// The cost of a step of `tokens` tokens: measured, or interpolated
    /// between the nearest sizes measured; past the largest, that one's
    /// (optimistic, so an unmeasured size gets tried once and measured);
    /// below the smallest, that one's. `None` before any measurement.
    pub fn estimate(&self, tokens: usize) -> Option<f64> {
        let below = self.by_tokens.range(..=tokens).next_back();
        let above = self.by_tokens.range(tokens..).next();
        match (below, above) {
            (Some((&a, &ta)), Some((&b, &tb))) if b > a => {
                Some(ta + (tb - ta) * (tokens - a) as f64 / (b - a) as f64)
            }
            (Some((_, &t)), _) | (None, Some((_, &t))) => Some(t),
            (None, None) => None,
        }
    }
}

/// One decoding row's draft, as the rule sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Offer {
    /// Draft tokens proposed.
    pub drafts: usize,
    /// The chance each is accepted, given the ones before it were.
    pub acceptance: f64,
}

/// How many of each offer's drafts to verify this step, in offer order: the
/// step runs `base` tokens without them (prompt chunks and one a decode
/// row), `rows` of them decoding rows that yield a token each; at most
/// `budget` drafts in all. With no measurement yet every draft is tried (and
/// the step measured).
pub fn drafts_to_verify(
    costs: &StepCosts,
    base: usize,
    rows: usize,
    offers: &[Offer],
    budget: usize,
) -> Vec<usize> {
    // (expected gain, offer), best first; a row's later drafts gain less,
    // and the stable sort keeps a row's drafts in order among equal gains.
    let mut gains: Vec<(f64, usize)> = offers
        .iter()
        .enumerate()
        .flat_map(|(i, o)| {
            let a = o.acceptance.clamp(0.0, 1.0);
            (1..=o.drafts).map(move |j| (a.powi(j as i32), i))
        })
        .filter(|&(g, _)| g > 0.0)
        .collect();
    gains.sort_by(|x, y| y.0.total_cmp(&x.0));
    gains.truncate(budget);
    let (Some(step), Some(plain)) = (costs.estimate(base.max(1)), costs.estimate(rows.max(1)))
    else {
        return count(offers.len(), &gains);
    };
    // Tokens a second the rows make without drafts.
    let rate = rows as f64 / plain;
    let (mut best, mut best_net) = (0, MARGIN * rows as f64);
    let mut gained = 0.0;
    for (n, &(g, _)) in gains.iter().enumerate() {
        gained += g;
        let extra = costs.estimate(base + n + 1).map_or(0.0, |t| t - step);
        let net = gained - rate * extra;
        if net > best_net {
            (best, best_net) = (n + 1, net);
        }
    }
    count(offers.len(), &gains[..best])
}

/// Drafts per offer among `chosen`.
fn count(offers: usize, chosen: &[(f64, usize)]) -> Vec<usize> {
    let mut per = vec![0; offers];
    for &(_, i) in chosen {
        per[i] += 1;
    }
    per
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Costs measured at these step sizes (tokens, milliseconds).
    fn costs(points: &[(usize, f64)]) -> StepCosts {
        let mut c = StepCosts::default();
        for &(n, ms) in points {
            c.observe(n, ms / 1e3);
        }
        c
    }

    fn offer(drafts: usize, acceptance: f64) -> Offer {
        Offer { drafts, acceptance }
    }

    #[test]
    fn costs_are_measured_interpolated_and_optimistic_past_the_largest() {
        let c = costs(&[(1, 10.0), (11, 20.0)]);
        let ms = |n| c.estimate(n).map(|t| (t * 1e3 * 1e6).round() / 1e6);
        assert_eq!(
            [ms(0), ms(1), ms(6), ms(11), ms(40)],
            [Some(10.0), Some(10.0), Some(15.0), Some(20.0), Some(20.0)]
        );
        assert_eq!(StepCosts::default().estimate(3), None);
        // A moving average: a new figure counts for a fifth.
        let mut c = costs(&[(4, 10.0)]);
        c.observe(4, 0.020);
        assert!((c.estimate(4).unwrap() - 0.012).abs() < 1e-12);
        // Nothing is learnt from an empty step or a broken clock.
        c.observe(0, 1.0);
        c.observe(4, -1.0);
        c.observe(4, f64::NAN);
        assert!((c.estimate(4).unwrap() - 0.012).abs() < 1e-12);
    }

    #[test]
    fn the_rule_verifies_where_it_pays_and_nowhere_else() {
        // One row on a memory-bound device: a step of up to 6 tokens costs
        // barely more than one token's.
        let one_row = costs(&[(1, 10.0), (2, 10.3), (6, 11.0)]);
        // Sixteen rows, compute-bound: every token costs, and more than
        // the last (longer steps attend over more).
        let busy = costs(&[
            (16, 30.0),
            (32, 62.0),
            (96, 190.0),
            (320, 640.0),
            (400, 800.0),
        ]);
        // (name, costs, base tokens, rows, offers, budget, expected)
        type Case = (
            &'static str,
            StepCosts,
            usize,
            usize,
            Vec<Offer>,
            usize,
            Vec<usize>,
        );
        let cases: Vec<Case> = vec![
            (
                "copying at one row: every draft",
                one_row.clone(),
                1,
                1,
                vec![offer(5, 0.9)],
                512,
                vec![5],
            ),
            (
                "chat at one row: the drafts likely enough to cover their cost",
                one_row.clone(),
                1,
                1,
                vec![offer(5, 0.3)],
                512,
                vec![3],
            ),
            (
                "drafts that are never accepted: none",
                one_row.clone(),
                1,
                1,
                vec![offer(5, 0.0)],
                512,
                vec![0],
            ),
            (
                "sixteen chat rows, compute-bound: none",
                busy.clone(),
                16,
                16,
                vec![offer(5, 0.4); 16],
                512,
                vec![0; 16],
            ),
            (
                "sixteen rows copying at 0.99: still not worth five times the step",
                busy.clone(),
                16,
                16,
                vec![offer(5, 0.99); 16],
                512,
                vec![0; 16],
            ),
            (
                "sixteen chat rows beside a 300-token prompt chunk: still none",
                busy.clone(),
                316,
                16,
                vec![offer(5, 0.4); 16],
                512,
                vec![0; 16],
            ),
            (
                "the budget bounds the drafts, the best rows first",
                one_row.clone(),
                2,
                2,
                vec![offer(5, 0.5), offer(5, 0.95)],
                4,
                vec![0, 4],
            ),
            (
                "no measurement yet: every draft, to measure it",
                StepCosts::default(),
                3,
                3,
                vec![offer(2, 0.1), offer(0, 0.9), offer(3, 0.5)],
                512,
                vec![2, 0, 3],
            ),
        ];
        for (name, c, base, rows, offers, budget, want) in cases {
            assert_eq!(
                drafts_to_verify(&c, base, rows, &offers, budget),
                want,
                "{name}"
            );
        }
    }
}
