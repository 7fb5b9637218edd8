//! One description of a decoder model: a stack of layers, each a token
//! mixer and a feed-forward, and the constants they share. Every family
//! (`crate::arch`) maps its config and tensor names to this; the decoder and
//! the kernels read only this.

use ferrox_plan::{SlidingWindow, slides};
use serde::Serialize;

use crate::error::{Error, Result};

pub use crate::ffn::activation::Activation;
pub use crate::ffn::moe::spec::{MAX_EXPERTS, MoeSpec, Routing};
pub use crate::mixer::attention::spec::{AttentionSpec, HeadShape, KvLayout};
pub use crate::mixer::attention::temperature::QueryTemperature;
pub use crate::mixer::encoder::spec::EncoderSpec;
pub use crate::mixer::gdn::spec::GdnSpec;
pub use crate::mixer::latent::spec::LatentSpec;
pub use crate::mixer::mamba2::spec::SsmSpec;
pub use crate::mixer::short_conv::spec::ShortConvSpec;

/// What mixes information across positions in one layer.
#[derive(Debug, Clone, PartialEq)]
pub enum Mixer {
    /// Causal self-attention over the paged KV cache.
    Attention(AttentionSpec),
    /// Multi-head latent attention (DeepSeek-V2/V3): one compressed vector
    /// a token cached, read by every head.
    Latent(LatentSpec),
    /// Mamba-2's state-space mixer: a fixed state per sequence, in a slot
    /// of the state store, instead of KV.
    Mamba2(SsmSpec),
    /// Gated DeltaNet (Qwen3-Next's and Qwen3.5's linear attention): a
    /// fixed state per sequence too.
    GatedDeltaNet(GdnSpec),
    /// LFM2's gated short convolution: a state per sequence too, only its
    /// convolution's last inputs.
    ShortConv(ShortConvSpec),
    /// Attention within each sequence of a step, nothing cached: an
    /// encoder's (bidirectional) or a pooled decoder's (causal).
    Encoder(EncoderSpec),
    /// No token mixer: the layer is its feed-forward alone, after the
    /// layer's one norm (Nemotron-H's MLP layers).
    None,
}

/// The feed-forward of one layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FeedForward {
    /// `down(act(gate(x)) * up(x))`.
    Gated(Activation),
    /// A mixture of experts: each token through the `top_k` gated MLPs its
    /// router picks, their outputs weighted by the router.
    Moe(MoeSpec),
    /// The gated MLP (the layer's width, the experts' activation) and a
    /// mixture of experts side by side, each with its own norms (Gemma 4's
    /// `enable_moe_block`).
    DenseAndMoe(MoeSpec),
    /// `down(act(up(x)))`, biases where the checkpoint has them (BERT's).
    Plain(Activation),
    /// None: the mixer is the whole layer (Mamba-2's blocks).
    None,
}

/// One decoder layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerSpec {
    /// Its token mixer.
    pub mixer: Mixer,
    /// Its feed-forward.
    pub ffn: FeedForward,
}

impl LayerSpec {
    /// The attention of this layer, if its mixer is attention (latent
    /// attention too: it keeps a paged cache as attention does).
    pub fn attention(&self) -> Option<&AttentionSpec> {
        match &self.mixer {
            Mixer::Attention(a) => Some(a),
            Mixer::Latent(l) => Some(&l.attention),
            Mixer::Mamba2(_)
            | Mixer::GatedDeltaNet(_)
            | Mixer::ShortConv(_)
            | Mixer::Encoder(_)
            | Mixer::None => None,
        }
    }

    /// The attention this layer runs, cached or not (an encoder's too).
    pub fn any_attention(&self) -> Option<&AttentionSpec> {
        match &self.mixer {
            Mixer::Attention(a) => Some(a),
            Mixer::Latent(l) => Some(&l.attention),
            Mixer::Encoder(e) => Some(&e.attention),
            Mixer::Mamba2(_) | Mixer::GatedDeltaNet(_) | Mixer::ShortConv(_) | Mixer::None => None,
        }
    }

    /// The Mamba-2 mixer of this layer, if it has one.
    pub fn ssm(&self) -> Option<&SsmSpec> {
        match &self.mixer {
            Mixer::Mamba2(s) => Some(s),
            Mixer::Attention(_)
            | Mixer::Latent(_)
            | Mixer::GatedDeltaNet(_)
            | Mixer::ShortConv(_)
            | Mixer::Encoder(_)
            | Mixer::None => None,
        }
    }

    /// The Gated DeltaNet mixer of this layer, if it has one.
    pub fn gdn(&self) -> Option<&GdnSpec> {
        match &self.mixer {
            Mixer::GatedDeltaNet(g) => Some(g),
            Mixer::Attention(_)
            | Mixer::Latent(_)
            | Mixer::Mamba2(_)
            | Mixer::ShortConv(_)
            | Mixer::Encoder(_)
            | Mixer::None => None,
        }
    }

    /// Values of one sequence's state `(convolution, recurrent)` in this
    /// layer, if its mixer is recurrent (keeps a state, not KV).
    pub fn state_values(&self) -> Option<(usize, usize)> {
        match &self.mixer {
            Mixer::Mamba2(s) => Some(s.state_values()),
            Mixer::GatedDeltaNet(g) => Some(g.state_values()),
            Mixer::ShortConv(c) => Some(c.state_values()),
            Mixer::Attention(_) | Mixer::Latent(_) | Mixer::Encoder(_) | Mixer::None => None,
        }
    }

    /// The block length of a recurrent mixer's scan, if it has one.
    pub fn scan_chunk(&self) -> Option<usize> {
        match &self.mixer {
            Mixer::Mamba2(s) => Some(s.chunk),
            Mixer::GatedDeltaNet(g) => Some(g.chunk),
            // A convolution has no scan: any run is one block.
            Mixer::ShortConv(_)
            | Mixer::Attention(_)
            | Mixer::Latent(_)
            | Mixer::Encoder(_)
            | Mixer::None => None,
        }
    }

    /// Checks each of its kinds' numbers are usable, and that it has a
    /// mixer or a feed-forward.
    fn validate_kinds(&self) -> std::result::Result<(), String> {
        if self.mixer == Mixer::None && self.ffn == FeedForward::None {
            return Err("neither a mixer nor a feed-forward".into());
        }
        if let Some(s) = self.ssm() {
            s.validate()?;
        }
        if let Some(g) = self.gdn() {
            g.validate()?;
        }
        if let Mixer::ShortConv(c) = &self.mixer {
            c.validate()?;
        }
        match self.moe() {
            Some(m) => m.validate(),
            None => Ok(()),
        }
    }

    /// The layer's experts, if its feed-forward is a mixture.
    pub fn moe(&self) -> Option<&MoeSpec> {
        match &self.ffn {
            FeedForward::Moe(m) | FeedForward::DenseAndMoe(m) => Some(m),
            FeedForward::Gated(_) | FeedForward::Plain(_) | FeedForward::None => None,
        }
    }
}

/// Norm kind, placement and constants, shared by every layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Norms {
    /// Epsilon.
    pub eps: f64,
    /// LayerNorm (mean removed, a bias added) instead of RMSNorm (BERT).
    pub layer_norm: bool,
    /// Each block's norm comes after its residual add, `norm(x + f(x))`
    /// (BERT's post-LN), not before its input.
    pub after_residual: bool,
    /// Added to every stored norm weight at load: Gemma's `(1 + w)` in its
    /// safetensors (llama.cpp's converter already added it to GGUF files).
    pub offset: f32,
    /// Each block has a norm of its input (`attn_norm`, `ffn_norm`; or
    /// BERT's after its residual add): false for OLMo 2 and 3, whose only
    /// layer norms are the post-norms.
    pub pre: bool,
    /// An RMSNorm of the attention output before the residual add (Gemma).
    pub post_attention: bool,
    /// An RMSNorm of the MLP output before the residual add (Gemma).
    pub post_ffn: bool,
}

/// How RoPE's frequencies are changed for long contexts.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Every frequency divided by the factor (Gemma 3's global layers).
    Linear(f32),
    /// Per-frequency divisors (Llama 3's scaling; GGUF's `rope_freqs`).
    Divisors(Vec<f32>),
    /// Phi-3's LongRoPE: `short` divisors when the context served is within
    /// `original` positions, `long` ones past it; cos and sin are multiplied
    /// by `attention`.
    LongRope {
        /// Divisors for contexts up to `original`.
        short: Vec<f32>,
        /// Divisors for longer contexts.
        long: Vec<f32>,
        /// The pre-training context length.
        original: usize,
        /// The attention scaling (`sqrt(1 + ln(s) / ln(original))`).
        attention: f32,
    },
    /// YaRN (gpt-oss): per-frequency divisors blending interpolation and
    /// extrapolation, cos and sin multiplied by `attention`.
    Yarn {
        /// Per-frequency divisors.
        divisors: Vec<f32>,
        /// The attention scaling (`0.1 ln(factor) + 1`, or the ratio of
        /// two such mscales).
        attention: f32,
    },
}

/// One kind of rotary embedding.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeSpec {
    /// Base frequency.
    pub theta: f32,
    /// Leading dimensions of each head that rotate (Phi's partial rotary);
    /// the rest pass through.
    pub rotary_dim: usize,
    /// Long-context scaling.
    pub scaling: RopeScaling,
}

/// Layers whose KV is kept alike, for the memory model: every
/// full-attention layer in one group, each distinct window its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KvGroup {
    /// The group's sliding window; `None` for full attention.
    pub window: Option<usize>,
    /// Its layers, ascending.
    pub layers: Vec<usize>,
}

impl KvGroup {
    /// The kind of cache the group keeps, which names its pool.
    pub fn kind(&self) -> ferrox_plan::CacheKind {
        match self.window {
            None => ferrox_plan::CacheKind::Full,
            Some(w) => ferrox_plan::CacheKind::Window(w as u64),
        }
    }
}

/// What is added to the token embeddings before the first layer, and
/// how they are normed (an encoder's input; a decoder's is the tokens'
/// embeddings alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InputSpec {
    /// Learned absolute position embeddings, position `p` read at row `p +
    /// offset` (BERT: 0; XLM-RoBERTa: its padding index plus one).
    pub positions: Option<usize>,
    /// Rows of a token-type embedding (BERT's segments), row 0 added
    /// for every token; 0: none.
    pub token_types: usize,
    /// A norm of the summed embeddings (BERT's LayerNorm).
    pub norm: bool,
}

/// Everything the decoder needs to know about a model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    /// The family's name (llama.cpp's architecture name).
    pub family: &'static str,
    /// Residual width.
    pub hidden: usize,
    /// MLP width.
    pub intermediate: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Dimension of one head (independent of the width in Qwen3, Gemma).
    pub head_dim: usize,
    /// Vocabulary size (rows of the embedding).
    pub vocab: usize,
    /// Trained context length.
    pub context: usize,
    /// The layers, in order.
    pub layers: Vec<LayerSpec>,
    /// Norm placement.
    pub norms: Norms,
    /// The rotary embeddings the layers use.
    pub ropes: Vec<RopeSpec>,
    /// Embeddings multiplied by this (Gemma: `sqrt(hidden)`).
    pub embed_scale: Option<f32>,
    /// Final logits soft-capped: `cap * tanh(logit / cap)` (Gemma 2).
    pub final_softcap: Option<f32>,
    /// q, k and v projections carry biases (Qwen2).
    pub qkv_bias: bool,
    /// Each layer's mixer and feed-forward outputs multiplied by this
    /// before their residual adds (Granite's `residual_multiplier`).
    pub residual_scale: Option<f32>,
    /// Final logits multiplied by this (Granite's `1 / logits_scaling`).
    pub logit_scale: Option<f32>,
    /// What the input embeddings add up (an encoder's positions and types).
    pub input: InputSpec,
    /// A norm after the last layer (every decoder; not BERT).
    pub final_norm: bool,
    /// Each layer's MLP width where they differ (Gemma 4's wider MLPs in
    /// its shared-KV layers); empty: every layer's is `intermediate`.
    pub ffn_widths: Vec<usize>,
    /// Per-layer input embeddings (Gemma 4's E2B/E4B), if it has them.
    pub per_layer_input: Option<PerLayerInput>,
    /// Each layer's output multiplied by a learned scalar of its own
    /// (Gemma 4's `layer_scalar`).
    pub layer_out_scale: bool,
}

/// Gemma 4's per-layer input embeddings: each token gets a small vector
/// for every layer, from a table of its own and a projection of its
/// embedding, which each layer gates into its output.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PerLayerInput {
    /// Width of one layer's vector (`hidden_size_per_layer_input`).
    pub width: usize,
    /// Rows of its table (`vocab_size_per_layer_input`).
    pub vocab: usize,
    /// The gate's activation (the MLP's).
    pub activation: Activation,
}

impl ModelSpec {
    /// Width of one token's K (or V) across heads; a latent model's one
    /// cached vector (its `kv_heads` 1, its `head_dim` the vector's width).
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Layer `i`'s MLP width.
    pub fn ffn_width(&self, i: usize) -> usize {
        self.ffn_widths.get(i).copied().unwrap_or(self.intermediate)
    }

    /// Width of one token's queries across heads.
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    /// The KV groups (full attention first, then windows ascending): the
    /// block tables a sequence needs, one per group. Recurrent layers keep
    /// no KV and are in none, nor are layers reading another's KV.
    pub fn kv_groups(&self) -> Vec<KvGroup> {
        let mut groups: Vec<KvGroup> = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            let Some(a) = l.attention().filter(|a| a.kv.shared_from.is_none()) else {
                continue;
            };
            let window = a.cache_window();
            match groups.iter_mut().find(|g| g.window == window) {
                Some(g) => g.layers.push(i),
                None => groups.push(KvGroup {
                    window,
                    layers: vec![i],
                }),
            }
        }
        groups.sort_by_key(|g| g.window.map_or(0, |w| w.saturating_add(1)));
        groups
    }

    /// The model run as a pooling model: each cached attention layer
    /// becomes the encoder kind, causal, so a step attends within its own
    /// sequences and keeps nothing (no KV pool).
    pub fn pooled(mut self) -> Self {
        for l in &mut self.layers {
            if let Mixer::Attention(a) = &l.mixer {
                l.mixer = Mixer::Encoder(EncoderSpec {
                    attention: a.clone(),
                    causal: true,
                });
            }
        }
        self
    }

    /// Whether any layer keeps a cache between steps (KV or a state):
    /// `false` for an encoder, or a decoder [`pooled`](Self::pooled).
    pub fn keeps_cache(&self) -> bool {
        self.layers
            .iter()
            .any(|l| l.attention().is_some() || l.state_values().is_some())
    }

    /// Parameters of every layer's routed experts, `(all, those one token
    /// runs)`: what total and active parameter counts differ by.
    pub fn expert_params(&self) -> (u64, u64) {
        self.layers
            .iter()
            .filter_map(LayerSpec::moe)
            .map(|m| m.expert_params(self.hidden))
            .fold((0, 0), |(a, b), (c, d)| (a + c, b + d))
    }

    /// Layers with a token mixer, each keeping KV or a state (as the plan
    /// counts layers): a layer of its feed-forward alone keeps neither.
    pub fn mixer_layers(&self) -> usize {
        self.layers
            .iter()
            .filter(|l| l.mixer != Mixer::None)
            .count()
    }

    /// The recurrent layers, ascending: each keeps one state per sequence
    /// in the state store, in this order.
    pub fn recurrent_layers(&self) -> Vec<usize> {
        (0..self.layers.len())
            .filter(|&i| self.layers[i].state_values().is_some())
            .collect()
    }

    /// Bytes of one sequence's recurrent state over every layer, held in
    /// f32 (the scan's precision): what a state slot costs.
    pub fn state_bytes(&self) -> u64 {
        self.layers
            .iter()
            .filter_map(LayerSpec::state_values)
            .map(|(conv, state)| 4 * (conv + state) as u64)
            .sum()
    }

    /// Each layer's index into [`Self::kv_groups`] (0 for a recurrent
    /// layer, which has none).
    pub fn layer_groups(&self) -> Vec<usize> {
        let mut of = vec![0; self.layers.len()];
        for (g, group) in self.kv_groups().iter().enumerate() {
            for &l in &group.layers {
                of[l] = g;
            }
        }
        of
    }

    /// The windowed groups as the capacity plan counts them (its
    /// `ModelGeometry::sliding_windows`): each window and its layers' count.
    pub fn sliding_windows(&self) -> Vec<SlidingWindow> {
        self.kv_groups()
            .iter()
            .filter_map(|g| {
                g.window.map(|w| SlidingWindow {
                    window: w as u64,
                    layers: g.layers.len() as u64,
                })
            })
            .collect()
    }

    /// Windows that never slide in the trained context are full attention
    /// (ferrox-plan's [`slides`], so the plan's pools are these groups);
    /// checks the numbers are usable, so the forward pass cannot index out
    /// of range.
    pub fn finish(mut self) -> Result<Self> {
        let context = self.context;
        for l in &mut self.layers {
            let Mixer::Attention(a) = &mut l.mixer else {
                continue;
            };
            if a.window.is_some_and(|w| !slides(w as u64, context as u64)) {
                a.window = None;
            }
            // A chunk as long as the context never ends within it.
            if a.chunk.is_some_and(|c| !slides(c as u64, context as u64)) {
                a.chunk = None;
            }
        }
        self.validate()?;
        Ok(self)
    }

    fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(m));
        let dims = [self.hidden, self.vocab, self.context, self.layers.len()];
        // Attention's and the MLP's widths matter only where such layers are.
        let attends = self.layers.iter().any(|l| l.any_attention().is_some());
        let heads = [self.heads, self.kv_heads, self.head_dim];
        let mlp = self.layers.iter().any(|l| {
            matches!(
                l.ffn,
                FeedForward::Gated(_) | FeedForward::Plain(_) | FeedForward::DenseAndMoe(_)
            )
        });
        if dims.contains(&0) || (attends && heads.contains(&0)) || (mlp && self.intermediate == 0) {
            return bad(format!("zero dimension in {self:?}"));
        }
        if attends && !self.heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "heads {} not a multiple of kv heads {}",
                self.heads, self.kv_heads
            ));
        }
        if attends && !self.head_dim.is_multiple_of(2) {
            return bad(format!("head dim {} is odd", self.head_dim));
        }
        for (k, r) in self.ropes.iter().enumerate() {
            // The widest head that rotates by it (the model's where none does).
            let width = self
                .layers
                .iter()
                .filter_map(LayerSpec::any_attention)
                .filter(|a| a.rope == k)
                .map(|a| self.head_shape(a).head_dim)
                .max()
                .unwrap_or(self.head_dim);
            if r.rotary_dim == 0 || r.rotary_dim > width || r.rotary_dim % 2 != 0 {
                return bad(format!("rotary dim {} for head dim {width}", r.rotary_dim));
            }
            if !(r.theta.is_finite() && r.theta > 0.0) {
                return bad(format!("RoPE base {}", r.theta));
            }
        }
        for (i, l) in self.layers.iter().enumerate() {
            l.validate_kinds()
                .map_err(|e| Error::Config(format!("layer {i}: {e}")))?;
            self.validate_latent(i, l)?;
            let Some(a) = l.any_attention() else { continue };
            if (!a.nope && a.rope >= self.ropes.len()) || a.window == Some(0) || a.chunk == Some(0)
            {
                return bad(format!("layer {i}: {a:?}"));
            }
            if a.softcap.is_some_and(|c| !(c.is_finite() && c > 0.0)) || !a.scale.is_finite() {
                return bad(format!("layer {i}: scale or soft-cap in {a:?}"));
            }
            self.validate_kv_layout(i, a)
                .map_err(|e| Error::Config(format!("layer {i}: {e}")))?;
        }
        self.validate_group_shapes()?;
        if self
            .final_softcap
            .is_some_and(|c| !(c.is_finite() && c > 0.0))
        {
            return bad(format!("final soft-cap {:?}", self.final_softcap));
        }
        Ok(())
    }
}

mod heads;
#[cfg(test)]
mod tests;
