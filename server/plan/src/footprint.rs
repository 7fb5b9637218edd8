//! How a model is held on each kind of device: the weight bytes and KV dtype
//! the server really allocates there, which is what the plan must count.

use serde::{Deserialize, Serialize};

use crate::{KvDtype, ModelGeometry};

/// The kind of device a server runs its model on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// Host memory (the container's memory limit).
    #[default]
    Cpu,
    /// An NVIDIA GPU's memory.
    Cuda,
}

impl DeviceKind {
    /// The server's `--device` value for this kind.
    pub fn arg(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
        }
    }

    /// Concurrent sequences when none are asked for, on the server and in
    /// the operator's plan alike: 16 on CPU, where every row of a decode step
    /// costs compute (and 16 full 8k-token SmolLM2 sequences are 3 GB of KV);
    /// vLLM's 256 on GPU.
    pub fn default_max_seqs(self) -> u64 {
        match self {
            DeviceKind::Cpu => 16,
            DeviceKind::Cuda => crate::DEFAULT_MAX_SEQS,
        }
    }

    /// Bytes the runtime itself takes on the device beyond weights, KV and
    /// activations: on CPU code, threads and allocator slack (measured: 32
    /// MiB, see docs/benchmarks.md); on CUDA the context and cuBLAS workspaces.
    pub fn runtime_overhead_bytes(self) -> u64 {
        match self {
            DeviceKind::Cpu => 32 << 20,
            DeviceKind::Cuda => 768 << 20,
        }
    }

    /// Bytes per vocabulary entry the tokenizer's tables take on the device
    /// (only the CPU holds them; measured ~200, rounded up).
    pub fn tokenizer_bytes_per_token(self) -> u64 {
        match self {
            DeviceKind::Cpu => 256,
            DeviceKind::Cuda => 0,
        }
    }

    /// The KV dtype `--kv-dtype auto` picks: f16 on CPU (llama.cpp's default
    /// too), the model's half type on GPU.
    pub fn auto_kv_dtype(self, model_half: KvDtype) -> KvDtype {
        match self {
            DeviceKind::Cpu => KvDtype::F16,
            DeviceKind::Cuda => model_half,
        }
    }
}

impl std::fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
        })
    }
}

/// A model's bytes as held on one kind of device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Footprint {
    /// Bytes of weights resident on the device, in the dtypes held there.
    pub weight_bytes: u64,
    /// KV cache element type used there by default.
    pub kv_dtype: KvDtype,
    /// Bytes of K and V per token in that dtype.
    pub kv_bytes_per_token: u64,
}

/// The footprint on each device kind, as `ferrox-server inspect --json`
/// reports it under `devices`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Footprints {
    /// On CPU.
    pub cpu: Footprint,
    /// On CUDA.
    pub cuda: Footprint,
}

impl Footprints {
    /// The footprint on `kind`.
    pub fn on(&self, kind: DeviceKind) -> &Footprint {
        match kind {
            DeviceKind::Cpu => &self.cpu,
            DeviceKind::Cuda => &self.cuda,
        }
    }
}

impl ModelGeometry {
    /// This geometry as held with `footprint`'s weights and KV dtype.
    pub fn held_as(&self, footprint: &Footprint) -> ModelGeometry {
        ModelGeometry {
            weight_bytes: footprint.weight_bytes,
            kv_dtype: footprint.kv_dtype,
            ..self.clone()
        }
    }

    /// The footprint of this geometry as it stands.
    pub fn footprint(&self) -> Footprint {
        Footprint {
            weight_bytes: self.weight_bytes,
            kv_dtype: self.kv_dtype,
            kv_bytes_per_token: self.kv_bytes_per_token(),
        }
    }

    /// Peak activation bytes of one forward step over `tokens` tokens of
    /// which `logit_rows` are sampled, with `elem_bytes`-byte activations:
    /// the residual stream and the widest layer's intermediates, plus the
    /// logit rows and their host copies. Zero for shape facts not given.
    pub fn activation_bytes(&self, tokens: u64, logit_rows: u64, elem_bytes: u64) -> u64 {
        let qkv = match self.kv_latent_dim {
            // Latent attention in the absorbed form holds three rows of
            // the latent's width a head at once: each head's query carried
            // into it, the attention's output, and the weighted latent
            // leaving through the value half.
            // Per head: q, k and v rows, at the wider of the windowed and
            // full layers' shapes (activations are an upper bound).
            0 => [self.kv_shape(), self.full_kv_shape()]
                .map(|kv| (self.heads + 2 * kv.kv_heads) * kv.head_dim)
                .into_iter()
                .max()
                .unwrap_or(0),
            latent => 3 * self.heads * latent,
        };
        // A mixer that runs op by op beside a fused feed-forward (latent
        // attention, a recurrent layer) allocates its rows while the
        // feed-forward's buffers stay held (gate and up, its input and
        // output): both count.
        let held_ffn = match self.kv_latent_dim > 0 || self.recurrent_layers > 0 {
            true => 3 * self.intermediate_size + 2 * self.hidden_size,
            false => 0,
        };
        // x, residual, norm output and attention output; gate, up and their
        // product; the fused q/k/v projection.
        let per_token = 4 * self.hidden_size + 3 * self.intermediate_size + qkv + held_ffn;
        let logits = 2 * logit_rows * self.vocab_size * 4;
        tokens
            .saturating_mul(per_token)
            .saturating_mul(elem_bytes)
            .saturating_add(logits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_kv_dtype_per_device() {
        assert_eq!(DeviceKind::Cpu.auto_kv_dtype(KvDtype::Bf16), KvDtype::F16);
        assert_eq!(DeviceKind::Cuda.auto_kv_dtype(KvDtype::Bf16), KvDtype::Bf16);
        assert_eq!(DeviceKind::Cuda.auto_kv_dtype(KvDtype::F16), KvDtype::F16);
    }

    #[test]
    fn held_as_swaps_only_the_held_bytes() {
        let g = ModelGeometry {
            layers: 2,
            kv_heads: 2,
            head_dim: 8,
            kv_dtype: KvDtype::F32,
            weight_bytes: 100,
            context_length: 64,
            ..ModelGeometry::default()
        };
        let f = Footprint {
            weight_bytes: 50,
            kv_dtype: KvDtype::F16,
            kv_bytes_per_token: 128,
        };
        let h = g.held_as(&f);
        assert_eq!(
            (h.weight_bytes, h.kv_dtype, h.layers),
            (50, KvDtype::F16, 2)
        );
        assert_eq!(h.footprint(), f);
    }

    #[test]
    fn activation_estimate_counts_every_part() {
        let g = ModelGeometry {
            layers: 1,
            heads: 4,
            kv_heads: 2,
            head_dim: 8,
            hidden_size: 32,
            intermediate_size: 64,
            vocab_size: 100,
            context_length: 64,
            ..ModelGeometry::default()
        };
        // per token: 4*32 + 3*64 + (4 + 4) * 8 = 384 elements.
        assert_eq!(g.activation_bytes(10, 0, 4), 10 * 384 * 4);
        assert_eq!(g.activation_bytes(10, 3, 2), 10 * 384 * 2 + 2 * 3 * 100 * 4);
        assert_eq!(g.activation_bytes(u64::MAX, 1, 4), u64::MAX);
        assert_eq!(ModelGeometry::default().activation_bytes(512, 16, 4), 0);
        // Full layers of another shape (Gemma 4's global ones): the rows of
        // the wider, (4 + 2 x 1) x 32 = 192 over (4 + 2 x 2) x 8 = 64, and
        // the narrower changes nothing.
        let global = |full_kv_heads, full_head_dim| ModelGeometry {
            full_kv_heads,
            full_head_dim,
            ..g.clone()
        };
        for (full_kv_heads, full_head_dim, qkv) in [(1, 32, 192), (1, 0, 64), (0, 4, 64)] {
            let per_token = 128 + 192 + qkv;
            assert_eq!(
                global(full_kv_heads, full_head_dim).activation_bytes(10, 0, 4),
                10 * per_token * 4,
                "{full_kv_heads} x {full_head_dim}"
            );
        }
        // Latent attention: 3 rows of 24 for each of the 4 heads, not q, k
        // and v of the cached width (measured: DeepSeek-V2-Lite's shape at
        // 16 streams peaked 32 MiB over the q/k/v count), and the fused
        // feed-forward's held buffers beside them (its peak rose 68 MiB
        // when its feed-forwards took the fused path).
        let latent = ModelGeometry {
            kv_heads: 1,
            head_dim: 24,
            kv_latent_dim: 24,
            ..g.clone()
        };
        let held = 3 * 64 + 2 * 32;
        assert_eq!(
            latent.activation_bytes(10, 0, 4),
            10 * (128 + 192 + 3 * 4 * 24 + held) * 4
        );
        let recurrent = ModelGeometry {
            recurrent_layers: 1,
            ..g
        };
        assert_eq!(recurrent.activation_bytes(10, 0, 4), 10 * (384 + held) * 4);
    }

    #[test]
    fn inspect_devices_json_round_trips() {
        let json = r#"{"cpu":{"weightBytes":10,"kvDtype":"f16","kvBytesPerToken":4},"cuda":{"weightBytes":20,"kvDtype":"bf16","kvBytesPerToken":4}}"#;
        let f: Footprints = serde_json::from_str(json).unwrap();
        assert_eq!(f.on(DeviceKind::Cuda).weight_bytes, 20);
        assert_eq!(f.on(DeviceKind::Cpu).kv_dtype, KvDtype::F16);
        assert_eq!(serde_json::to_string(&f).unwrap(), json);
    }
}
