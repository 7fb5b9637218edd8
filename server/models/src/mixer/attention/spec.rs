//! An attention layer's kind: its window, RoPE, scale and the variants
//! families add (soft-cap, q/k norms, sinks, NoPE, an output gate, a query
//! temperature).

use super::temperature::QueryTemperature;

/// One attention layer's kind.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionSpec {
    /// Sliding window: a position sees itself and the `window - 1` before
    /// it. `None`: every earlier position.
    pub window: Option<usize>,
    /// Chunked attention (Llama 4's): a position sees only the positions of
    /// its own chunk of this many tokens. Its cache is a window of that
    /// size ([`Self::cache_window`]). `None`: no chunks.
    pub chunk: Option<usize>,
    /// Index into [`ModelSpec::ropes`].
    pub rope: usize,
    /// Multiplies `q . k` (`1/sqrt(head_dim)`, or Gemma's
    /// `query_pre_attn_scalar^-1/2`).
    pub scale: f32,
    /// Gemma 2's attention soft-cap: `cap * tanh(score / cap)`.
    pub softcap: Option<f32>,
    /// Per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// Those norms span every head at once, one weight of `heads *
    /// head_dim` (OLMo 2 and 3), not one head's width.
    pub qk_norm_whole: bool,
    /// Those norms have no weight (Llama 4's L2 norm: an RMSNorm of unit
    /// weight, after RoPE there; a rotation keeps a head's norm, so it
    /// runs before RoPE here, as the others do).
    pub qk_norm_weightless: bool,
    /// A learned sink logit per query head joins each softmax (and takes
    /// its share of the probability, attending to nothing): gpt-oss.
    pub sinks: bool,
    /// No position embedding at all (NoPE: Granite 4.0-H's attention).
    pub nope: bool,
    /// The query projection emits each head's query and then its output
    /// gate; the output is multiplied by `sigmoid(gate)` before the output
    /// projection (Qwen3-Next, Qwen3.5).
    pub gated: bool,
    /// Queries scaled up by position after RoPE (Llama 4's temperature
    /// tuning; Ministral 3's `llama_4_scaling_beta`).
    pub temperature: Option<QueryTemperature>,
    /// How its K and V are made and kept (Gemma 4's variants).
    pub kv: KvLayout,
}

/// K/V heads and the width of one head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadShape {
    /// Key/value heads.
    pub kv_heads: usize,
    /// Width of one head (queries' too).
    pub head_dim: usize,
}

/// How an attention layer's K and V are made and kept, where it differs
/// from the plain kind (Gemma 4's layers). The default is the plain kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KvLayout {
    /// Its heads where they differ from the model's (Gemma 4's full
    /// layers: fewer KV heads, twice as wide); its query heads stay.
    pub shape: Option<HeadShape>,
    /// The values are the keys' projection before its norm and RoPE: no v
    /// projection (Gemma 4's `attention_k_eq_v`).
    pub values_from_keys: bool,
    /// Each value head RMS-normed without a weight (Gemma 4).
    pub v_norm: bool,
    /// It attends over this earlier layer's KV and keeps none: no k or v
    /// projection (Gemma 4's last `num_kv_shared_layers`).
    pub shared_from: Option<usize>,
}

impl AttentionSpec {
    /// The window this layer's cache keeps: its sliding window, or its
    /// chunk (a position sees at most the `chunk` tokens ending at it, so a
    /// window pool of the chunk's size holds all it reads and gives back
    /// the rest as a window does).
    pub fn cache_window(&self) -> Option<usize> {
        self.window.or(self.chunk)
    }
}
