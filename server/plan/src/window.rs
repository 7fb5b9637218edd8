//! Sliding-window layers: which layers of a model keep only their window's KV,
//! and how many blocks one sequence reserves in a windowed group.
//!
//! A layer with window `w` attends, from position `p`, to positions
//! `p - w + 1 ..= p` (Hugging Face's rule). The worker gives a windowed group's
//! blocks back at each step boundary once every position they hold is below
//! `next - w`, where `next` is the first position the step computes (one
//! position more than the attention reads: a margin, so the two never
//! disagree by one). A step computes at most one prefill chunk of `C` tokens
//! for a row, so before a step a row holds the blocks of positions
//! `next - w ..= next + C - 1`: `w + C` positions, which touch at most
//! `ceil((w + C - 1) / block_size) + 1` blocks (a run of `L` positions crosses
//! `ceil((L - 1) / block_size)` block edges). That is the row's reservation in
//! the group ([`window_blocks`]), or its whole length's blocks when shorter:
//! every block it may hold at once, so it never runs dry mid-sequence.

use serde::{Deserialize, Serialize};

use crate::{ModelGeometry, blocks_for};

/// Layers that attend over a sliding window of their last `window` tokens
/// (the model's other layers attend to the whole sequence).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SlidingWindow {
    /// Tokens each of these layers attends to, its own included.
    #[cfg_attr(feature = "schemars", schemars(range(min = 1)))]
    pub window: u64,
    /// How many layers have this window.
    #[cfg_attr(feature = "schemars", schemars(range(min = 1)))]
    pub layers: u64,
}

/// Blocks one sequence reserves in a group of window `window`: the window
/// plus one prefill chunk, page-aligned (see the module note for the
/// arithmetic). Saturating.
pub fn window_blocks(window: u64, prefill_chunk: u64, block_size: u64) -> u64 {
    let run = window.saturating_add(prefill_chunk.max(1));
    (run - 1).div_ceil(block_size.max(1)).saturating_add(1)
}

/// Whether a window of `window` tokens ever slides in a model of `context`
/// tokens; one that does not is full attention (Phi-4-mini's 262,144 in a
/// 131,072-token context).
pub fn slides(window: u64, context: u64) -> bool {
    window < context
}

/// One KV group: layers of one attention kind, whose blocks come from one
/// pool. `window: None` is full attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KvGroupGeometry {
    /// The window, or `None` for full attention.
    pub window: Option<u64>,
    /// Layers in the group.
    pub layers: u64,
}

impl KvGroupGeometry {
    /// Blocks a sequence of `tokens` tokens reserves in this group.
    pub fn seq_blocks(&self, tokens: u64, prefill_chunk: u64, block_size: u64) -> u64 {
        let whole = blocks_for(tokens, block_size);
        match self.window {
            None => whole,
            Some(w) => whole.min(window_blocks(w, prefill_chunk, block_size)),
        }
    }
}

impl ModelGeometry {
    /// Bytes of K and V one token takes in one layer.
    pub fn layer_kv_bytes_per_token(&self) -> u64 {
        2 * self.kv_heads * self.head_dim * self.kv_dtype.bytes()
    }

    /// Layers with no window that slides: the attention layers less the
    /// windowed ones.
    pub fn full_layers(&self) -> u64 {
        let windowed: u64 = self
            .sliding_windows
            .iter()
            .filter(|s| slides(s.window, self.context_length))
            .map(|s| s.layers)
            .sum();
        self.attention_layers().saturating_sub(windowed)
    }

    /// The KV groups, in the order every part of the server lists them: full
    /// attention first (when any layer has it), then each window, smallest
    /// first, one group per window size; a window that does not slide counts
    /// as full attention.
    pub fn kv_groups(&self) -> Vec<KvGroupGeometry> {
        let mut windows: Vec<KvGroupGeometry> = Vec::new();
        for s in &self.sliding_windows {
            if !slides(s.window, self.context_length) || s.layers == 0 {
                continue;
            }
            match windows.iter_mut().find(|g| g.window == Some(s.window)) {
                Some(g) => g.layers += s.layers,
                None => windows.push(KvGroupGeometry {
                    window: Some(s.window),
                    layers: s.layers,
                }),
            }
        }
        windows.sort_by_key(|g| g.window);
        let full = self.full_layers();
        let mut groups = Vec::with_capacity(windows.len() + 1);
        if full > 0 {
            groups.push(KvGroupGeometry {
                window: None,
                layers: full,
            });
        }
        groups.extend(windows);
        groups
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_reserves_its_window_and_a_chunk_page_aligned() {
        // (window, chunk, block, blocks): ceil((w + C - 1) / bs) + 1.
        for (w, c, bs, want) in [
            // Gemma 3: 1024 + 512 - 1 = 1535 positions' edges: 96 + 1.
            (1024, 512, 16, 97),
            (4096, 512, 16, 289),
            (8, 4, 4, 4),
            (8, 1, 4, 3),
            (1, 1, 1, 2),
            (4, 4, 1, 8),
            (u64::MAX, 512, 16, u64::MAX / 16 + 2),
        ] {
            assert_eq!(window_blocks(w, c, bs), want, "{w} {c} {bs}");
        }
    }

    /// Every alignment of a step of up to `chunk` tokens at every position
    /// touches at most `window_blocks` blocks once the blocks wholly below
    /// `next - window` are gone: the bound is the real worst case.
    #[test]
    fn the_bound_is_the_worst_alignment() {
        for bs in 1..6u64 {
            for w in 1..12u64 {
                for c in 1..7u64 {
                    let mut worst = 0;
                    for next in 0..40u64 {
                        for n in 1..=c {
                            let first = next.saturating_sub(w) / bs;
                            let last = (next + n - 1) / bs;
                            worst = worst.max(last - first + 1);
                        }
                    }
                    assert_eq!(worst, window_blocks(w, c, bs), "w {w} c {c} bs {bs}");
                }
            }
        }
    }

    #[test]
    fn groups_list_full_attention_first_then_windows_smallest_first() {
        let g = |windows: Vec<SlidingWindow>| ModelGeometry {
            layers: 34,
            kv_heads: 4,
            head_dim: 256,
            context_length: 131_072,
            sliding_windows: windows,
            ..ModelGeometry::default()
        };
        let sw = |window, layers| SlidingWindow { window, layers };
        let kv = |window, layers| KvGroupGeometry { window, layers };
        let cases = [
            (vec![], vec![kv(None, 34)]),
            // Gemma 3 4B: 29 sliding layers of 1024, 5 global.
            (vec![sw(1024, 29)], vec![kv(None, 5), kv(Some(1024), 29)]),
            // Every layer windowed (Mistral 7B v0.1): no full group.
            (vec![sw(4096, 34)], vec![kv(Some(4096), 34)]),
            // Two sizes, listed out of order and split: merged and sorted.
            (
                vec![sw(512, 4), sw(128, 10), sw(512, 6)],
                vec![kv(None, 14), kv(Some(128), 10), kv(Some(512), 10)],
            ),
            // A window as long as the context never slides (Phi-4-mini).
            (vec![sw(262_144, 34)], vec![kv(None, 34)]),
        ];
        for (windows, want) in cases {
            assert_eq!(g(windows.clone()).kv_groups(), want, "{windows:?}");
        }
        assert_eq!(g(vec![sw(1024, 29)]).full_layers(), 5);
        // 2 x 4 heads x 256 dims x 2 bytes (f16).
        assert_eq!(g(vec![]).layer_kv_bytes_per_token(), 4096);
    }

    #[test]
    fn a_sequence_reserves_its_length_or_its_window_whichever_is_less() {
        let full = KvGroupGeometry {
            window: None,
            layers: 1,
        };
        let w = KvGroupGeometry {
            window: Some(1024),
            layers: 1,
        };
        assert_eq!(full.seq_blocks(131_072, 512, 16), 8192);
        assert_eq!(w.seq_blocks(131_072, 512, 16), 97);
        assert_eq!(w.seq_blocks(1000, 512, 16), 63);
    }
}
