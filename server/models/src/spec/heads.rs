//! Each attention layer's heads, where a family's layers differ in them
//! (Gemma 4's full layers: heads of their own; its shared-KV layers: none
//! kept), and what follows for the KV groups and their widths.

use super::{AttentionSpec, HeadShape, KvGroup, LayerSpec, ModelSpec};
use crate::error::{Error, Result};

impl ModelSpec {
    /// The heads of an attention layer of kind `a`: its own, or the
    /// model's.
    pub fn head_shape(&self, a: &AttentionSpec) -> HeadShape {
        a.kv.shape.unwrap_or(HeadShape {
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
        })
    }

    /// Elements one token caches over every layer that keeps KV: K and V
    /// of each group's heads, or the latent vector.
    pub fn kv_values_per_token(&self) -> usize {
        let groups = self.kv_groups();
        match self.latent_width() {
            Some(w) => w * groups.iter().map(|g| g.layers.len()).sum::<usize>(),
            None => (groups.iter().zip(self.group_kv_dims()))
                .map(|(g, dim)| 2 * dim * g.layers.len())
                .sum(),
        }
    }

    /// The full-attention layers' heads where they are not the model's
    /// (Gemma 4's global layers), as the plan's geometry names them.
    pub fn full_head_shape(&self) -> Option<HeadShape> {
        let model = HeadShape {
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
        };
        let group = self.kv_groups().into_iter().find(|g| g.window.is_none())?;
        let a = self.layers[*group.layers.first()?].attention()?;
        Some(self.head_shape(a)).filter(|h| *h != model)
    }

    /// Attention layers that read an earlier layer's KV and keep none.
    pub fn kv_shared_layers(&self) -> usize {
        (self.layers.iter())
            .filter_map(LayerSpec::attention)
            .filter(|a| a.kv.shared_from.is_some())
            .count()
    }

    /// Per KV group: the width of one token's K (or V) in each of its
    /// layers (a group's layers are alike).
    pub fn group_kv_dims(&self) -> Vec<usize> {
        let dim = |g: &KvGroup| {
            let a = g.layers.first().and_then(|&l| self.layers[l].attention());
            a.map_or(self.kv_dim(), |a| {
                let h = self.head_shape(a);
                h.kv_heads * h.head_dim
            })
        };
        self.kv_groups().iter().map(dim).collect()
    }
    /// A layer's own heads divide its queries, its rotary fits them, and
    /// the layer whose KV it reads is an earlier one of its kind that keeps
    /// its own.
    pub(super) fn validate_kv_layout(
        &self,
        i: usize,
        a: &AttentionSpec,
    ) -> std::result::Result<(), String> {
        let h = self.head_shape(a);
        if h.kv_heads == 0 || h.head_dim == 0 || !h.head_dim.is_multiple_of(2) {
            return Err(format!("heads {h:?}"));
        }
        if !self.heads.is_multiple_of(h.kv_heads) {
            return Err(format!(
                "{} heads not a multiple of {} KV heads",
                self.heads, h.kv_heads
            ));
        }
        if !a.nope
            && self
                .ropes
                .get(a.rope)
                .is_some_and(|r| r.rotary_dim > h.head_dim)
        {
            return Err(format!("its RoPE is wider than its heads {h:?}"));
        }
        let Some(from) = a.kv.shared_from else {
            return Ok(());
        };
        let source = self.layers.get(from).and_then(LayerSpec::attention);
        match source {
            Some(s) if from < i && s.kv.shared_from.is_none() => {
                let same = s.cache_window() == a.cache_window() && self.head_shape(s) == h;
                match same {
                    true => Ok(()),
                    false => Err(format!("reads layer {from}'s KV, of another kind")),
                }
            }
            _ => Err(format!(
                "reads the KV of layer {from}, not an earlier layer that keeps its own"
            )),
        }
    }

    /// The first of the model's last layers that all read earlier layers'
    /// KV and keep nothing (Gemma 4's shared-KV layers), where it has such.
    pub fn kv_shared_tail(&self) -> Option<usize> {
        let keeps_none = |l: &LayerSpec| l.attention().is_some_and(|a| a.kv.shared_from.is_some());
        let kept = self.layers.iter().rposition(|l| !keeps_none(l));
        match kept {
            Some(k) if k + 1 < self.layers.len() => Some(k + 1),
            _ => None,
        }
    }

    /// A group's cache is one width: its layers' heads alike (a window
    /// that never slides joins the full group: Gemma 4's would, of another
    /// shape).
    pub(super) fn validate_group_shapes(&self) -> Result<()> {
        for g in self.kv_groups() {
            let shapes = (g.layers.iter())
                .filter_map(|&l| self.layers[l].attention())
                .map(|a| self.head_shape(a));
            if shapes.clone().any(|h| Some(h) != shapes.clone().next()) {
                return Err(Error::Config(format!(
                    "the layers of the {} KV group have heads of several shapes",
                    g.kind()
                )));
            }
        }
        Ok(())
    }
}
