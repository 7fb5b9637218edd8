//! One row's parse state: the masks it allows and the tokens it took.

use ferrox_engine::TokenConstraint;
use llguidance::Matcher;
use llguidance::toktrie::SimpleVob;

use crate::GrammarError;

/// A compiled grammar and where the output is in it. Cloning gives an
/// independent state over the same compiled grammar.
#[derive(Clone)]
pub struct GrammarMatcher {
    matcher: Matcher,
    /// The next mask, when already computed (the first one, at compile).
    next: Option<SimpleVob>,
}

impl std::fmt::Debug for GrammarMatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarMatcher")
            .field("finished", &self.matcher.is_stopped())
            .finish_non_exhaustive()
    }
}

impl GrammarMatcher {
    /// Computes the first mask; a grammar that fails there (or allows
    /// nothing at all) does not compile.
    pub(crate) fn start(mut matcher: Matcher) -> Result<Self, GrammarError> {
        let first = matcher
            .compute_mask()
            .map_err(|e| GrammarError::Compile(e.to_string()))?;
        if first.is_zero() {
            return Err(GrammarError::Compile(
                "the grammar allows no output at all".into(),
            ));
        }
        Ok(GrammarMatcher {
            matcher,
            next: Some(first),
        })
    }

    /// The ids allowed next, as a bit set over the grammar's vocabulary.
    pub fn allowed(&mut self) -> Result<SimpleVob, String> {
        if let Some(mask) = self.next.take() {
            return Ok(mask);
        }
        if self.matcher.is_stopped() {
            return Err("the output is already complete".into());
        }
        let mask = self.matcher.compute_mask().map_err(|e| e.to_string())?;
        if mask.is_zero() {
            return Err("the grammar allows no further token".into());
        }
        Ok(mask)
    }
}

impl TokenConstraint for GrammarMatcher {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let allowed = self.allowed()?;
        apply_mask(&allowed, logits);
        Ok(())
    }

    fn advance(&mut self, id: u32) -> Result<(), String> {
        self.next = None;
        self.matcher.consume_token(id).map_err(|e| e.to_string())
    }

    fn allowed_prefix(&mut self, tokens: &[u32]) -> usize {
        // An error validating means none is known to be allowed.
        self.matcher.validate_tokens(tokens).unwrap_or(0)
    }

    fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    fn fork(&self) -> Box<dyn TokenConstraint> {
        Box::new(self.clone())
    }
}

/// Sets every logit whose bit is clear, or which is past the set, to -inf.
pub fn apply_mask(allowed: &SimpleVob, logits: &mut [f32]) {
    let words = allowed.as_slice();
    for (w, chunk) in logits.chunks_mut(32).enumerate() {
        let bits = words.get(w).copied().unwrap_or(0);
        if bits == u32::MAX {
            continue;
        }
        for (b, l) in chunk.iter_mut().enumerate() {
            if bits & (1 << b) == 0 {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allowed_prefix_of_a_draft_is_found_without_advancing() {
        use crate::fixtures::{compile, feed};
        let spec = crate::GrammarSpec::JsonSchema(serde_json::json!({"type": "boolean"}));
        let mut m = compile(spec);
        let bytes = |t: &str| t.bytes().map(u32::from).collect::<Vec<_>>();
        // "tr" then "x": two allowed, the third refused.
        assert_eq!(m.allowed_prefix(&bytes("trx")), 2);
        assert_eq!(m.allowed_prefix(&bytes("false")), 5);
        assert_eq!(m.allowed_prefix(&bytes("x")), 0);
        // Nothing was consumed: the whole word still parses from the start.
        feed(&mut m, "true").unwrap();
        assert_eq!(m.allowed_prefix(&bytes("e")), 0);
    }

    #[test]
    fn apply_keeps_only_the_set_bits_and_nothing_past_the_set() {
        let mut allowed = SimpleVob::alloc(40);
        for id in [0, 5, 31, 32, 39] {
            allowed.allow_token(id);
        }
        let mut logits = vec![1.0; 70];
        apply_mask(&allowed, &mut logits);
        let kept: Vec<usize> = (0..70).filter(|&i| logits[i].is_finite()).collect();
        assert_eq!(kept, vec![0, 5, 31, 32, 39]);
    }
}
