//! A latent attention layer's kind: its ranks and head widths, and the
//! attention settings it shares with the plain kind (RoPE, softmax scale).

use crate::error::{Error, Result};
use crate::mixer::attention::spec::AttentionSpec;
use crate::spec::{LayerSpec, Mixer, ModelSpec};

/// One latent attention layer's kind.
#[derive(Debug, Clone, PartialEq)]
pub struct LatentSpec {
    /// RoPE index and softmax scale (YaRN's `mscale_all_dim` already folded
    /// in); no window, soft-cap or sinks.
    pub attention: AttentionSpec,
    /// Rank of the low-rank query (`q_a_proj`, its norm, `q_b_proj`);
    /// `None`: one full `q_proj` (DeepSeek-V2-Lite).
    pub q_rank: Option<usize>,
    /// Rank of the compressed KV (`kv_lora_rank`).
    pub kv_rank: usize,
    /// Each head's key dimensions without position (`qk_nope_head_dim`).
    pub nope_dim: usize,
    /// The rotated key dimensions, one key shared by every head
    /// (`qk_rope_head_dim`).
    pub rope_dim: usize,
    /// Each head's value dimensions (`v_head_dim`).
    pub v_dim: usize,
    /// The checkpoint's rotary pairs are adjacent (`(x0, x1), (x2, x3)`:
    /// DeepSeek's, `rope_interleave`); the loader reorders those rows to
    /// halves, which rotate as every other RoPE here does.
    pub interleaved: bool,
}

impl LatentSpec {
    /// Elements one token caches in one layer: `kv_lora_rank +
    /// qk_rope_head_dim` (576 in DeepSeek-V3).
    pub fn width(&self) -> usize {
        self.kv_rank + self.rope_dim
    }

    /// One head's query width (`qk_nope_head_dim + qk_rope_head_dim`).
    pub fn qk_dim(&self) -> usize {
        self.nope_dim + self.rope_dim
    }

    /// Checks the widths are usable, and that the model's cache is this
    /// layer's (`kv_heads` 1, `head_dim` the latent's width).
    pub(crate) fn validate(
        &self,
        kv_heads: usize,
        head_dim: usize,
    ) -> std::result::Result<(), String> {
        let dims = [self.kv_rank, self.nope_dim, self.rope_dim, self.v_dim];
        if dims.contains(&0) || self.q_rank == Some(0) || !self.rope_dim.is_multiple_of(2) {
            return Err(format!("latent attention widths {self:?}"));
        }
        if kv_heads != 1 || head_dim != self.width() {
            return Err(format!(
                "a latent cache of {} kept as {kv_heads} heads of {head_dim}",
                self.width()
            ));
        }
        Ok(())
    }
}

/// What a model's latent layers mean for its cache as a whole.
impl ModelSpec {
    /// The width of the latent vector its attention layers cache, where
    /// they are latent attention (then every one is).
    pub fn latent_width(&self) -> Option<usize> {
        self.layers.iter().find_map(|l| match &l.mixer {
            Mixer::Latent(m) => Some(m.width()),
            _ => None,
        })
    }

    /// A latent layer's widths are usable and its cache the model's one; a
    /// plain attention layer beside latent ones would need a cache of its own.
    pub(crate) fn validate_latent(&self, i: usize, l: &LayerSpec) -> Result<()> {
        let checked = match &l.mixer {
            Mixer::Latent(m) => m.validate(self.kv_heads, self.head_dim),
            Mixer::Attention(_) if self.latent_width().is_some() => {
                Err("plain attention among latent attention layers".into())
            }
            _ => Ok(()),
        };
        checked.map_err(|e| Error::Config(format!("layer {i}: {e}")))
    }
}
