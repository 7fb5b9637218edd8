//! GGUF's f16 matrices on CPU: held in f16 for ferrox-kernels' f16 matmul
//! (half of the f32 they were widened to), counted so by `inspect`. That
//! they compute what transformers does is `families`' check: the llama,
//! qwen2, qwen3, phi3 and MoE fixtures are f16 GGUFs.

use candle_core::Device;

use super::reference::dir;
use crate::Source;

#[test]
fn an_f16_gguf_holds_its_matrices_in_f16_as_inspect_counts() {
    for family in ["qwen2", "qwen3", "mistral", "qwen2moe"] {
        let path = dir(family).join("model.gguf");
        let mut src = Source::open(&path).unwrap();
        let info = src.info().unwrap();
        let half = src.decoder(&Device::Cpu).unwrap().held_bytes();
        assert_eq!(info.devices.cpu.weight_bytes, half, "{family}");
        // The reference path (kernels off) widens them to f32.
        let mut src = Source::open(&path).unwrap();
        if let Source::Gguf(g) = &mut src {
            g.set_packed_kernels(false);
        }
        let widened = src.decoder(&Device::Cpu).unwrap().held_bytes();
        assert!(
            half * 10 < widened * 7,
            "{family}: {half} bytes held in f16, {widened} widened"
        );
    }
}
