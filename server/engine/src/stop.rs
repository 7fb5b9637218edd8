//! Stop strings matched across token boundaries.
//!
//! Text that might still turn into a stop is held back rather than sent and
//! later taken back: a streaming client cannot un-receive bytes.

/// What one piece of text did to the matcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopStep {
    /// No stop yet; this text is safe to send (possibly empty).
    Emit(String),
    /// A stop matched; this is the text before it, and the stop itself
    /// when the matcher keeps stops.
    Matched(String),
}

/// Holds back the tail that is a prefix of some stop string.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    /// Keep the matched stop in the text (`include_stop_str_in_output`).
    keep_stop: bool,
}

impl StopMatcher {
    /// A matcher for `stops`; empty strings are ignored. With `keep_stop`
    /// a match ends the text after the stop instead of before it.
    pub fn new(stops: &[String], keep_stop: bool) -> Self {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
            keep_stop,
        }
    }

    /// Feeds the text of the next token (whole characters only).
    pub fn push(&mut self, piece: &str) -> StopStep {
        self.held.push_str(piece);
        // Everything held was, before this piece, a strict prefix of a stop,
        // so the earliest match anywhere in `held` is the first real one.
        let earliest = (self.stops.iter())
            .filter_map(|s| self.held.find(s).map(|at| (at, s.len())))
            .min_by_key(|&(at, len)| (at, std::cmp::Reverse(len)));
        if let Some((at, len)) = earliest {
            let end = if self.keep_stop { at + len } else { at };
            let text = self.held[..end].to_string();
            self.held.clear();
            return StopStep::Matched(text);
        }
        StopStep::Emit(self.release_safe())
    }

    /// Feeds the text of the next token without matching whole stops (the
    /// output is not allowed to end yet): returns what is safe to send, and
    /// still holds a tail that may begin a stop.
    pub fn push_unmatched(&mut self, piece: &str) -> String {
        self.held.push_str(piece);
        self.release_safe()
    }

    /// Takes the held text up to the tail that may still begin a stop.
    fn release_safe(&mut self) -> String {
        let keep = self.partial_len();
        let safe = self.held.len() - keep;
        self.held.drain(..safe).collect()
    }

    /// Releases whatever is held (the output ended some other way).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Bytes at the end of `held` that begin some stop string.
    fn partial_len(&self) -> usize {
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let max_keep = longest.saturating_sub(1).min(self.held.len());
        (1..=max_keep)
            .rev()
            .find(|&k| {
                let start = self.held.len() - k;
                self.held.is_char_boundary(start)
                    && self
                        .stops
                        .iter()
                        .any(|s| s.starts_with(&self.held[start..]))
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces` and returns (text sent, matched?).
    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops, false);
        let mut sent = Vec::new();
        for p in pieces {
            match m.push(p) {
                StopStep::Emit(t) => sent.push(t),
                StopStep::Matched(t) => {
                    sent.push(t);
                    return (sent, true);
                }
            }
        }
        sent.push(m.finish());
        (sent, false)
    }

    #[test]
    fn table() {
        // (stops, pieces, expected pieces sent, matched)
        type Case<'a> = (&'a [&'a str], &'a [&'a str], &'a [&'a str], bool);
        let cases: &[Case] = &[
            // A stop split across three tokens; nothing of it is ever sent.
            (
                &["END"],
                &["ab", "E", "N", "D", "zz"],
                &["ab", "", "", ""],
                true,
            ),
            // A partial match that turns out not to be one is released whole.
            (&["END"], &["ab", "EN", "x"], &["ab", "", "ENx", ""], false),
            // Held text released when the output ends another way.
            (&["END"], &["ab", "EN"], &["ab", "", "EN"], false),
            // Several stops: the earliest in the text wins.
            (&["cd", "b"], &["a", "bcd"], &["a", ""], true),
            (&["xyz", "yz!"], &["0xy", "z!"], &["0", ""], true),
            // The stop in the middle of a token; the token's tail is dropped.
            (&["\n\n"], &["Hi.\n", "\nMore"], &["Hi.", ""], true),
            // Multi-byte characters: held while they may begin a stop, released
            // whole (never split) once they cannot.
            (&["é!"], &["caf", "é", "?"], &["caf", "", "é?", ""], false),
            (&["日本"], &["a日", "本b"], &["a", ""], true),
            (&["日本"], &["a日", "x"], &["a", "日x", ""], false),
            // No stops: everything goes straight through.
            (&[], &["a", "b"], &["a", "b", ""], false),
            (&[""], &["a"], &["a", ""], false),
        ];
        for (i, (stops, pieces, want, matched)) in cases.iter().enumerate() {
            let (sent, did) = run(stops, pieces);
            let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
            assert_eq!(
                (&sent, did),
                (&want, *matched),
                "case {i}: {stops:?} {pieces:?}"
            );
        }
    }

    #[test]
    fn a_kept_stop_ends_the_text_and_unmatched_pushes_only_hold() {
        let stops = vec!["END".to_string(), "EN!".to_string()];
        let mut m = StopMatcher::new(&stops, true);
        assert_eq!(m.push("abE"), StopStep::Emit("ab".into()));
        assert_eq!(m.push("NDzz"), StopStep::Matched("END".into()));
        // Unmatched (before min_tokens): a whole stop is sent as text, a
        // tail that may begin one is still held.
        let mut m = StopMatcher::new(&stops, false);
        assert_eq!(m.push_unmatched("xENDyE"), "xENDy");
        assert_eq!(m.push_unmatched("N"), "");
        assert_eq!(m.push("D"), StopStep::Matched(String::new()));
    }

    #[test]
    fn sent_text_is_always_a_prefix_of_the_final_text() {
        let stops = vec!["<|im_end|>".to_string()];
        let text = "one <|im two <|im_end|> three";
        let mut m = StopMatcher::new(&stops, false);
        let mut sent = String::new();
        for ch in text.chars() {
            match m.push(&ch.to_string()) {
                StopStep::Emit(t) => sent.push_str(&t),
                StopStep::Matched(t) => {
                    sent.push_str(&t);
                    break;
                }
            }
            assert!(text.starts_with(&sent));
        }
        assert_eq!(sent, "one <|im two ");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 2000,
            failure_persistence: None,
            ..Default::default()
        })]

        /// Over any stream of pieces: what is sent is always a prefix of the
        /// text, never holds a stop, never lags by a whole stop, and at the end
        /// is the text up to its first stop (stop excluded), or all of it.
        #[test]
        fn sent_text_is_the_text_before_the_first_stop(
            stops in proptest::collection::vec("[ab日]{0,4}", 0..4),
            pieces in proptest::collection::vec("[ab日c]{0,3}", 0..24),
        ) {
            let mut m = StopMatcher::new(&stops, false);
            let live: Vec<&String> = stops.iter().filter(|s| !s.is_empty()).collect();
            let longest = live.iter().map(|s| s.len()).max().unwrap_or(0);
            let (mut seen, mut sent, mut matched) = (String::new(), String::new(), false);
            for p in &pieces {
                seen.push_str(p);
                match m.push(p) {
                    StopStep::Emit(t) => sent.push_str(&t),
                    StopStep::Matched(t) => {
                        sent.push_str(&t);
                        matched = true;
                        break;
                    }
                }
                proptest::prop_assert!(seen.starts_with(&sent));
                proptest::prop_assert!(seen.len() - sent.len() < longest.max(1));
                proptest::prop_assert!(live.iter().all(|s| !sent.contains(s.as_str())));
            }
            let first = live.iter().filter_map(|s| seen.find(s.as_str())).min();
            if matched {
                proptest::prop_assert_eq!(Some(sent.len()), first);
                proptest::prop_assert!(seen.starts_with(&sent));
            } else {
                proptest::prop_assert_eq!(first, None);
                sent.push_str(&m.finish());
                proptest::prop_assert_eq!(sent, seen);
            }
        }
    }
}
