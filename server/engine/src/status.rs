//! The operator-facing status lines. Pure: the caller passes `now` and the
//! facts, counted where they happened (admission, the decode step).

use std::time::Instant;

use ferrox_plan::CacheKind;

/// Gauges both lines carry.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BatchGauges {
    /// Rows prefilling or decoding.
    pub running: usize,
    /// Requests waiting for admission.
    pub queued: usize,
    /// Tokens held in the KV cache by running rows.
    pub tokens: usize,
    /// Each pool of the model's cache, by kind.
    pub pools: Vec<PoolGauge>,
}

/// One pool's blocks, for the lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolGauge {
    /// The pool's kind.
    pub kind: CacheKind,
    /// Blocks reserved.
    pub used: usize,
    /// Blocks in the pool.
    pub total: usize,
}

impl PoolGauge {
    /// Fraction reserved; 0 for an empty pool.
    pub fn usage(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.used as f64 / self.total as f64
        }
    }
}

impl BatchGauges {
    /// Fraction reserved of the fullest pool that holds tokens, the one
    /// that stops admission first; 0 with none.
    pub fn usage(&self) -> f64 {
        let tokens = self.pools.iter().filter(|p| p.kind.holds_tokens());
        tokens.map(PoolGauge::usage).fold(0.0, f64::max)
    }

    /// `, window usage: 0.10` (one figure per window pool), or nothing for a
    /// model without sliding-window layers: a pool it does not have is left
    /// out, not printed as zeros.
    fn window_usage(&self) -> String {
        let windows: Vec<String> = self
            .pools
            .iter()
            .filter(|p| p.kind.window().is_some())
            .map(|p| format!("{:.2}", p.usage()))
            .collect();
        let mut out = String::new();
        if !windows.is_empty() {
            out = format!(", window usage: {}", windows.join(" "));
        }
        // The reference's `recurrent` gauge: slots held of the pool.
        if let Some(r) = self.pools.iter().find(|p| p.kind == CacheKind::State) {
            out.push_str(&format!(", recurrent: {}/{}", r.used, r.total));
        }
        out
    }
}

/// What one admission round accepted, counted as each request was admitted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PrefillFacts {
    /// Requests admitted.
    pub new_seqs: usize,
    /// Prompt tokens they bring that must be computed.
    pub new_tokens: usize,
    /// Prompt tokens taken from the prefix cache instead.
    pub cached_tokens: usize,
    /// The first [`MAX_LINE_IDS`] admitted requests' ids, where they have one.
    pub ids: Vec<String>,
}

/// Request ids a prefill line names at most (the rest are counted).
pub const MAX_LINE_IDS: usize = 8;

/// The line logged on each admission round.
pub fn prefill_line(facts: &PrefillFacts, g: &BatchGauges) -> String {
    let mut line = format!(
        "Prefill batch, #new-seq: {}, #new-token: {}, #cached-token: {}, token usage: {:.2}{}, \
         #running-req: {}, #queue-req: {}",
        facts.new_seqs,
        facts.new_tokens,
        facts.cached_tokens,
        g.usage(),
        g.window_usage(),
        g.running,
        g.queued
    );
    if !facts.ids.is_empty() {
        line.push_str(", ids: ");
        line.push_str(&facts.ids.join(" "));
        // Admitted requests past the named ones (with or without an id).
        let more = facts.new_seqs.saturating_sub(facts.ids.len());
        if more > 0 {
            line.push_str(&format!(" +{more}"));
        }
    }
    line
}

/// Emits a decode line every `interval` steps, with the throughput since the
/// previous line (and, on a speculating server, the mean acceptance length
/// since then).
#[derive(Debug, Clone)]
pub struct DecodeReporter {
    interval: u64,
    steps: u64,
    tokens_since: u64,
    last_line_at: Instant,
    speculating: bool,
    /// Verifications and draft tokens they accepted since the last line.
    drafts_since: u64,
    accepted_since: u64,
}

impl DecodeReporter {
    /// A reporter whose first window starts at `now`; `interval` 0 disables it.
    pub fn new(interval: u64, now: Instant) -> Self {
        DecodeReporter {
            interval,
            steps: 0,
            tokens_since: 0,
            last_line_at: now,
            speculating: false,
            drafts_since: 0,
            accepted_since: 0,
        }
    }

    /// On a speculating server the lines carry the mean acceptance length.
    pub fn speculating(self, on: bool) -> Self {
        DecodeReporter {
            speculating: on,
            ..self
        }
    }

    /// Records a step's verifications: `drafts` rows verified drafts and
    /// `accepted` draft tokens were accepted.
    pub fn on_verified(&mut self, drafts: usize, accepted: usize) {
        self.drafts_since += drafts as u64;
        self.accepted_since += accepted as u64;
    }

    /// `, mean accept len: 2.31 (40 drafts)`: tokens a verification gave,
    /// its accepted drafts and the model's own token (vLLM's mean
    /// acceptance length), over the verifications since the last line.
    fn acceptance(&mut self) -> String {
        if !self.speculating {
            return String::new();
        }
        let (drafts, accepted) = (self.drafts_since, self.accepted_since);
        (self.drafts_since, self.accepted_since) = (0, 0);
        if drafts == 0 {
            return ", mean accept len: - (0 drafts)".to_string();
        }
        let mean = 1.0 + accepted as f64 / drafts as f64;
        format!(", mean accept len: {mean:.2} ({drafts} drafts)")
    }

    /// Records one decode step that generated `tokens`; returns a line every
    /// `interval` steps.
    pub fn on_step(&mut self, now: Instant, tokens: usize, g: &BatchGauges) -> Option<String> {
        self.steps += 1;
        self.tokens_since += tokens as u64;
        if self.interval == 0 || !self.steps.is_multiple_of(self.interval) {
            return None;
        }
        let secs = now
            .saturating_duration_since(self.last_line_at)
            .as_secs_f64();
        let throughput = if secs > 0.0 {
            self.tokens_since as f64 / secs
        } else {
            0.0
        };
        self.tokens_since = 0;
        self.last_line_at = now;
        Some(format!(
            "Decode batch, #running-req: {}, #token: {}, token usage: {:.2}{}, \
             gen throughput (token/s): {:.2}{}, #queue-req: {}",
            g.running,
            g.tokens,
            g.usage(),
            g.window_usage(),
            throughput,
            self.acceptance(),
            g.queued
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn kv(used: usize, total: usize) -> PoolGauge {
        PoolGauge {
            kind: CacheKind::Full,
            used,
            total,
        }
    }

    #[test]
    fn prefill_line_prints_the_facts() {
        let facts = PrefillFacts {
            new_seqs: 2,
            ids: Vec::new(),
            new_tokens: 37,
            cached_tokens: 0,
        };
        let g = BatchGauges {
            running: 3,
            queued: 4,
            tokens: 50,
            pools: vec![kv(5, 20)],
        };
        assert_eq!(
            prefill_line(&facts, &g),
            "Prefill batch, #new-seq: 2, #new-token: 37, #cached-token: 0, token usage: 0.25, \
             #running-req: 3, #queue-req: 4"
        );
        // Ids name the requests (the first MAX_LINE_IDS, the rest counted).
        let named = PrefillFacts {
            ids: vec!["chatcmpl-a".into(), "cmpl-b".into()],
            new_seqs: 3,
            ..facts
        };
        assert!(
            prefill_line(&named, &g).ends_with("#queue-req: 4, ids: chatcmpl-a cmpl-b +1"),
            "{}",
            prefill_line(&named, &g)
        );
    }

    #[test]
    fn decode_line_every_interval_with_throughput_since_the_last_line() {
        let t0 = Instant::now();
        let g = BatchGauges {
            running: 2,
            queued: 0,
            tokens: 10,
            pools: vec![kv(1, 4)],
        };
        let mut r = DecodeReporter::new(2, t0);
        assert_eq!(r.on_step(t0 + Duration::from_secs(1), 2, &g), None);
        let line = r.on_step(t0 + Duration::from_secs(2), 2, &g).unwrap();
        assert!(line.contains("gen throughput (token/s): 2.00"), "{line}");
        assert!(line.contains("#running-req: 2, #token: 10, token usage: 0.25"));
        // The next window measures only its own 4 tokens over 0.5 s.
        assert_eq!(r.on_step(t0 + Duration::from_millis(2250), 2, &g), None);
        let line = r.on_step(t0 + Duration::from_millis(2500), 2, &g).unwrap();
        assert!(line.contains("gen throughput (token/s): 8.00"), "{line}");
        let mut off = DecodeReporter::new(0, t0);
        assert_eq!(off.on_step(t0, 1, &g), None);
    }

    #[test]
    fn a_speculating_server_s_line_carries_the_mean_acceptance_length() {
        let t0 = Instant::now();
        let g = BatchGauges::default();
        let mut r = DecodeReporter::new(2, t0).speculating(true);
        // Two verifications accepting 3 and 0 drafts: 1 + 3/2 tokens each.
        r.on_verified(1, 3);
        assert_eq!(r.on_step(t0, 4, &g), None);
        r.on_verified(1, 0);
        let line = r.on_step(t0 + Duration::from_secs(1), 1, &g).unwrap();
        assert!(
            line.contains(
                "gen throughput (token/s): 5.00, mean accept len: 2.50 (2 drafts), #queue-req"
            ),
            "{line}"
        );
        // A window without a verification says so.
        r.on_step(t0, 1, &g);
        let line = r.on_step(t0 + Duration::from_secs(2), 1, &g).unwrap();
        assert!(line.contains("mean accept len: - (0 drafts)"), "{line}");
        // Not speculating: nothing about it.
        let mut plain = DecodeReporter::new(1, t0);
        assert!(!plain.on_step(t0, 1, &g).unwrap().contains("accept"));
    }

    #[test]
    fn a_window_pool_is_reported_beside_the_kv_pool() {
        let window = |used, total| PoolGauge {
            kind: CacheKind::Window(1024),
            used,
            total,
        };
        let facts = PrefillFacts {
            new_seqs: 1,
            new_tokens: 9,
            ..PrefillFacts::default()
        };
        // Token usage is the fuller pool's: the one admission stops on.
        let g = BatchGauges {
            running: 1,
            pools: vec![kv(1, 10), window(3, 10)],
            ..BatchGauges::default()
        };
        let line = prefill_line(&facts, &g);
        assert!(
            line.contains("token usage: 0.30, window usage: 0.30, #running-req: 1"),
            "{line}"
        );
        let g = BatchGauges {
            pools: vec![kv(8, 10), window(1, 10), window(5, 10)],
            ..g
        };
        let line = DecodeReporter::new(1, Instant::now())
            .on_step(Instant::now(), 1, &g)
            .unwrap();
        assert!(
            line.contains("token usage: 0.80, window usage: 0.10 0.50, gen throughput"),
            "{line}"
        );
        // No window pool, no window figure.
        let plain = BatchGauges {
            pools: vec![kv(1, 10)],
            ..g
        };
        assert!(!prefill_line(&facts, &plain).contains("window"));
        // A model with recurrent layers: its slots held, of the pool.
        let hybrid = BatchGauges {
            pools: vec![
                kv(1, 10),
                PoolGauge {
                    kind: CacheKind::State,
                    used: 3,
                    total: 8,
                },
            ],
            ..plain
        };
        let line = prefill_line(&facts, &hybrid);
        assert!(
            line.contains("token usage: 0.10, recurrent: 3/8, #running-req"),
            "{line}"
        );
    }
}
