//! Test builders: tiny random-weight models written to disk in both formats,
//! and the real default model's path.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

/// The shape of a tiny test model.
#[derive(Debug, Clone, Copy)]
pub struct Tiny {
    pub arch: &'static str,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub vocab: usize,
    pub context: usize,
    /// Llama 3-style RoPE scaling (factor 4, original context 32).
    pub rope_scaling: bool,
}

impl Default for Tiny {
    fn default() -> Self {
        Tiny {
            arch: "llama",
            hidden: 64,
            intermediate: 128,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            vocab: 96,
            context: 256,
            rope_scaling: false,
        }
    }
}

impl Tiny {
    fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }
}

/// Deterministic pseudo-random values in [-scale, scale).
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// Random weights by Hugging Face name (q/k rows in HF order).
pub fn random_weights(t: &Tiny, seed: u64) -> HashMap<String, Tensor> {
    let d = Device::Cpu;
    let mut w = HashMap::new();
    let mut k = seed;
    let mut put = |name: String, shape: Vec<usize>, scale: f32, offset: f32| {
        k += 1;
        let n = shape.iter().product();
        let v: Vec<f32> = values(n, k, scale)
            .into_iter()
            .map(|x| x + offset)
            .collect();
        w.insert(name, Tensor::from_vec(v, shape, &d).unwrap());
    };
    let (qd, kvd) = (t.heads * t.head_dim(), t.kv_heads * t.head_dim());
    put(
        "model.embed_tokens.weight".into(),
        vec![t.vocab, t.hidden],
        1.0,
        0.0,
    );
    put("model.norm.weight".into(), vec![t.hidden], 0.1, 1.0);
    for i in 0..t.layers {
        let p = |s: &str| format!("model.layers.{i}.{s}");
        put(p("input_layernorm.weight"), vec![t.hidden], 0.1, 1.0);
        put(
            p("post_attention_layernorm.weight"),
            vec![t.hidden],
            0.1,
            1.0,
        );
        put(p("self_attn.q_proj.weight"), vec![qd, t.hidden], 0.3, 0.0);
        put(p("self_attn.k_proj.weight"), vec![kvd, t.hidden], 0.3, 0.0);
        put(p("self_attn.v_proj.weight"), vec![kvd, t.hidden], 0.3, 0.0);
        put(p("self_attn.o_proj.weight"), vec![t.hidden, qd], 0.2, 0.0);
        put(
            p("mlp.gate_proj.weight"),
            vec![t.intermediate, t.hidden],
            0.2,
            0.0,
        );
        put(
            p("mlp.up_proj.weight"),
            vec![t.intermediate, t.hidden],
            0.2,
            0.0,
        );
        put(
            p("mlp.down_proj.weight"),
            vec![t.hidden, t.intermediate],
            0.2,
            0.0,
        );
        if t.arch == "qwen2" {
            put(p("self_attn.q_proj.bias"), vec![qd], 0.1, 0.0);
            put(p("self_attn.k_proj.bias"), vec![kvd], 0.1, 0.0);
            put(p("self_attn.v_proj.bias"), vec![kvd], 0.1, 0.0);
        }
    }
    w
}

static SCALING: std::sync::LazyLock<serde_json::Value> = std::sync::LazyLock::new(|| {
    serde_json::json!({"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
});

/// Writes `config.json` and `model.safetensors` into `dir`.
pub fn write_safetensors(dir: &Path, t: &Tiny, weights: &HashMap<String, Tensor>) {
    let arch = match t.arch {
        "qwen2" => "Qwen2ForCausalLM",
        _ => "LlamaForCausalLM",
    };
    let config = serde_json::json!({
        "architectures": [arch], "hidden_size": t.hidden, "intermediate_size": t.intermediate,
        "num_hidden_layers": t.layers, "num_attention_heads": t.heads,
        "num_key_value_heads": t.kv_heads, "vocab_size": t.vocab,
        "max_position_embeddings": t.context, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": true,
        "rope_scaling": if t.rope_scaling { SCALING.clone() } else { serde_json::Value::Null },
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    candle_core::safetensors::save(weights, dir.join("model.safetensors")).unwrap();
}

/// llama.cpp's q/k row interleaving (the inverse of the loader's).
fn permute(w: &Tensor, heads: usize) -> Tensor {
    let (rows, cols) = w.dims2().unwrap();
    let d = rows / heads;
    w.reshape((heads, 2, d / 2, cols))
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .reshape((rows, cols))
        .unwrap()
}

fn gguf_name(hf: &str) -> String {
    let fixed = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
    ];
    if let Some((_, g)) = fixed.iter().find(|(h, _)| *h == hf) {
        return g.to_string();
    }
    let rest = hf.strip_prefix("model.layers.").unwrap();
    let (layer, tail) = rest.split_once('.').unwrap();
    let (part, suffix) = tail.rsplit_once('.').unwrap();
    let g = match part {
        "input_layernorm" => "attn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "post_attention_layernorm" => "ffn_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        other => panic!("unmapped {other}"),
    };
    format!("blk.{layer}.{g}.{suffix}")
}

/// Writes the weights as a GGUF file, matrices as `dtype`, vectors as F32.
pub fn write_gguf(path: &Path, t: &Tiny, weights: &HashMap<String, Tensor>, dtype: GgmlDType) {
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    let mut names: Vec<&String> = weights.keys().collect();
    names.sort();
    for hf in names {
        let mut w = weights[hf].clone();
        if t.arch != "qwen2" && hf.ends_with("q_proj.weight") {
            w = permute(&w, t.heads);
        } else if t.arch != "qwen2" && hf.ends_with("k_proj.weight") {
            w = permute(&w, t.kv_heads);
        }
        let ty = if w.rank() == 2 { dtype } else { GgmlDType::F32 };
        tensors.push((gguf_name(hf), QTensor::quantize(&w, ty).unwrap()));
    }
    if t.rope_scaling {
        // llama.cpp's converter stores the divisors the HF config implies.
        let (_, spec) = crate::arch::from_hf(
            &serde_json::json!({"architectures": ["LlamaForCausalLM"], "hidden_size": t.hidden,
                "intermediate_size": t.intermediate, "num_hidden_layers": t.layers,
                "num_attention_heads": t.heads, "num_key_value_heads": t.kv_heads,
                "vocab_size": t.vocab, "max_position_embeddings": t.context,
                "rope_theta": 10000.0, "rope_scaling": SCALING.clone()})
            .to_string(),
        )
        .unwrap();
        let crate::spec::RopeScaling::Divisors(f) = spec.ropes[0].scaling.clone() else {
            panic!("llama3 scaling is per-frequency divisors");
        };
        let n = f.len();
        let f = Tensor::from_vec(f, n, &Device::Cpu).unwrap();
        tensors.push((
            "rope_freqs.weight".into(),
            QTensor::quantize(&f, GgmlDType::F32).unwrap(),
        ));
    }
    let a = t.arch;
    let u = |v: usize| Value::U32(v as u32);
    let md: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(a.into())),
        (format!("{a}.embedding_length"), u(t.hidden)),
        (format!("{a}.feed_forward_length"), u(t.intermediate)),
        (format!("{a}.block_count"), u(t.layers)),
        (format!("{a}.attention.head_count"), u(t.heads)),
        (format!("{a}.attention.head_count_kv"), u(t.kv_heads)),
        (format!("{a}.context_length"), u(t.context)),
        (format!("{a}.vocab_size"), u(t.vocab)),
        (format!("{a}.rope.freq_base"), Value::F32(10000.0)),
        (
            format!("{a}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-5),
        ),
    ];
    let md_refs: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut f = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut f, &md_refs, &t_refs).unwrap();
}

/// The default model, if fetched (`scripts/fetch-model`). With
/// `FERROX_REQUIRE_MODEL=1` (as CI sets) a missing model fails the test
/// instead of skipping it.
pub fn default_model() -> Option<PathBuf> {
    let p =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        return Some(p);
    }
    assert!(
        std::env::var("FERROX_REQUIRE_MODEL").as_deref() != Ok("1"),
        "{} missing and FERROX_REQUIRE_MODEL=1",
        p.display()
    );
    eprintln!(
        "skipping: {} not fetched (run scripts/fetch-model)",
        p.display()
    );
    None
}

/// A packed `[rows, cols]` matrix of random weights quantised to `ty`.
fn random_packed(rows: usize, cols: usize, seed: u64, ty: GgmlDType) -> crate::linear::Linear {
    let scale = 1.2 / (cols as f32).sqrt();
    let t = Tensor::from_vec(values(rows * cols, seed, scale), (rows, cols), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&t, ty).unwrap();
    let bytes = q.data().unwrap().to_vec();
    let kt = crate::holding::kernel_type(ty).unwrap();
    let m = ferrox_kernels::QMatrix::new(kt, rows, cols, bytes).unwrap();
    crate::linear::Linear::Packed(std::sync::Arc::new(m))
}

/// A random gated MLP of width `inter` (with biases when `biases`).
fn random_mlp(hidden: usize, inter: usize, seed: u64, biases: bool) -> crate::ffn::mlp::Mlp {
    use crate::ffn::mlp::Mlp;
    use crate::projection::Projection;
    let bias = |n: usize, s: u64| {
        biases.then(|| Tensor::from_vec(values(n, s, 0.2), n, &Device::Cpu).unwrap())
    };
    Mlp {
        gate_up: Projection::Fused(random_packed(2 * inter, hidden, seed, GgmlDType::Q8_0)),
        down: random_packed(hidden, inter, seed + 1, GgmlDType::Q4_0),
        gate_up_bias: bias(2 * inter, seed + 2),
        down_bias: bias(hidden, seed + 3),
    }
}

/// A mixture-of-experts layer of `spec` with random packed weights.
pub fn random_moe(
    spec: crate::spec::MoeSpec,
    hidden: usize,
    seed: u64,
) -> crate::ffn::moe::MoeWeights {
    let d = Device::Cpu;
    let router = values(spec.experts * hidden, seed, 1.2 / (hidden as f32).sqrt());
    let shared = spec.shared.map(|w| {
        let gate = Tensor::from_vec(values(hidden, seed + 7, 0.3), hidden, &d).unwrap();
        (
            random_mlp(hidden, w, seed + 11, false),
            spec.shared_gated.then_some(gate),
        )
    });
    crate::ffn::moe::MoeWeights {
        spec,
        router: Tensor::from_vec(router, (spec.experts, hidden), &d).unwrap(),
        router_bias: spec.biases.then(|| {
            Tensor::from_vec(values(spec.experts, seed + 5, 0.5), spec.experts, &d).unwrap()
        }),
        experts: (0..spec.experts)
            .map(|e| {
                random_mlp(
                    hidden,
                    spec.intermediate,
                    seed + 100 * (e as u64 + 1),
                    spec.biases,
                )
            })
            .collect(),
        correction: matches!(spec.routing, crate::spec::Routing::SigmoidGroups { .. }).then(|| {
            Tensor::from_vec(values(spec.experts, seed + 9, 0.2), spec.experts, &d).unwrap()
        }),
        shared,
        reads: std::sync::Arc::new(crate::ffn::moe::ExpertReads::new(spec.experts)),
    }
}

/// `n` deterministic pseudo-random values in [-scale, scale).
pub fn random_values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    values(n, seed, scale)
}

/// The largest absolute difference between two tensors of one shape.
pub fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .and_then(|d| d.abs())
        .and_then(|d| d.flatten_all())
        .and_then(|d| d.max(0))
        .and_then(|d| d.to_scalar::<f32>())
        .unwrap()
}
