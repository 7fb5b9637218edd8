//! Picks the next token from one row's logits, with that request's settings and
//! its own seeded RNG, so a seed gives the same output whatever else is batched.

use std::collections::{HashMap, HashSet};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::event::TokenLogprob;
use crate::params::SamplingParams;
use crate::ranking;

/// One request's sampler: settings, RNG and the counts penalties need.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    /// Tokens of the prompt, for the repetition penalty.
    prompt_seen: HashSet<u32>,
    /// Occurrences of each token in the output so far.
    output_counts: HashMap<u32, u32>,
}

/// The token picked and, if asked for, its logprobs.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The token.
    pub id: u32,
    /// Logprobs of the model's distribution (before sampling settings).
    pub logprob: Option<TokenLogprob>,
}

impl Sampler {
    /// A sampler for a request with this prompt.
    pub fn new(params: SamplingParams, prompt: &[u32]) -> Self {
        let prompt_seen = if params.repetition_penalty != 1.0 {
            prompt.iter().copied().collect()
        } else {
            HashSet::new()
        };
        Sampler {
            rng: StdRng::seed_from_u64(params.seed),
            params,
            prompt_seen,
            output_counts: HashMap::new(),
        }
    }

    /// Picks the next token and records it as part of the output.
    pub fn sample(&mut self, logits: &[f32]) -> Sampled {
        self.sample_masked(logits, logits)
    }

    /// Picks the next token from `masked` (the model's `logits` with the
    /// tokens a constraint forbids at negative infinity); the logprobs stay
    /// the model's, as with `logit_bias`.
    pub fn sample_masked(&mut self, logits: &[f32], masked: &[f32]) -> Sampled {
        let greedy = self.params.temperature == 0.0 || self.params.top_k == 1;
        let id = match (greedy, self.has_penalties()) {
            // The common paths: no copy of the vocabulary-wide row.
            (true, false) => ranking::argmax(masked),
            (false, false) => self.draw(masked),
            (_, true) => {
                let mut adjusted = masked.to_vec();
                self.apply_penalties(&mut adjusted);
                if greedy {
                    ranking::argmax(&adjusted)
                } else {
                    self.draw(&adjusted)
                }
            }
        };
        *self.output_counts.entry(id).or_insert(0) += 1;
        Sampled {
            id,
            logprob: self.params.logprobs.map(|k| logprob_of(logits, id, k)),
        }
    }

    fn has_penalties(&self) -> bool {
        let p = &self.params;
        p.repetition_penalty != 1.0
            || p.frequency_penalty != 0.0
            || p.presence_penalty != 0.0
            || !p.logit_bias.is_empty()
    }

    /// Penalties, then the caller's logit bias.
    fn apply_penalties(&self, logits: &mut [f32]) {
        let p = &self.params;
        for &(id, bias) in &p.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        if p.repetition_penalty != 1.0 {
            let seen = self.prompt_seen.iter().chain(self.output_counts.keys());
            for &id in seen.collect::<HashSet<_>>() {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = if *l > 0.0 {
                        *l / p.repetition_penalty
                    } else {
                        *l * p.repetition_penalty
                    };
                }
            }
        }
        if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
            for (&id, &count) in &self.output_counts {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l -= p.frequency_penalty * count as f32 + p.presence_penalty;
                }
            }
        }
    }

    /// Temperature, then top-k, min-p and top-p, then one draw.
    fn draw(&mut self, logits: &[f32]) -> u32 {
        ranking::candidates(logits, &self.params).pick(self.rng.random::<f32>())
    }
}

/// The logprob of `id` under `logits` and the `k` most likely tokens: what a
/// prompt token's entry reports.
pub fn logprob_of(logits: &[f32], id: u32, k: usize) -> TokenLogprob {
    let log_z = log_normaliser(logits);
    let own = logits
        .get(id as usize)
        .copied()
        .unwrap_or(f32::NEG_INFINITY);
    TokenLogprob {
        id,
        logprob: own - log_z,
        rank: 1 + logits.iter().filter(|&&l| l > own).count(),
        top: ranking::top_k(logits, k)
            .into_iter()
            .map(|(i, l)| (i, l - log_z))
            .collect(),
    }
}

/// log(sum(exp(logits))), the log-softmax's shift.
fn log_normaliser(logits: &[f32]) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    max + ranking::weight_sum(logits, max).ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut p = SamplingParams::default();
        f(&mut p);
        p
    }

    const LOGITS: [f32; 5] = [1.0, 3.0, 2.0, 0.5, 2.9];

    #[test]
    fn greedy_takes_the_argmax_and_ties_go_to_the_lowest_id() {
        let mut s = Sampler::new(params(|p| p.temperature = 0.0), &[]);
        assert_eq!(s.sample(&LOGITS).id, 1);
        assert_eq!(s.sample(&[1.0, 2.0, 2.0]).id, 1);
    }

    #[test]
    fn same_seed_same_draws_different_seed_differs_somewhere() {
        let draws = |seed| {
            let mut s = Sampler::new(params(|p| p.seed = seed), &[]);
            (0..64).map(|_| s.sample(&LOGITS).id).collect::<Vec<_>>()
        };
        assert_eq!(draws(7), draws(7));
        assert_ne!(draws(7), draws(8));
    }

    #[test]
    fn filters_restrict_the_candidates() {
        // (settings, allowed ids)
        let cases: Vec<(SamplingParams, Vec<u32>)> = vec![
            (params(|p| p.top_k = 2), vec![1, 4]),
            (params(|p| p.top_p = 0.3), vec![1]),
            (params(|p| p.min_p = 0.5), vec![1, 4]),
            (params(|p| p.min_p = 0.3), vec![1, 4, 2]),
            (params(|p| p.top_k = 1), vec![1]),
        ];
        for (p, allowed) in cases {
            let mut s = Sampler::new(p.clone(), &[]);
            for _ in 0..200 {
                let id = s.sample(&LOGITS).id;
                assert!(allowed.contains(&id), "{p:?} drew {id}");
            }
        }
    }

    #[test]
    fn penalties_move_greedy_off_repeated_tokens() {
        // Token 1 is in the prompt: a strong repetition penalty flips to 4.
        let mut s = Sampler::new(
            params(|p| {
                p.temperature = 0.0;
                p.repetition_penalty = 2.0
            }),
            &[1],
        );
        assert_eq!(s.sample(&LOGITS).id, 4);
        // Presence: once 1 is output, it loses 0.5 and 4 wins next time.
        let mut s = Sampler::new(
            params(|p| {
                p.temperature = 0.0;
                p.presence_penalty = 0.5
            }),
            &[],
        );
        assert_eq!(s.sample(&LOGITS).id, 1);
        assert_eq!(s.sample(&LOGITS).id, 4);
        // Frequency: each use costs 1.5, so 1, then 4, then 2 (2.0) leads.
        let mut s = Sampler::new(
            params(|p| {
                p.temperature = 0.0;
                p.frequency_penalty = 1.5
            }),
            &[],
        );
        let ids: Vec<u32> = (0..3).map(|_| s.sample(&LOGITS).id).collect();
        assert_eq!(ids, vec![1, 4, 2]);
    }

    #[test]
    fn logit_bias_moves_the_pick_and_leaves_the_logprobs() {
        // (bias, temperature, allowed ids)
        type Bias = Vec<(u32, f32)>;
        let cases: [(Bias, f32, Vec<u32>); 4] = [
            (vec![], 0.0, vec![1]),
            (vec![(3, 5.0)], 0.0, vec![3]),
            (vec![(1, -100.0), (4, -100.0)], 0.0, vec![2]),
            (vec![(0, 100.0)], 1.0, vec![0]),
        ];
        for (bias, temperature, allowed) in cases {
            let mut s = Sampler::new(
                params(|p| {
                    p.temperature = temperature;
                    p.logit_bias = bias.clone();
                    p.logprobs = Some(1);
                }),
                &[],
            );
            for _ in 0..50 {
                let got = s.sample(&LOGITS);
                assert!(allowed.contains(&got.id), "{bias:?} drew {}", got.id);
                assert_eq!(got.logprob.unwrap().top[0].0, 1, "logprobs are the model's");
            }
        }
    }

    #[test]
    fn logprobs_are_of_the_model_distribution() {
        let mut s = Sampler::new(
            params(|p| {
                p.temperature = 0.0;
                p.logprobs = Some(2)
            }),
            &[],
        );
        let lp = s.sample(&LOGITS).logprob.unwrap();
        let z: f32 = LOGITS.iter().map(|l| l.exp()).sum();
        assert!((lp.logprob - (3.0 - z.ln())).abs() < 1e-5);
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 4]);
        assert!(lp.top[0].1 >= lp.top[1].1);
        assert_eq!(lp.rank, 1);
        // Ranks count the tokens above: 1 + how many are more likely.
        for (id, rank) in [
            (1, 1),
            (0, LOGITS.iter().filter(|&&l| l > LOGITS[0]).count() + 1),
        ] {
            assert_eq!(logprob_of(&LOGITS, id, 0).rank, rank, "{id}");
        }
    }
}
