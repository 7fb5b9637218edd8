//! An encoder attention layer's kind: attention's (scale, RoPE or none,
//! q/k norms, window) and whether a token sees the tokens after it.

use crate::mixer::attention::spec::AttentionSpec;

/// One encoder attention layer's kind.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderSpec {
    /// The attention it runs (its `window`, if any, bounds both sides).
    pub attention: AttentionSpec,
    /// Each token sees only itself and the tokens before it (a decoder
    /// pooled); `false`: every token of its sequence (an encoder).
    pub causal: bool,
}

impl EncoderSpec {
    /// Whether a query at `q` sees the key at `k` (positions in one
    /// sequence).
    pub fn sees(&self, q: usize, k: usize) -> bool {
        if self.causal && k > q {
            return false;
        }
        let a = &self.attention;
        a.window.is_none_or(|w| q.abs_diff(k) < w) && a.chunk.is_none_or(|c| q / c == k / c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(causal: bool, window: Option<usize>) -> EncoderSpec {
        EncoderSpec {
            attention: AttentionSpec {
                window,
                chunk: None,
                rope: 0,
                scale: 1.0,
                softcap: None,
                qk_norm: false,
                qk_norm_whole: false,
                qk_norm_weightless: false,
                sinks: false,
                nope: true,
                gated: false,
                temperature: None,
                kv: crate::spec::KvLayout::default(),
            },
            causal,
        }
    }

    #[test]
    fn a_query_sees_by_direction_and_window() {
        // (causal, window, query, key, sees)
        let cases = [
            (false, None, 0, 5, true),
            (false, None, 5, 0, true),
            (true, None, 0, 5, false),
            (true, None, 5, 0, true),
            (true, None, 3, 3, true),
            (false, Some(2), 3, 4, true),
            (false, Some(2), 3, 5, false),
            (true, Some(2), 3, 2, true),
            (true, Some(2), 3, 1, false),
        ];
        for (causal, window, q, k, want) in cases {
            assert_eq!(
                spec(causal, window).sees(q, k),
                want,
                "{causal} {window:?} {q} {k}"
            );
        }
    }
}
