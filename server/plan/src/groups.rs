//! A geometry's cache groups: its layers by the kind of cache they keep, in
//! the order every list of pools takes ([`crate::CacheKind`]'s: full
//! attention, windows smallest first, the state slots).

use crate::{CacheGroup, CacheSpec, KvShape, ModelGeometry, slides};

impl ModelGeometry {
    /// K and V of one token in one attention layer.
    pub fn kv_shape(&self) -> KvShape {
        KvShape {
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            dtype: self.kv_dtype,
        }
    }

    /// What one attention layer keeps a token: K and V per head, or the
    /// latent vector.
    pub fn attention_spec(&self) -> CacheSpec {
        match self.kv_latent_dim {
            0 => CacheSpec::Full(self.kv_shape()),
            width => CacheSpec::Latent {
                width,
                dtype: self.kv_dtype,
            },
        }
    }

    /// Bytes one token takes in one attention layer.
    pub fn layer_kv_bytes_per_token(&self) -> u64 {
        self.attention_spec().layer_token_bytes()
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

    /// The cache groups: full attention (when any layer has it), each window
    /// that slides (one group per size, smallest first; a window as long as
    /// the context is full attention), then the recurrent layers' state.
    pub fn cache_groups(&self) -> Vec<CacheGroup> {
        let kv = self.kv_shape();
        let mut windows: Vec<CacheGroup> = Vec::new();
        for s in &self.sliding_windows {
            if !slides(s.window, self.context_length) || s.layers == 0 {
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
        let full = (self.full_layers() > 0).then(|| CacheGroup {
            spec: self.attention_spec(),
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
}
