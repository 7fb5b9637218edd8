//! Test builders: random adapters for the tiny test models, written as
//! PEFT directories and as llama.cpp GGUF LoRA files, and the base merged
//! with an adapter (the reference an unmerged update must equal).

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use super::{LoraShapes, Target};
use crate::fixtures::Tiny;

/// An adapter to make.
#[derive(Debug, Clone)]
pub struct LoraSpec {
    pub rank: usize,
    pub alpha: f32,
    pub targets: Vec<Target>,
    pub seed: u64,
}

impl LoraSpec {
    /// Rank `rank` over every projection.
    pub fn all(rank: usize, seed: u64) -> Self {
        LoraSpec {
            rank,
            alpha: 2.0 * rank as f32,
            targets: Target::ALL.to_vec(),
            seed,
        }
    }

    /// PEFT's scale without rsLoRA.
    pub fn scale(&self) -> f32 {
        self.alpha / self.rank as f32
    }
}

fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let v = ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale;
            half::f16::from_f32(v).to_f32()
        })
        .collect()
}

/// The tiny model's shapes (its config through the real reader).
pub fn shapes(t: &Tiny) -> LoraShapes {
    let arch = if t.arch == "qwen2" {
        "Qwen2ForCausalLM"
    } else {
        "LlamaForCausalLM"
    };
    let config = serde_json::json!({"architectures": [arch], "hidden_size": t.hidden,
        "intermediate_size": t.intermediate, "num_hidden_layers": t.layers,
        "num_attention_heads": t.heads, "num_key_value_heads": t.kv_heads,
        "vocab_size": t.vocab, "max_position_embeddings": t.context});
    LoraShapes::of(&crate::arch::from_hf(&config.to_string()).unwrap().1)
}

/// Random `lora_A` / `lora_B` by PEFT name (B nonzero, unlike PEFT's
/// initialisation, so the update shows), each value one f16 holds exactly
/// (adapters are held in f16: the merged reference then sees the same
/// numbers).
pub fn random_peft(t: &Tiny, spec: &LoraSpec) -> HashMap<String, Tensor> {
    random_peft_of(&shapes(t), spec)
}

/// [`random_peft`] for a base of `s`'s shapes (any family's).
pub fn random_peft_of(s: &LoraShapes, spec: &LoraSpec) -> HashMap<String, Tensor> {
    let mut out = HashMap::new();
    let mut seed = spec.seed * 1000;
    for layer in 0..s.layers {
        for &target in &spec.targets {
            let (rows, cols) = s.dims(target);
            let p = format!(
                "base_model.model.model.layers.{layer}.{}",
                target.module_path()
            );
            seed += 2;
            let a = values(spec.rank * cols, seed, 0.3);
            let b = values(rows * spec.rank, seed + 1, 0.3);
            let a = Tensor::from_vec(a, (spec.rank, cols), &Device::Cpu).unwrap();
            let b = Tensor::from_vec(b, (rows, spec.rank), &Device::Cpu).unwrap();
            out.insert(format!("{p}.lora_A.weight"), a);
            out.insert(format!("{p}.lora_B.weight"), b);
        }
    }
    out
}

/// Writes a PEFT directory: `adapter_config.json` and the tensors.
pub fn write_peft(dir: &Path, spec: &LoraSpec, tensors: &HashMap<String, Tensor>) {
    std::fs::create_dir_all(dir).unwrap();
    let modules: Vec<&str> = spec.targets.iter().map(|t| t.module()).collect();
    let config = serde_json::json!({"peft_type": "LORA", "r": spec.rank,
        "lora_alpha": spec.alpha, "target_modules": modules, "bias": "none",
        "use_rslora": false, "use_dora": false, "task_type": "CAUSAL_LM"});
    std::fs::write(dir.join("adapter_config.json"), config.to_string()).unwrap();
    candle_core::safetensors::save(tensors, dir.join("adapter_model.safetensors")).unwrap();
}

/// llama.cpp's q/k row interleaving, of a `(rows, rank)` B.
fn permute(b: &Tensor, heads: usize) -> Tensor {
    let (rows, cols) = b.dims2().unwrap();
    let d = rows / heads;
    b.reshape((heads, 2, d / 2, cols))
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .reshape((rows, cols))
        .unwrap()
}

/// Writes the same adapter as `convert_lora_to_gguf.py` does: llama.cpp
/// names, q/k B rows interleaved for the llama family, alpha in metadata.
pub fn write_gguf_lora(path: &Path, t: &Tiny, spec: &LoraSpec, tensors: &HashMap<String, Tensor>) {
    let mut out: Vec<(String, QTensor)> = Vec::new();
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    for name in names {
        let rest = name.strip_prefix("base_model.model.model.layers.").unwrap();
        let (layer, tail) = rest.split_once('.').unwrap();
        let (module, half) = tail.rsplit_once(".lora_").unwrap();
        let target = Target::from_module(module).unwrap();
        let mut w = tensors[name].clone();
        if t.arch != "qwen2" && half == "B.weight" {
            match target {
                Target::Q => w = permute(&w, t.heads),
                Target::K => w = permute(&w, t.kv_heads),
                _ => {}
            }
        }
        let suffix = if half == "A.weight" {
            "lora_a"
        } else {
            "lora_b"
        };
        let g = format!("blk.{layer}.{}.weight.{suffix}", target.gguf());
        out.push((g, QTensor::quantize(&w, GgmlDType::F32).unwrap()));
    }
    let md: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String(t.arch.into())),
        ("general.type", Value::String("adapter".into())),
        ("adapter.type", Value::String("lora".into())),
        ("adapter.lora.alpha", Value::F32(spec.alpha)),
    ];
    let md_refs: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (*k, v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = out.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut f = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut f, &md_refs, &t_refs).unwrap();
}

/// The base weights with the adapter merged in: `W + scale * B @ A`.
pub fn merged(
    base: &HashMap<String, Tensor>,
    spec: &LoraSpec,
    lora: &HashMap<String, Tensor>,
) -> HashMap<String, Tensor> {
    let mut out = base.clone();
    for (name, a) in lora {
        let Some(stem) = name.strip_suffix(".lora_A.weight") else {
            continue;
        };
        let b = &lora[&format!("{stem}.lora_B.weight")];
        let w_name = format!("{}.weight", stem.strip_prefix("base_model.model.").unwrap());
        let delta = (b.matmul(a).unwrap() * f64::from(spec.scale())).unwrap();
        let w = (&out[&w_name] + delta).unwrap();
        out.insert(w_name, w);
    }
    out
}
