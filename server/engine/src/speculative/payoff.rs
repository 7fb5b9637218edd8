//! Whether speculation pays this step, and where: from the measured cost of
//! a step by the tokens it runs, and each row's measured acceptance. Pure.
//!
//! A decode step of `n` tokens costs `t(n)` (measured: one memory-bound
//! read of the weights at a few rows, so `t` is nearly flat there;
//! compute-bound at many, so `t` grows with every token). Verifying `j`
//! drafts of a row whose drafts are each accepted with chance `a` (given
//! the ones before) adds `a + a^2 + ... + a^j` expected tokens, and the
//! time the longer step takes: the slope of `t` above the rows' size,
//! fitted by least squares over every size measured there, so one lucky
//! measurement of one size cannot make drafts look cheap. That time is
//! charged at the rate the decoding rows make tokens without drafts
//! (`rows / t(rows)`): drafts pay only where they make more tokens than
//! plain decoding would in the same time. Only steps without prompt chunks
//! are measured: a prompt's tokens skip the logits and sampling a verified
//! token pays, so they would price drafts low. The rule verifies the drafts
//! with the best expected gain first, as many as give the most tokens net
//! of their time, and none when no number of them gains a margin.

use std::collections::BTreeMap;

/// What each new measurement of a step size counts for in its estimate.
const NEW_WEIGHT: f64 = 0.2;
/// The most a size's measurements weigh in the slope: a size measured
/// often is known better, up to the moving average's own memory.
const MAX_WEIGHT: f64 = 5.0;
/// The net gain, as a share of the step's rows (tokens), that drafts must
/// show: noise in the timings should not flip the choice.
const MARGIN: f64 = 0.02;
/// What a draft is charged, as a multiple of its time's worth in plain
/// tokens: the rows picked are those whose acceptance came out high, some
/// by chance, and a longer step delays every row in it while only the
/// verifying ones gain (measured: at 16 chat rows on 2 cores, charging
/// 1.0 verified a sixth of the steps and lost 13% against no speculation).
const SAFETY: f64 = 1.5;

/// A size's measured cost: a moving average, and how many measurements
/// it has seen.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Measured {
    secs: f64,
    count: u32,
}

/// Measured seconds of a decode step, by the tokens it ran (a moving
/// average per size).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepCosts {
    by_tokens: BTreeMap<usize, Measured>,
}

impl StepCosts {
    /// Records that a step of `tokens` tokens took `secs`.
    pub fn observe(&mut self, tokens: usize, secs: f64) {
        if tokens == 0 || !secs.is_finite() || secs <= 0.0 {
            return;
        }
        self.by_tokens
            .entry(tokens)
            .and_modify(|m| {
                m.secs += NEW_WEIGHT * (secs - m.secs);
                m.count = m.count.saturating_add(1);
            })
            .or_insert(Measured { secs, count: 1 });
    }

    /// The cost of a step of `tokens` tokens: measured, or interpolated
    /// between the nearest sizes measured; past the largest, that one's;
    /// below the smallest, that one's. `None` before any measurement.
    pub fn estimate(&self, tokens: usize) -> Option<f64> {
        let below = self.by_tokens.range(..=tokens).next_back();
        let above = self.by_tokens.range(tokens..).next();
        match (below, above) {
            (Some((&a, ta)), Some((&b, tb))) if b > a => {
                Some(ta.secs + (tb.secs - ta.secs) * (tokens - a) as f64 / (b - a) as f64)
            }
            (Some((_, m)), _) | (None, Some((_, m))) => Some(m.secs),
            (None, None) => None,
        }
    }

    /// Whether a step of `tokens` tokens was measured.
    fn measured(&self, tokens: usize) -> bool {
        self.by_tokens.contains_key(&tokens)
    }

    /// The line fitted by weighted least squares to the sizes measured in
    /// `from..=to` and the first one past `to` (as interpolation would
    /// reach for it): a step of `from` tokens' cost, and the seconds each
    /// token adds (never below zero). `None` while fewer than two such
    /// sizes are measured: then drafts are tried, and the sizes they run
    /// measured.
    pub fn line(&self, from: usize, to: usize) -> Option<Line> {
        let past = self.by_tokens.range(to.saturating_add(1)..).next();
        let points: Vec<(f64, f64, f64)> = (self.by_tokens.range(from..=to).chain(past))
            .map(|(&n, m)| (n as f64, m.secs, f64::from(m.count).min(MAX_WEIGHT)))
            .collect();
        if points.len() < 2 {
            return None;
        }
        let w: f64 = points.iter().map(|p| p.2).sum();
        let mean_n = points.iter().map(|p| p.2 * p.0).sum::<f64>() / w;
        let mean_t = points.iter().map(|p| p.2 * p.1).sum::<f64>() / w;
        let (mut cov, mut var) = (0.0, 0.0);
        for &(n, t, pw) in &points {
            cov += pw * (n - mean_n) * (t - mean_t);
            var += pw * (n - mean_n) * (n - mean_n);
        }
        let per_token = (cov / var).max(0.0);
        let at_from = mean_t - per_token * (mean_n - from as f64);
        Some(Line { at_from, per_token })
    }
}

/// A step's cost near one size, as [`StepCosts::line`] fits it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Line {
    /// Seconds of a step of the size the line starts at.
    pub at_from: f64,
    /// Seconds each token past it adds.
    pub per_token: f64,
}

/// One decoding row's draft, as the rule sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Offer {
    /// Draft tokens proposed.
    pub drafts: usize,
    /// The chance each is accepted, given the ones before it were.
    pub acceptance: f64,
}

/// How many of each offer's drafts to verify this step, in offer order:
/// `rows` decoding rows yield a token each without drafts; at most
/// `budget` drafts in all. With too little measured to fit a line, drafts
/// are tried so that steps of two sizes get measured.
pub fn drafts_to_verify(
    costs: &StepCosts,
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
    let rows = rows.max(1);
    let Some(line) = costs.line(rows, rows + gains.len()) else {
        // Too little measured to fit: every draft, or, where a step of
        // that size is what was measured, the better half of them, so the
        // next step has two sizes to fit.
        let all = rows + gains.len();
        let tried = match costs.measured(all) {
            true => gains.len() / 2,
            false => gains.len(),
        };
        return count(offers.len(), &gains[..tried]);
    };
    // A plain step's cost: as fitted (its size may not be measured yet, as
    // when every step so far verified), or measured where noise put the
    // line below zero.
    let plain = match line.at_from > 0.0 {
        true => line.at_from,
        false => costs.estimate(rows).unwrap_or(line.at_from),
    };
    if plain <= 0.0 {
        return count(offers.len(), &gains);
    }
    // Tokens the rows make without drafts in the time one draft takes.
    let cost = SAFETY * rows as f64 / plain * line.per_token;
    let (mut best, mut best_net) = (0, MARGIN * rows as f64);
    let mut gained = 0.0;
    for (n, &(g, _)) in gains.iter().enumerate() {
        gained += g;
        let net = gained - cost * (n + 1) as f64;
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

    fn rounded_ms(t: Option<f64>) -> Option<f64> {
        t.map(|t| (t * 1e3 * 1e6).round() / 1e6)
    }

    #[test]
    fn costs_are_measured_interpolated_and_flat_past_the_ends() {
        let c = costs(&[(1, 10.0), (11, 20.0)]);
        let ms = |n| rounded_ms(c.estimate(n));
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
    fn the_line_is_fitted_over_every_size_in_the_range() {
        // (name, measured (tokens, ms), range, expected ms a token)
        type Case = (&'static str, Vec<(usize, f64)>, (usize, usize), Option<f64>);
        let cases: Vec<Case> = vec![
            (
                "a line",
                vec![(16, 30.0), (32, 62.0), (48, 94.0)],
                (16, 64),
                Some(2.0),
            ),
            ("one size: unknown", vec![(16, 30.0)], (16, 64), None),
            (
                "below the range and past the first size after it: not counted",
                vec![(8, 1.0), (16, 30.0), (96, 190.0), (200, 1000.0)],
                (16, 64),
                Some(2.0),
            ),
            // One lucky size among five on a line of 2 ms a token: the fit
            // stays near 2, where reading 24 drafts' cost off that size
            // alone would say 0.67.
            (
                "one lucky size cannot make tokens cheap",
                vec![(16, 30.0), (24, 46.0), (32, 62.0), (40, 46.0), (48, 94.0)],
                (16, 64),
                Some(1.6),
            ),
            (
                "noise below a flat line: zero, not less",
                vec![(1, 10.0), (3, 9.0)],
                (1, 6),
                Some(0.0),
            ),
        ];
        for (name, points, (from, to), want) in cases {
            let got = rounded_ms(costs(&points).line(from, to).map(|l| l.per_token));
            assert_eq!(got, want, "{name}");
        }
        // The cost at the range's start comes off the line where that size
        // was never measured: 2 ms a token from 40 ms at 20 tokens.
        let line = costs(&[(20, 40.0), (24, 48.0)]).line(8, 20).unwrap();
        assert_eq!(rounded_ms(Some(line.at_from)), Some(16.0));
        // A size measured often weighs more than one measured once.
        let mut c = costs(&[(16, 30.0), (32, 62.0), (48, 30.0)]);
        for _ in 0..4 {
            c.observe(32, 0.062);
            c.observe(16, 0.030);
        }
        let slope = |c: &StepCosts| c.line(16, 64).unwrap().per_token;
        let once = slope(&costs(&[(16, 30.0), (32, 62.0), (48, 30.0)]));
        assert!(slope(&c) > once, "{once}");
    }

    #[test]
    fn the_rule_verifies_where_it_pays_and_nowhere_else() {
        // One row on a memory-bound device: a step of up to 6 tokens costs
        // barely more than one token's.
        let one_row = costs(&[(1, 10.0), (2, 10.3), (6, 11.0)]);
        // Sixteen rows, compute-bound: every token costs.
        let busy = costs(&[(16, 30.0), (32, 62.0), (96, 190.0)]);
        // (name, costs, rows, offers, budget, expected)
        type Case = (
            &'static str,
            StepCosts,
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
                vec![offer(5, 0.9)],
                512,
                vec![5],
            ),
            (
                "chat at one row: the drafts likely enough to cover their cost",
                one_row.clone(),
                1,
                vec![offer(5, 0.3)],
                512,
                vec![2],
            ),
            (
                "drafts that are never accepted: none",
                one_row.clone(),
                1,
                vec![offer(5, 0.0)],
                512,
                vec![0],
            ),
            (
                "sixteen chat rows, compute-bound: none",
                busy.clone(),
                16,
                vec![offer(5, 0.4); 16],
                512,
                vec![0; 16],
            ),
            (
                "sixteen rows copying at 0.99: still not worth five times the step",
                busy.clone(),
                16,
                vec![offer(5, 0.99); 16],
                512,
                vec![0; 16],
            ),
            (
                "the budget bounds the drafts, the best rows first",
                one_row.clone(),
                2,
                vec![offer(5, 0.5), offer(5, 0.95)],
                4,
                vec![0, 4],
            ),
            (
                "no measurement yet: every draft, to measure it",
                StepCosts::default(),
                3,
                vec![offer(2, 0.1), offer(0, 0.9), offer(3, 0.5)],
                512,
                vec![2, 0, 3],
            ),
            (
                "plain steps never measured: their cost comes off the line",
                costs(&[(40, 42.0), (48, 50.0)]),
                8,
                vec![offer(5, 0.3); 8],
                512,
                vec![0; 8],
            ),
            (
                "plain steps never measured: their cost comes off the line",
                costs(&[(40, 42.0), (48, 50.0)]),
                8,
                vec![offer(5, 0.3); 8],
                512,
                vec![0; 8],
            ),
            (
                "another size measured: every draft, to measure this one",
                costs(&[(16, 30.0)]),
                2,
                vec![offer(2, 0.1), offer(2, 0.2)],
                512,
                vec![2, 2],
            ),
            (
                "only every draft's size measured: the better half",
                costs(&[(6, 30.0)]),
                2,
                vec![offer(2, 0.1), offer(2, 0.2)],
                512,
                vec![1, 1],
            ),
        ];
        for (name, c, rows, offers, budget, want) in cases {
            assert_eq!(drafts_to_verify(&c, rows, &offers, budget), want, "{name}");
        }
    }
}
