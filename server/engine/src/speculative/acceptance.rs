//! How often drafts are accepted, as the pay-off rule needs it: the chance
//! that a draft token is accepted once those before it were, estimated
//! from recent verifications with older ones fading, and pulled towards a
//! prior while there is little to go on.

/// Weight, in draft positions, of the prior in an estimate.
const PRIOR_WEIGHT: f64 = 2.0;

/// The chance a draft token is accepted, for one row (or, as the prior
/// of new rows, for all of them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Acceptance {
    /// Draft positions accepted, faded.
    hits: f64,
    /// Draft positions decided (accepted, or the one rejected), faded.
    tries: f64,
    /// What each verification keeps of the counts before it.
    keep: f64,
}

impl Acceptance {
    /// No verification yet; each one keeps `keep` (in (0, 1]) of the
    /// counts before it.
    pub fn new(keep: f64) -> Self {
        Acceptance {
            hits: 0.0,
            tries: 0.0,
            keep: keep.clamp(f64::MIN_POSITIVE, 1.0),
        }
    }

    /// Records one verification: `accepted` of `drafted` tokens. Every
    /// accepted position was decided, and so was the first rejected one;
    /// those after it never were.
    pub fn record(&mut self, accepted: usize, drafted: usize) {
        let rejected = usize::from(accepted < drafted);
        self.hits = self.hits * self.keep + accepted as f64;
        self.tries = self.tries * self.keep + (accepted + rejected) as f64;
    }

    /// The chance the next draft token is accepted, `prior` standing in
    /// for what has not been seen.
    pub fn estimate(&self, prior: f64) -> f64 {
        (self.hits + PRIOR_WEIGHT * prior) / (self.tries + PRIOR_WEIGHT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_moves_from_the_prior_to_what_was_seen() {
        let mut a = Acceptance::new(1.0);
        assert_eq!(a.estimate(0.5), 0.5);
        // 8 of 10 drafts accepted over 2 verifications (5/5, then 3 and a
        // rejection): 8 hits in 9 decided positions.
        a.record(5, 5);
        a.record(3, 5);
        assert!((a.estimate(0.5) - 9.0 / 11.0).abs() < 1e-12);
        // Many rejections at the first position: towards 0.
        for _ in 0..100 {
            a.record(0, 4);
        }
        assert!(a.estimate(0.5) < 0.1);
    }

    #[test]
    fn old_verifications_fade() {
        // Good, then bad: with fading the estimate follows the recent bad.
        let (mut fading, mut flat) = (Acceptance::new(0.8), Acceptance::new(1.0));
        for a in [&mut fading, &mut flat] {
            for _ in 0..50 {
                a.record(5, 5);
            }
            for _ in 0..10 {
                a.record(0, 5);
            }
        }
        assert!(fading.estimate(0.5) < 0.5, "{}", fading.estimate(0.5));
        assert!(flat.estimate(0.5) > 0.9, "{}", flat.estimate(0.5));
    }
}
