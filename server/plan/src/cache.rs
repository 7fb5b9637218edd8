//! The typed cache spec: what each group of a model's layers keeps for a
//! sequence, named by kind. A model's cache is a list of groups `(spec,
//! layers)` ([`CacheGroup`]); a plan is a list of pools, one per group, each
//! a count of that group's blocks (`crate::PoolPlan`). The plan, the `--pool`
//! flags, the engine's pools, the model's stores, the metrics' `pool` label
//! and the ModelDeployment's status all carry that list by [`CacheKind`],
//! never by position (vLLM v1's `KVCacheSpec` family is the anchor).
//!
//! - `full`: attention over the whole sequence: each token's K and V in every
//!   layer of the group, for the sequence's life, in blocks of `block_size`
//!   tokens.
//! - `window:W`: sliding-window attention: the same per token, but a
//!   sequence holds at most its window plus one prefill chunk
//!   ([`crate::window_blocks`]); blocks that leave the window go back.
//!   Chunked attention (Llama 4's `attention_chunk_size`) is a window of
//!   its chunk's size: a token sees only its own chunk, which lies within
//!   its last `C` tokens, so the window's reservation bounds what it holds
//!   and the window's reclaim gives back what no chunk reads again.
//!   Latent attention (DeepSeek-V2/V3's MLA) is this kind too, with a
//!   smaller page ([`CacheSpec::Latent`]): one compressed vector a token a
//!   layer instead of K and V for every head.
//! - `state`: recurrent layers (Mamba-2, Gated DeltaNet): one fixed-size
//!   state per sequence whatever its length; a block is one sequence's slot.
//!
//! A new memory kind is one variant here, its manager in the engine, its
//! layer folder in the models and its tests.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{KvDtype, blocks_for, window_blocks};

/// What names a pool: the kind of cache a group of layers keeps. Ordered as
/// every list of pools is: full attention, then windows smallest first, then
/// the state slots. Spelt as its name on every wire (`"window:1024"`), as
/// flags and labels are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum CacheKind {
    /// Full attention: every token's K and V.
    Full,
    /// Sliding-window attention over this many tokens.
    Window(u64),
    /// A recurrent state per sequence.
    State,
}

impl CacheKind {
    /// Blocks one sequence of `tokens` tokens holds at most here, with
    /// prefill chunks of at most `prefill_chunk` tokens: its length's blocks
    /// (full), at most its window plus a chunk, page-aligned (window), or one
    /// slot (state). Saturating.
    pub fn blocks_for(self, tokens: u64, prefill_chunk: u64, block_size: u64) -> u64 {
        let whole = blocks_for(tokens, block_size);
        match self {
            CacheKind::Full => whole,
            CacheKind::Window(w) => whole.min(window_blocks(w, prefill_chunk, block_size)),
            CacheKind::State => 1,
        }
    }

    /// Whether a block holds `block_size` tokens (the attention kinds), not
    /// one sequence's state.
    pub fn holds_tokens(self) -> bool {
        !matches!(self, CacheKind::State)
    }

    /// The window, for a window pool.
    pub fn window(self) -> Option<u64> {
        match self {
            CacheKind::Window(w) => Some(w),
            CacheKind::Full | CacheKind::State => None,
        }
    }
}

impl fmt::Display for CacheKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheKind::Full => f.write_str("full"),
            CacheKind::Window(w) => write!(f, "window:{w}"),
            CacheKind::State => f.write_str("state"),
        }
    }
}

impl FromStr for CacheKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("`{s}` is not a cache pool (full, window:TOKENS or state)");
        match s.split_once(':') {
            None if s == "full" => Ok(CacheKind::Full),
            None if s == "state" => Ok(CacheKind::State),
            Some(("window", w)) => match w.parse::<u64>() {
                Ok(w) if w > 0 => Ok(CacheKind::Window(w)),
                _ => Err(bad()),
            },
            _ => Err(bad()),
        }
    }
}

impl From<CacheKind> for String {
    fn from(kind: CacheKind) -> String {
        kind.to_string()
    }
}

impl TryFrom<String> for CacheKind {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

/// What one token of one attention layer keeps: its K and V.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvShape {
    /// Key/value heads.
    pub kv_heads: u64,
    /// Dimension of one head.
    pub head_dim: u64,
    /// Element type.
    pub dtype: KvDtype,
}

impl KvShape {
    /// Bytes of K and V of one token in one layer.
    pub fn token_bytes(&self) -> u64 {
        2u64.saturating_mul(self.kv_heads)
            .saturating_mul(self.head_dim)
            .saturating_mul(self.dtype.bytes())
    }
}

/// One kind of cache with the numbers its bytes follow from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CacheSpec {
    /// Full attention.
    Full(KvShape),
    /// Sliding-window attention over `window` tokens.
    Window {
        /// K and V of a token in a layer.
        kv: KvShape,
        /// Tokens each layer attends to, its own included.
        window: u64,
    },
    /// Recurrent state: `bytes_per_seq` for one sequence over every layer
    /// of the group (its layers may differ in size).
    State {
        /// Bytes of one sequence's state.
        bytes_per_seq: u64,
    },
    /// Latent attention: one vector of `width` elements (`kv_lora_rank +
    /// qk_rope_head_dim`) a token a layer, held for the sequence's life in
    /// the full pool (vLLM's `MLAAttentionSpec` is a full-attention spec
    /// with its own page size).
    Latent {
        /// Elements a token a layer.
        width: u64,
        /// Their type.
        dtype: KvDtype,
    },
}

impl CacheSpec {
    /// The kind, which names the pool.
    pub fn kind(&self) -> CacheKind {
        match self {
            CacheSpec::Full(_) | CacheSpec::Latent { .. } => CacheKind::Full,
            CacheSpec::Window { window, .. } => CacheKind::Window(*window),
            CacheSpec::State { .. } => CacheKind::State,
        }
    }

    /// K and V of a token in a layer, for the per-head attention kinds.
    pub fn kv(&self) -> Option<KvShape> {
        match self {
            CacheSpec::Full(kv) | CacheSpec::Window { kv, .. } => Some(*kv),
            CacheSpec::State { .. } | CacheSpec::Latent { .. } => None,
        }
    }

    /// Bytes one token takes in one layer (0 for state).
    pub fn layer_token_bytes(&self) -> u64 {
        match self {
            CacheSpec::Full(kv) | CacheSpec::Window { kv, .. } => kv.token_bytes(),
            CacheSpec::Latent { width, dtype } => width.saturating_mul(dtype.bytes()),
            CacheSpec::State { .. } => 0,
        }
    }
}

/// A group of layers that keep one kind of cache, served by one pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheGroup {
    /// What each of them keeps.
    pub spec: CacheSpec,
    /// How many layers.
    pub layers: u64,
}

impl CacheGroup {
    /// The kind, which names the group's pool.
    pub fn kind(&self) -> CacheKind {
        self.spec.kind()
    }

    /// Bytes one token takes across the group's layers (0 for state).
    pub fn token_bytes(&self) -> u64 {
        self.spec.layer_token_bytes().saturating_mul(self.layers)
    }

    /// Bytes of one block of the pool: `block_size` tokens in every layer,
    /// or one sequence's state.
    pub fn block_bytes(&self, block_size: u64) -> u64 {
        match self.spec {
            CacheSpec::State { bytes_per_seq } => bytes_per_seq,
            _ => self.token_bytes().saturating_mul(block_size),
        }
    }

    /// The most bytes one sequence of `tokens` tokens holds here.
    pub fn max_bytes(&self, tokens: u64, prefill_chunk: u64, block_size: u64) -> u64 {
        self.kind()
            .blocks_for(tokens, prefill_chunk, block_size)
            .saturating_mul(self.block_bytes(block_size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_named_ordered_and_read_back() {
        let kinds = [
            (CacheKind::Full, "full"),
            (CacheKind::Window(128), "window:128"),
            (CacheKind::Window(4096), "window:4096"),
            (CacheKind::State, "state"),
        ];
        for (kind, name) in kinds {
            assert_eq!(kind.to_string(), name);
            assert_eq!(name.parse::<CacheKind>(), Ok(kind));
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{name}\""));
            assert_eq!(serde_json::from_str::<CacheKind>(&json).unwrap(), kind);
        }
        let mut sorted: Vec<CacheKind> = kinds.iter().rev().map(|k| k.0).collect();
        sorted.sort();
        assert_eq!(sorted, kinds.map(|k| k.0));
        for bad in [
            "", "kv", "window", "window:", "window:0", "window:x", "full:1",
        ] {
            let err = bad.parse::<CacheKind>().unwrap_err();
            assert!(err.contains("full, window:TOKENS or state"), "{bad}: {err}");
        }
    }

    #[test]
    fn each_kind_counts_its_own_blocks_and_bytes() {
        let kv = KvShape {
            kv_heads: 4,
            head_dim: 256,
            dtype: KvDtype::F16,
        };
        let group = |spec, layers| CacheGroup { spec, layers };
        let full = group(CacheSpec::Full(kv), 5);
        let window = group(CacheSpec::Window { kv, window: 1024 }, 29);
        let state = group(
            CacheSpec::State {
                bytes_per_seq: 3000,
            },
            7,
        );
        // (group, tokens, blocks, block bytes): 4096 bytes a token a layer.
        for (g, tokens, blocks, block_bytes) in [
            (full, 131_072, 8192, 16 * 5 * 4096),
            (full, 1, 1, 16 * 5 * 4096),
            (window, 131_072, 97, 16 * 29 * 4096),
            (window, 1000, 63, 16 * 29 * 4096),
            (state, 131_072, 1, 3000),
            (state, 1, 1, 3000),
        ] {
            assert_eq!(g.kind().blocks_for(tokens, 512, 16), blocks, "{g:?}");
            assert_eq!(g.block_bytes(16), block_bytes, "{g:?}");
            assert_eq!(g.max_bytes(tokens, 512, 16), blocks * block_bytes);
        }
        assert_eq!(state.token_bytes(), 0);
        assert!(!state.kind().holds_tokens() && window.kind().holds_tokens());
        assert_eq!(window.kind().window(), Some(1024));
    }
}
