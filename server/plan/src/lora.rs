//! LoRA adapters in the plan: each held as f16 `A` and `B` for every
//! projection of every layer at the largest rank allowed (what the server
//! holds for one such adapter), `max_loras` of them on an accelerator and
//! `max_cpu_loras` in host memory (on a CPU server both are the host's).

use crate::{DeviceKind, ModelGeometry};

/// The adapters a server may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoraPlan {
    /// Adapters in one step, on the device (`--max-loras`).
    pub max_loras: u64,
    /// The largest rank (`--max-lora-rank`).
    pub max_lora_rank: u64,
    /// Adapters kept in host memory (`--max-cpu-loras`).
    pub max_cpu_loras: u64,
}

/// Bytes of one held element (adapters are held as f16).
const ELEM_BYTES: u64 = 2;

impl ModelGeometry {
    /// Bytes one adapter of `rank` over all seven projections takes: for
    /// each, `rank * (in + out)` elements; every layer at the wider of the
    /// windowed and full layers' head shapes (an upper bound where they
    /// differ).
    pub fn lora_adapter_bytes(&self, rank: u64) -> u64 {
        let (h, i) = (self.hidden_size, self.intermediate_size);
        let (kv, full) = (self.kv_shape(), self.full_kv_shape());
        let q = self.heads.saturating_mul(kv.head_dim.max(full.head_dim));
        let kv = [kv, full]
            .map(|s| s.kv_heads.saturating_mul(s.head_dim))
            .into_iter()
            .max()
            .unwrap_or(0);
        // q (h+q), k and v (h+kv), o (q+h), gate and up (h+i), down (i+h).
        let per_layer = [7 * h, 2 * q, 2 * kv, 3 * i]
            .into_iter()
            .fold(0u64, u64::saturating_add);
        per_layer
            .saturating_mul(rank)
            .saturating_mul(self.layers)
            .saturating_mul(ELEM_BYTES)
    }
}

impl LoraPlan {
    /// Bytes on the device the plan is made for: `max_loras` adapters on
    /// an accelerator; on a CPU server the host holds all `max_cpu_loras`.
    pub fn device_bytes(&self, g: &ModelGeometry, device: DeviceKind) -> u64 {
        let held = match device {
            DeviceKind::Cpu => self.max_cpu_loras.max(self.max_loras),
            DeviceKind::Cuda => self.max_loras,
        };
        held.saturating_mul(g.lora_adapter_bytes(self.max_lora_rank))
    }

    /// Bytes in host memory beside a GPU (`max_cpu_loras` adapters); 0 on
    /// a CPU server, whose device bytes are already the host's.
    pub fn host_bytes(&self, g: &ModelGeometry, device: DeviceKind) -> u64 {
        match device {
            DeviceKind::Cpu => 0,
            DeviceKind::Cuda => self
                .max_cpu_loras
                .saturating_mul(g.lora_adapter_bytes(self.max_lora_rank)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KvDtype;
    use crate::fixtures::Pools;

    fn smollm2() -> ModelGeometry {
        ModelGeometry {
            layers: 30,
            kv_heads: 3,
            head_dim: 64,
            kv_dtype: KvDtype::F16,
            weight_bytes: 0,
            context_length: 8192,
            heads: 9,
            hidden_size: 576,
            intermediate_size: 1536,
            vocab_size: 49152,
            sliding_windows: Vec::new(),
            params: 0,
            active_params: 0,
            recurrent_layers: 0,
            state_bytes_per_seq: 0,
            kv_latent_dim: 0,
            full_kv_heads: 0,
            full_head_dim: 0,
            kv_shared_layers: 0,
        }
    }

    #[test]
    fn adapters_count_on_the_device_and_in_host_memory() {
        let g = smollm2();
        // Per layer: 7*576 + 2*576 + 2*192 + 3*1536 = 10176 elements a rank.
        let one = 10176 * 16 * 30 * 2;
        assert_eq!(g.lora_adapter_bytes(16), one);
        let p = LoraPlan {
            max_loras: 2,
            max_lora_rank: 16,
            max_cpu_loras: 5,
        };
        assert_eq!(p.device_bytes(&g, DeviceKind::Cpu), 5 * one);
        assert_eq!(p.host_bytes(&g, DeviceKind::Cpu), 0);
        assert_eq!(p.device_bytes(&g, DeviceKind::Cuda), 2 * one);
        assert_eq!(p.host_bytes(&g, DeviceKind::Cuda), 5 * one);
        let huge = LoraPlan {
            max_loras: u64::MAX,
            ..p
        };
        assert_eq!(huge.device_bytes(&g, DeviceKind::Cuda), u64::MAX);
    }

    #[test]
    fn full_layers_of_another_shape_count_at_the_wider() {
        // (full KV heads, full head dim, elements a rank a layer): q and o
        // at 9 heads of the wider dim, k and v at the wider of 3 x 64 and
        // the full layers' heads x dim.
        let cases = [
            (0, 0, 10176),
            // 9 x 128 = 1152 for q, 3 x 128 = 384 for k and v.
            (0, 128, 7 * 576 + 2 * 1152 + 2 * 384 + 3 * 1536),
            // 1 x 128 = 128 < 192 for k and v.
            (1, 128, 7 * 576 + 2 * 1152 + 2 * 192 + 3 * 1536),
            // Narrower full layers change nothing.
            (1, 32, 10176),
        ];
        for (full_kv_heads, full_head_dim, per_layer) in cases {
            let g = ModelGeometry {
                full_kv_heads,
                full_head_dim,
                ..smollm2()
            };
            assert_eq!(
                g.lora_adapter_bytes(16),
                per_layer * 16 * 30 * 2,
                "{full_kv_heads} x {full_head_dim}"
            );
        }
    }

    #[test]
    fn adapters_come_off_the_kv_budget_and_a_refusal_counts_them() {
        let g = smollm2();
        let config = crate::PlanConfig {
            memory_bytes: 1 << 30,
            ..crate::PlanConfig::default()
        };
        let block = config.block_size * g.kv_bytes_per_token();
        let without = crate::plan(&g, &config).unwrap();
        let with = crate::PlanConfig {
            adapter_bytes: 10 * block,
            ..config.clone()
        };
        let planned = crate::plan(&g, &with).unwrap();
        assert_eq!(planned.kv_blocks(), without.kv_blocks() - 10);
        assert_eq!(planned.adapter_bytes, 10 * block);
        assert_eq!(
            planned.total_bytes(),
            without.total_bytes() - 10 * block + 10 * block
        );
        let too_many = crate::PlanConfig {
            adapter_bytes: 1 << 30,
            ..config
        };
        let err = crate::plan(&g, &too_many).unwrap_err().to_string();
        assert!(err.contains("activations, runtime and adapters"), "{err}");
    }
}
