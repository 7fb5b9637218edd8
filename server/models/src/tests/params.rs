//! Total and active parameters as `inspect` reports them, against
//! transformers' count of the committed models (`sum(p.numel())`, a tied
//! embedding once; active: less the routed experts a token does not run).

use candle_core::Device;
use ferrox_plan::DeviceKind;

use super::reference::{dir, reference};
use crate::Source;

#[test]
fn inspect_counts_every_expert_and_the_ones_a_token_runs() {
    // (family, parameters, active parameters)
    let cases = [
        // 2 layers of 4 experts of 3 x 64 x 64, 2 a token.
        ("mixtral", 164_672, 115_520),
        // 2 layers of 8 experts of 3 x 64 x 32, 2 a token.
        ("qwen3moe", 189_888, 116_160),
        // Experts on layer 1 only (sparse step 2, layer 3 dense); tied.
        ("qwen3moe_sparse", 218_176, 205_888),
        // The shared expert runs for every token.
        ("qwen2moe", 140_480, 115_904),
        // Every layer's 4 experts, biased, 2 a token.
        ("gpt_oss", 192_864, 142_688),
        ("llama", 115_008, 115_008),
        // transformers' count plus each layer's `layer_scalar` (a buffer
        // there, stored in the checkpoint).
        ("gemma4", 323_736 + 6, 323_736 + 6),
        // 4 layers of 4 experts of 3 x 64 x 32 beside the MLP, 2 a token.
        ("gemma4_moe", 281_872 + 4, 281_872 + 4 - 4 * 2 * 6_144),
    ];
    for (family, params, active) in cases {
        let r = reference(family);
        let mut paths = vec![dir(family)];
        // The GGUF of a mixture stores the same tensors, experts stacked.
        // (Llama's and Gemma 4's also store their RoPE divisors,
        // `rope_freqs`, which `inspect` counts as parameters.)
        if !matches!(family, "llama" | "gemma4" | "gemma4_moe") {
            paths.extend(r.gguf_path());
        }
        for path in paths {
            let info = Source::open(&path).unwrap().info().unwrap();
            let got = (info.facts.params, info.facts.active_params);
            assert_eq!(got, (params, active), "{}", path.display());
            let g = info.geometry(DeviceKind::Cpu, ferrox_plan::KvDtype::F16);
            assert_eq!((g.params, g.active_params), got);
            // Every expert held, on either device, as the plan counts.
            for kind in [DeviceKind::Cpu, DeviceKind::Cuda] {
                let mut src = Source::open(&path).unwrap();
                let held = src
                    .decoder_held_as(&Device::Cpu, kind)
                    .unwrap()
                    .held_bytes();
                let want = info.devices.on(kind).weight_bytes;
                assert_eq!(held, want, "{}: held as on {kind}", path.display());
            }
            let json = serde_json::to_value(&info).unwrap();
            assert_eq!(json["params"], params, "{family}: inspect --json");
            assert_eq!(json["activeParams"], active, "{family}: inspect --json");
        }
    }
}
