//! The choice rule: which ready endpoint gets a request.
//!
//! 1. Only endpoints within the load [`Bounds`] are eligible, unless none
//!    is: then all are, and the reason says `saturated`. Stricter than
//!    "over-bound endpoints get no *new* prefix": a hot prefix on a
//!    saturated replica then spreads to a second replica, which is what
//!    more load on one prompt wants.
//! 2. With the prompt's block chain known: the eligible endpoint holding the
//!    longest leading run of it (`prefix-hit`). With no endpoint holding
//!    any, a new prefix is placed by consistent hashing with bounded load on
//!    its first block's hash (`new-prefix`): prefixes spread evenly, and two
//!    routers place one prefix alike. A prompt shorter than a block goes to
//!    the least loaded (`least-load`).
//! 3. Without a chain (no tokenizer for the model): consistent hashing with
//!    bounded load on the prompt's leading characters (`hash-fallback`).
//! 4. Ties: least in flight, then the name, so two routers with the same
//!    view choose alike.

use std::cmp::Reverse;

use crate::chwbl;
use crate::load::{Bounds, Load};

/// One ready endpoint as the rule sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate<'a> {
    /// Its name (the pod, or the URL of a static endpoint).
    pub name: &'a str,
    /// How busy it is.
    pub load: Load,
    /// Leading blocks of the prompt's chain it holds (0 without a chain).
    pub held: usize,
}

/// What the rule keys affinity on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Affinity<'a> {
    /// The prompt's chained block hashes are known: `Candidate::held`
    /// counts; the string keys a new prefix's placement (its first block's
    /// hash; empty when the prompt has no full block).
    Blocks(&'a str),
    /// No tokenizer: hash these leading characters of the prompt.
    Text(&'a str),
}

/// Why an endpoint was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// It holds the longest run of the prompt's blocks.
    PrefixHit,
    /// No eligible endpoint holds any block: placed by hashing its first.
    NewPrefix,
    /// No full block to key on: the least loaded.
    LeastLoad,
    /// No tokenizer: consistent hashing with bounded load.
    HashFallback,
    /// Every endpoint is over a bound; chosen among all by the same rule.
    Saturated,
}

impl Reason {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::PrefixHit => "prefix-hit",
            Reason::NewPrefix => "new-prefix",
            Reason::LeastLoad => "least-load",
            Reason::HashFallback => "hash-fallback",
            Reason::Saturated => "saturated",
        }
    }
}

/// A run's score, ordered totally (NaN, never made, ranks lowest).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Score(f64);

impl Eq for Score {}

impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Score {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        let key = |v: f64| if v.is_nan() { f64::NEG_INFINITY } else { v };
        key(self.0).total_cmp(&key(other.0))
    }
}

/// The rule's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Index into the candidates.
    pub index: usize,
    /// Why.
    pub reason: Reason,
    /// Blocks of the prompt the chosen endpoint is predicted to hold.
    pub predicted_hit_blocks: usize,
    /// Of those, how many each KV tier (device, host, disk) is the best
    /// holder of: the table's to fill (`choose` knows runs, not tiers).
    pub predicted_by_tier: [usize; 3],
}

/// Chooses among `candidates` (the ready endpoints of one model); `None`
/// only when there are none. `load_factor` bounds the hash fallback.
pub fn choose(
    candidates: &[Candidate<'_>],
    affinity: Affinity<'_>,
    bounds: &Bounds,
    load_factor: f64,
) -> Option<Decision> {
    let scores: Vec<f64> = candidates.iter().map(|c| c.held as f64).collect();
    choose_weighted(candidates, &scores, affinity, bounds, load_factor)
}

/// [`choose`] with each held run scored: `scores[i]` ranks candidate `i`'s
/// run (its blocks each weighted by the best KV tier holding it), ahead of
/// the run's length, so a device hit outranks a lower tier's of the same
/// length and a long enough lower run outranks a short device one.
pub fn choose_weighted(
    candidates: &[Candidate<'_>],
    scores: &[f64],
    affinity: Affinity<'_>,
    bounds: &Bounds,
    load_factor: f64,
) -> Option<Decision> {
    if candidates.is_empty() || scores.len() != candidates.len() {
        return None;
    }
    let within: Vec<usize> = (0..candidates.len())
        .filter(|&i| !bounds.exceeded_by(&candidates[i].load))
        .collect();
    let saturated = within.is_empty();
    let pool: Vec<usize> = if saturated {
        (0..candidates.len()).collect()
    } else {
        within
    };
    let hashed = |key: &str| {
        let names: Vec<&str> = pool.iter().map(|&i| candidates[i].name).collect();
        let loads: Vec<usize> = pool.iter().map(|&i| candidates[i].load.in_flight).collect();
        chwbl::pick(&names, &loads, key, load_factor).map(|at| pool[at])
    };
    let (index, reason) = match affinity {
        Affinity::Text(text) => (hashed(chwbl::prompt_key(text))?, Reason::HashFallback),
        Affinity::Blocks(first) => {
            let best = *pool.iter().min_by_key(|&&i| {
                let c = &candidates[i];
                let score = Score(scores[i]);
                (Reverse(score), Reverse(c.held), c.load.in_flight, c.name)
            })?;
            if candidates[best].held > 0 {
                (best, Reason::PrefixHit)
            } else if !first.is_empty() {
                (hashed(first)?, Reason::NewPrefix)
            } else {
                (best, Reason::LeastLoad)
            }
        }
    };
    Some(Decision {
        index,
        reason: if saturated { Reason::Saturated } else { reason },
        predicted_hit_blocks: match affinity {
            Affinity::Blocks(_) => candidates[index].held,
            Affinity::Text(_) => 0,
        },
        predicted_by_tier: [0; 3],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(name: &str, held: usize, in_flight: usize, waiting: usize, kv: f64) -> Candidate<'_> {
        Candidate {
            name,
            held,
            load: Load {
                in_flight,
                waiting,
                kv_usage: kv,
            },
        }
    }

    const B: Bounds = Bounds {
        max_waiting: 2,
        max_kv_usage: 0.8,
        max_in_flight: 10,
    };

    #[test]
    fn the_rule_table() {
        // (case, candidates, chosen name, reason, predicted hit blocks)
        let cases: Vec<(&str, Vec<Candidate<'_>>, &str, Reason, usize)> = vec![
            (
                "longest hit wins over less load",
                vec![
                    c("a", 2, 0, 0, 0.1),
                    c("b", 5, 3, 1, 0.5),
                    c("c", 0, 0, 0, 0.0),
                ],
                "b",
                Reason::PrefixHit,
                5,
            ),
            (
                "a hit on an over-bound endpoint (queue) is passed over",
                vec![c("a", 2, 0, 0, 0.1), c("b", 5, 3, 3, 0.5)],
                "a",
                Reason::PrefixHit,
                2,
            ),
            (
                "KV usage over the bound counts as over",
                vec![c("a", 0, 5, 0, 0.2), c("b", 9, 0, 0, 0.95)],
                "a",
                Reason::LeastLoad,
                0,
            ),
            (
                "in-flight over the bound counts as over",
                vec![c("a", 0, 5, 0, 0.2), c("b", 9, 11, 0, 0.1)],
                "a",
                Reason::LeastLoad,
                0,
            ),
            (
                "no hit anywhere: least in flight",
                vec![
                    c("a", 0, 4, 0, 0.1),
                    c("b", 0, 1, 0, 0.7),
                    c("c", 0, 2, 0, 0.0),
                ],
                "b",
                Reason::LeastLoad,
                0,
            ),
            (
                "equal hits: least in flight, then name",
                vec![
                    c("b", 3, 1, 0, 0.1),
                    c("a", 3, 1, 0, 0.1),
                    c("c", 3, 0, 2, 0.1),
                ],
                "c",
                Reason::PrefixHit,
                3,
            ),
            (
                "full tie: the name",
                vec![c("b", 3, 1, 0, 0.1), c("a", 3, 1, 0, 0.1)],
                "a",
                Reason::PrefixHit,
                3,
            ),
            (
                "all over a bound: the same rule over all",
                vec![c("a", 1, 0, 5, 0.1), c("b", 4, 2, 0, 0.99)],
                "b",
                Reason::Saturated,
                4,
            ),
        ];
        for (case, cands, name, reason, hit) in cases {
            let d = choose(&cands, Affinity::Blocks(""), &B, 1.25).unwrap();
            assert_eq!(cands[d.index].name, name, "{case}");
            assert_eq!(d.reason, reason, "{case}");
            assert_eq!(d.predicted_hit_blocks, hit, "{case}");
        }
    }

    #[test]
    fn an_endpoint_leaving_moves_its_prompts_to_the_next_best() {
        let all = vec![
            c("a", 1, 0, 0, 0.1),
            c("b", 6, 2, 0, 0.1),
            c("c", 3, 0, 0, 0.1),
        ];
        let d = choose(&all, Affinity::Blocks("k"), &B, 1.25).unwrap();
        assert_eq!(all[d.index].name, "b");
        // b goes (deleted, or no longer ready): the next longest run.
        let left: Vec<_> = all.iter().filter(|x| x.name != "b").cloned().collect();
        let d = choose(&left, Affinity::Blocks("k"), &B, 1.25).unwrap();
        assert_eq!((left[d.index].name, d.reason), ("c", Reason::PrefixHit));
        assert_eq!(choose(&[], Affinity::Blocks("k"), &B, 1.25), None);
    }

    #[test]
    fn new_prefixes_spread_by_their_first_block_and_stay_put() {
        let idle = vec![
            c("a", 0, 0, 0, 0.0),
            c("b", 0, 0, 0, 0.0),
            c("c", 0, 0, 0, 0.0),
        ];
        let mut seen = std::collections::BTreeSet::new();
        for k in 0..30 {
            let key = format!("{k:064x}");
            let d = choose(&idle, Affinity::Blocks(&key), &B, 1.25).unwrap();
            assert_eq!(d.reason, Reason::NewPrefix);
            assert_eq!(d, choose(&idle, Affinity::Blocks(&key), &B, 1.25).unwrap());
            seen.insert(d.index);
        }
        assert_eq!(seen.len(), 3, "30 new prefixes reach every endpoint");
        // Over its bound, the key's endpoint passes it on.
        let key = format!("{:064x}", 7);
        let home = choose(&idle, Affinity::Blocks(&key), &B, 1.25)
            .unwrap()
            .index;
        let mut busy = idle.clone();
        busy[home].load.in_flight = 11;
        assert_ne!(
            choose(&busy, Affinity::Blocks(&key), &B, 1.25)
                .unwrap()
                .index,
            home
        );
    }

    #[test]
    fn without_a_tokenizer_the_prompt_opening_decides() {
        let cands = vec![
            c("a", 0, 0, 0, 0.0),
            c("b", 0, 0, 0, 0.0),
            c("c", 0, 0, 0, 0.0),
        ];
        let text = "You are a terse assistant. ".repeat(20);
        let d = choose(&cands, Affinity::Text(&text), &B, 1.25).unwrap();
        assert_eq!(d.reason, Reason::HashFallback);
        // Different endings, same opening: same endpoint.
        let other = format!("{text} and then something else");
        let e = choose(&cands, Affinity::Text(&other), &B, 1.25).unwrap();
        assert_eq!(e.index, d.index);
        // Its endpoint over a bound: another one, still by hash.
        let mut busy = cands.clone();
        busy[d.index].load.waiting = 9;
        let f = choose(&busy, Affinity::Text(&text), &B, 1.25).unwrap();
        assert_ne!(f.index, d.index);
        assert_eq!(
            (f.reason, f.predicted_hit_blocks),
            (Reason::HashFallback, 0)
        );
    }
}
