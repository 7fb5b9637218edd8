//! A geometry's cache groups: its layers by the kind of cache they keep, in
//! the order every list of pools takes ([`crate::CacheKind`]'s: full
//! attention, windows smallest first, the state slots).

use crate::{CacheGroup, CacheSpec, KvShape, ModelGeometry, slides};

impl ModelGeometry {
    /// K and V of one token in one layer of `kv_heads` x `head_dim`: a
    /// windowed layer's, and a full-attention layer's unless
    /// [`ModelGeometry::full_kv_shape`] differs.
    pub fn kv_shape(&self) -> KvShape {
        KvShape {
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            dtype: self.kv_dtype,
        }
    }

    /// K and V of one token in one full-attention layer: `full_kv_heads` x
    /// `full_head_dim` where given (Gemma 4's global layers), else
    /// [`ModelGeometry::kv_shape`]'s.
    pub fn full_kv_shape(&self) -> KvShape {
        let or = |n: u64, base: u64| if n == 0 { base } else { n };
        KvShape {
            kv_heads: or(self.full_kv_heads, self.kv_heads),
            head_dim: or(self.full_head_dim, self.head_dim),
            dtype: self.kv_dtype,
        }
    }

    /// What one full-attention layer keeps a token: K and V per head (at
    /// the full layers' shape), or the latent vector.
    pub fn attention_spec(&self) -> CacheSpec {
        match self.kv_latent_dim {
            0 => CacheSpec::Full(self.full_kv_shape()),
            width => CacheSpec::Latent {
                width,
                dtype: self.kv_dtype,
            },
        }
    }

    /// Bytes one token takes in one full-attention layer.
    pub fn layer_kv_bytes_per_token(&self) -> u64 {
        self.attention_spec().layer_token_bytes()
    }

    /// Layers with no window that slides and KV of their own: the
    /// attention layers less the windowed ones and those that share an
    /// earlier layer's KV.
    pub fn full_layers(&self) -> u64 {
        let windowed: u64 = self
            .sliding_windows
            .iter()
            .filter(|s| slides(s.window, self.context_length))
            .map(|s| s.layers)
            .sum();
        self.kv_layers().saturating_sub(windowed)
    }

    /// The cache groups: full attention (when any layer has it), each window
    /// that slides (one group per size, smallest first; a window as long as
    /// the context is full attention), then the recurrent layers' state.
    /// Layers that share an earlier layer's KV are in none. The full group
    /// keeps the full layers' shape, a window group `kv_heads` x `head_dim`;
    /// windowed layers that count as full attention beside full layers of
    /// another shape are counted at the wider of the two (an upper bound:
    /// a group has one shape).
    pub fn cache_groups(&self) -> Vec<CacheGroup> {
        let kv = self.kv_shape();
        let mut windows: Vec<CacheGroup> = Vec::new();
        let mut unslid = false;
        for s in &self.sliding_windows {
            if s.layers == 0 {
                continue;
            }
            if !slides(s.window, self.context_length) {
                unslid = true;
                continue;
            }
            let spec = CacheSpec::Window {
                kv,
                window: s.window,
            };
            match windows.iter_mut().find(|g| g.spec == spec) {
                Some(g) => g.layers += s.layers,
                None => windows.push(CacheGroup {
                    spec,
                    layers: s.layers,
                }),
            }
        }
        let spec = match self.attention_spec() {
            CacheSpec::Full(full) if unslid && kv.token_bytes() > full.token_bytes() => {
                CacheSpec::Full(kv)
            }
            spec => spec,
        };
        let full = (self.full_layers() > 0).then(|| CacheGroup {
            spec,
            layers: self.full_layers(),
        });
        let state = (self.recurrent_layers > 0).then_some(CacheGroup {
            spec: CacheSpec::State {
                bytes_per_seq: self.state_bytes_per_seq,
            },
            layers: self.recurrent_layers,
        });
        let mut groups: Vec<CacheGroup> = full.into_iter().chain(windows).chain(state).collect();
        groups.sort_by_key(CacheGroup::kind);
        groups
    }
}

#[cfg(test)]
mod tests {
    use crate::{CacheKind, KvDtype, SlidingWindow};

    use super::*;

    #[test]
    fn groups_list_full_attention_then_windows_smallest_first_then_state() {
        let g = |windows: Vec<SlidingWindow>, recurrent: u64| ModelGeometry {
            layers: 34,
            kv_heads: 4,
            head_dim: 256,
            context_length: 131_072,
            sliding_windows: windows,
            recurrent_layers: recurrent,
            state_bytes_per_seq: recurrent * 1000,
            ..ModelGeometry::default()
        };
        let sw = |window, layers| SlidingWindow { window, layers };
        let w = CacheKind::Window;
        let cases = [
            (vec![], 0, vec![(CacheKind::Full, 34)]),
            // Gemma 3 4B: 29 sliding layers of 1024, 5 global.
            (
                vec![sw(1024, 29)],
                0,
                vec![(CacheKind::Full, 5), (w(1024), 29)],
            ),
            // Every layer windowed (Mistral 7B v0.1): no full group.
            (vec![sw(4096, 34)], 0, vec![(w(4096), 34)]),
            // Two sizes, listed out of order and split: merged and sorted.
            (
                vec![sw(512, 4), sw(128, 10), sw(512, 6)],
                0,
                vec![(CacheKind::Full, 14), (w(128), 10), (w(512), 10)],
            ),
            // A window as long as the context never slides (Phi-4-mini).
            (vec![sw(262_144, 34)], 0, vec![(CacheKind::Full, 34)]),
            // A hybrid: 30 recurrent layers and 4 attention layers.
            (
                vec![],
                30,
                vec![(CacheKind::Full, 4), (CacheKind::State, 30)],
            ),
            // Every layer recurrent (Mamba-2): only the state slots.
            (vec![], 34, vec![(CacheKind::State, 34)]),
        ];
        for (windows, recurrent, want) in cases {
            let got: Vec<(CacheKind, u64)> = g(windows.clone(), recurrent)
                .cache_groups()
                .iter()
                .map(|g| (g.kind(), g.layers))
                .collect();
            assert_eq!(got, want, "{windows:?} {recurrent}");
        }
        let hybrid = g(vec![], 30).cache_groups();
        assert_eq!(
            hybrid[1].spec,
            CacheSpec::State {
                bytes_per_seq: 30_000
            }
        );
        assert_eq!(g(vec![sw(1024, 29)], 0).full_layers(), 5);
        // 2 x 4 heads x 256 dims x 2 bytes (f16).
        assert_eq!(g(vec![], 0).layer_kv_bytes_per_token(), 4096);
        assert_eq!(g(vec![], 0).kv_shape().dtype, KvDtype::F16);
    }

    /// Gemma 4: the full group at the global layers' own shape, windows at
    /// the sliding layers', shared-KV layers in no group; block bytes by
    /// hand (16-token blocks, bf16: 2 bytes).
    #[test]
    fn full_layers_keep_their_own_shape_and_shared_layers_none() {
        use crate::fixtures::{gemma4_31b, gemma4_e4b};
        /// Each group's spec, layers and 16-token block bytes.
        type Groups = Vec<(CacheSpec, u64, u64)>;
        let shape = |kv_heads, head_dim| KvShape {
            kv_heads,
            head_dim,
            dtype: KvDtype::Bf16,
        };
        let full = |kv_heads, head_dim| CacheSpec::Full(shape(kv_heads, head_dim));
        let window = |kv_heads, head_dim, window| CacheSpec::Window {
            kv: shape(kv_heads, head_dim),
            window,
        };
        let sw = |window, layers| vec![SlidingWindow { window, layers }];
        let cases: [(&str, ModelGeometry, Groups); 7] = [
            (
                // 10 x 2 x 4 x 512 x 2 bytes, 50 x 2 x 16 x 256 x 2 bytes a
                // token.
                "Gemma 4 31B",
                gemma4_31b(),
                vec![
                    (full(4, 512), 10, 16 * 10 * 2 * 4 * 512 * 2),
                    (window(16, 256, 1024), 50, 16 * 50 * 2 * 16 * 256 * 2),
                ],
            ),
            (
                "only the head dim differs",
                ModelGeometry {
                    full_kv_heads: 0,
                    ..gemma4_31b()
                },
                vec![
                    (full(16, 512), 10, 16 * 10 * 2 * 16 * 512 * 2),
                    (window(16, 256, 1024), 50, 16 * 50 * 2 * 16 * 256 * 2),
                ],
            ),
            (
                // 24 of 42 keep KV: 4 global, 20 sliding.
                "Gemma 4 E4B, 18 layers sharing",
                gemma4_e4b(18),
                vec![
                    (full(2, 256), 4, 16 * 4 * 2 * 2 * 256 * 2),
                    (window(2, 256, 512), 20, 16 * 20 * 2 * 2 * 256 * 2),
                ],
            ),
            (
                "Gemma 4 E4B counted as if none shared",
                gemma4_e4b(0),
                vec![
                    (full(2, 256), 22, 16 * 22 * 2 * 2 * 256 * 2),
                    (window(2, 256, 512), 20, 16 * 20 * 2 * 2 * 256 * 2),
                ],
            ),
            (
                // Every sliding layer shares: the windows list none.
                "shared sliding layers only",
                ModelGeometry {
                    sliding_windows: Vec::new(),
                    kv_shared_layers: 30,
                    ..gemma4_31b()
                },
                vec![(full(4, 512), 30, 16 * 30 * 2 * 4 * 512 * 2)],
            ),
            (
                // A window as long as the context is full attention, at the
                // wider of the two shapes (16 x 256 over 4 x 512).
                "a window that never slides beside global layers",
                ModelGeometry {
                    sliding_windows: sw(262_144, 50),
                    ..gemma4_31b()
                },
                vec![(full(16, 256), 60, 16 * 60 * 2 * 16 * 256 * 2)],
            ),
            (
                "latent attention keeps its width",
                ModelGeometry {
                    kv_latent_dim: 576,
                    full_kv_heads: 0,
                    full_head_dim: 0,
                    kv_shared_layers: 2,
                    sliding_windows: Vec::new(),
                    ..gemma4_31b()
                },
                vec![(
                    CacheSpec::Latent {
                        width: 576,
                        dtype: KvDtype::Bf16,
                    },
                    58,
                    16 * 58 * 576 * 2,
                )],
            ),
        ];
        for (name, g, want) in cases {
            let groups = g.cache_groups();
            let got: Groups = groups
                .iter()
                .map(|c| (c.spec, c.layers, c.block_bytes(16)))
                .collect();
            assert_eq!(got, want, "{name}");
            // A token's bytes are the groups' sum.
            let sum: u64 = want.iter().map(|(_, _, bytes)| bytes / 16).sum();
            assert_eq!(g.kv_bytes_per_token(), sum, "{name}");
        }
        assert_eq!(gemma4_31b().kv_bytes_per_token(), 81_920 + 819_200);
        assert_eq!(gemma4_31b().full_layers(), 10);
        assert_eq!(gemma4_e4b(18).full_layers(), 4);
        assert_eq!(gemma4_e4b(18).kv_layers(), 24);
        assert_eq!(gemma4_e4b(18).attention_layers(), 42);
        assert_eq!(gemma4_31b().full_kv_shape(), shape(4, 512));
        assert_eq!(gemma4_31b().kv_shape(), shape(16, 256));
        assert_eq!(gemma4_31b().layer_kv_bytes_per_token(), 2 * 4 * 512 * 2);
    }
}
