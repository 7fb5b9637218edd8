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
}
