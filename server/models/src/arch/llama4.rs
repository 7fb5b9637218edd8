//! Llama 4 (Scout, Maverick; the text model of their multimodal wrapper):
//! Llama's layers where three of every four attend within chunks of
//! `attention_chunk_size` tokens with RoPE in adjacent pairs and q/k normed
//! without a weight, and the fourth is NoPE over the whole sequence with
//! the query temperature; every `interleave_moe_layer_step`-th layer routes
//! each token to its top-1 expert by sigmoid, the weight scaling the
//! expert's input, beside a shared expert. llama.cpp writes it as `llama4`,
//! the chunk (8192), the pattern (4) and the temperature (8192, 0.1) fixed
//! in its code, not the file.

use super::llama::plain_gguf;
use super::{Family, HfExperts, Shape, with_experts};
use crate::config::{HfConfig, Metadata};
use crate::error::{Error, Result};
use crate::spec::{Activation, Mixer, ModelSpec, MoeSpec, QueryTemperature, Routing};

/// Llama 4's checkpoints' feed-forward tensors (whole names: gate and up
/// stacked in one tensor per layer, `[experts, hidden, 2 * width]`).
const TENSORS: [(&str, &str); 10] = [
    ("ffn_gate_inp", "feed_forward.router"),
    ("ffn_gate_exps.weight", "feed_forward.experts.gate_up_proj"),
    ("ffn_up_exps.weight", "feed_forward.experts.gate_up_proj"),
    ("ffn_down_exps.weight", "feed_forward.experts.down_proj"),
    ("ffn_gate_shexp", "feed_forward.shared_expert.gate_proj"),
    ("ffn_up_shexp", "feed_forward.shared_expert.up_proj"),
    ("ffn_down_shexp", "feed_forward.shared_expert.down_proj"),
    ("ffn_gate", "feed_forward.gate_proj"),
    ("ffn_up", "feed_forward.up_proj"),
    ("ffn_down", "feed_forward.down_proj"),
];

/// Llama 4.
pub(super) static LLAMA4: Family = Family {
    name: "llama4",
    gguf: &["llama4"],
    hf: &[
        "Llama4ForCausalLM",
        "Llama4ForConditionalGeneration",
        "llama4_text",
        "llama4",
    ],
    hf_tensors: &TENSORS,
    gguf_tensors: &[],
    hf_layers: "layers",
    hf_experts: HfExperts::StackedHalvesInOut,
    tied_default: false,
    // Its checkpoints rotate adjacent pairs, and llama.cpp's converter
    // keeps them so: both are regrouped into halves at load.
    gguf_permuted_qk: true,
    hf_rope_pairs: true,
    from_hf,
    from_gguf,
};

/// What llama.cpp fixes for every Llama 4 file with chunks.
const GGUF_CHUNK: usize = 8192;
const GGUF_NO_ROPE_STEP: usize = 4;
const GGUF_TEMPERATURE: QueryTemperature = QueryTemperature {
    scale: 0.1,
    floor: 8192,
    offset: 1,
};

/// One layer's attention: rotary (chunked where the model has chunks,
/// q/k normed where it norms them) or NoPE (full, with the temperature).
#[derive(Debug, Clone, Copy)]
struct Sight {
    chunk: Option<usize>,
    qk_norm: bool,
    temperature: Option<QueryTemperature>,
}

/// Applies `sight` to every attention layer, `rotary[i]` saying which
/// rotate.
fn with_sight(spec: &mut ModelSpec, rotary: &[bool], sight: Sight) {
    for (l, &rotates) in spec.layers.iter_mut().zip(rotary) {
        if let Mixer::Attention(a) = &mut l.mixer {
            a.nope = !rotates;
            a.chunk = sight.chunk.filter(|_| rotates);
            a.qk_norm = sight.qk_norm && rotates;
            a.qk_norm_weightless = a.qk_norm;
            a.temperature = sight.temperature.filter(|_| !rotates);
        }
    }
}

/// The experts: top-1 (or `k`) by sigmoid, input-weighted, a shared
/// expert of their width.
fn experts((experts, top_k, intermediate): (usize, usize, usize)) -> MoeSpec {
    MoeSpec {
        experts,
        top_k,
        intermediate,
        activation: Activation::Silu,
        routing: Routing::TopKSigmoid,
        biases: false,
        shared: Some(intermediate),
        shared_gated: false,
        gated: true,
    }
}

fn from_hf(c: &HfConfig) -> Result<ModelSpec> {
    let mut spec = super::llama::llama_like(c, "llama4")?;
    if c.bool_or("attention_bias", false)? {
        return Err(Error::Config(
            "llama4 with attention biases is not supported".into(),
        ));
    }
    let layers = spec.layers.len();
    let rotary = super::smollm3::rotary_layers(c, layers)?;
    let temperature = match c.bool_or("attn_temperature_tuning", true)? {
        true => Some(QueryTemperature {
            scale: c.f64_opt("attn_scale")?.unwrap_or(0.1) as f32,
            floor: c.usize_or("floor_scale", 8192)?,
            offset: 1,
        }),
        false => None,
    };
    let sight = Sight {
        chunk: c.usize_opt("attention_chunk_size")?,
        qk_norm: c.bool_or("use_qk_norm", true)?,
        temperature,
    };
    with_sight(&mut spec, &rotary, sight);
    let width = c.usize("intermediate_size")?;
    spec.intermediate = c.usize_or("intermediate_size_mlp", width)?;
    let moe = experts((
        c.usize("num_local_experts")?,
        c.usize_or("num_experts_per_tok", 1)?,
        width,
    ));
    let moe_layers = moe_layers(c, layers)?;
    with_experts(&mut spec, Some(moe), |i| moe_layers[i]);
    Ok(spec)
}

/// Which layers have experts: `moe_layers`, else every
/// `interleave_moe_layer_step`-th from the step's own.
fn moe_layers(c: &HfConfig, layers: usize) -> Result<Vec<bool>> {
    let mut is = vec![false; layers];
    let listed = c.usizes("moe_layers")?;
    if listed.is_empty() && c.get("moe_layers").is_none_or(|v| v.is_null()) {
        let step = c.usize_or("interleave_moe_layer_step", 1)?.max(1);
        (step - 1..layers).step_by(step).for_each(|i| is[i] = true);
        return Ok(is);
    }
    for i in listed {
        *is.get_mut(i).ok_or_else(|| {
            Error::Config(format!(
                "config.json moe_layers names layer {i} of {layers}"
            ))
        })? = true;
    }
    Ok(is)
}

fn from_gguf(m: &Metadata<'_>) -> Result<ModelSpec> {
    let shape = Shape::gguf(m)?;
    let mut spec = plain_gguf(m, &shape, "llama4")?;
    let layers = spec.layers.len();
    // A window of 0 (MobileLLM's): every layer rotates over the whole
    // sequence; else llama.cpp's fixed chunks, pattern and temperature.
    let chunked = m.usize_opt("attention.sliding_window")? != Some(0);
    let rotary: Vec<bool> = (0..layers)
        .map(|i| !chunked || (i + 1) % GGUF_NO_ROPE_STEP != 0)
        .collect();
    let experts_n = m.usize("expert_count")?;
    let sight = Sight {
        chunk: chunked.then_some(GGUF_CHUNK),
        // llama.cpp: every Llama 4 but the 128-expert one (Maverick).
        qk_norm: experts_n != 128,
        temperature: chunked.then_some(GGUF_TEMPERATURE),
    };
    with_sight(&mut spec, &rotary, sight);
    // llama.cpp reads a nonzero `sliding_window` as these chunks, never as
    // a window.
    for l in &mut spec.layers {
        if let Mixer::Attention(a) = &mut l.mixer {
            a.window = None;
        }
    }
    let width = m.usize("expert_feed_forward_length")?;
    let moe = experts((experts_n, m.usize("expert_used_count")?, width));
    let step = m
        .usize_opt("interleave_moe_layer_step")?
        .unwrap_or(1)
        .max(1);
    with_experts(&mut spec, Some(moe), |i| (i + 1) % step == 0);
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::FeedForward;

    /// Llama 4 Scout's text config, eight layers of it.
    fn scout(extra: &str) -> HfConfig {
        HfConfig::parse(&format!(
            r#"{{"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
            "text_config": {{"model_type": "llama4_text", "hidden_size": 5120,
            "intermediate_size": 8192, "intermediate_size_mlp": 16384, "head_dim": 128,
            "num_attention_heads": 40, "num_key_value_heads": 8, "num_hidden_layers": 8,
            "num_local_experts": 16, "num_experts_per_tok": 1, "vocab_size": 202048,
            "max_position_embeddings": 10485760, "rms_norm_eps": 1e-05,
            "attention_chunk_size": 8192, "rope_theta": 500000.0,
            "rope_scaling": {{"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0,
            "high_freq_factor": 1.0, "original_max_position_embeddings": 8192}}{extra}}}}}"#
        ))
        .unwrap()
    }

    #[test]
    fn scout_chunks_three_layers_of_four_and_routes_every_one() {
        let spec = from_hf(&scout("")).unwrap().finish().unwrap();
        let attn: Vec<_> = spec.layers.iter().map(|l| l.attention().unwrap()).collect();
        let chunks: Vec<_> = attn.iter().map(|a| a.chunk).collect();
        let c = Some(8192);
        assert_eq!(chunks, [c, c, c, None, c, c, c, None]);
        assert!(attn[3].nope && !attn[2].nope);
        assert!(attn[0].qk_norm && attn[0].qk_norm_weightless && !attn[3].qk_norm);
        let t = QueryTemperature {
            scale: 0.1,
            floor: 8192,
            offset: 1,
        };
        assert_eq!((attn[3].temperature, attn[0].temperature), (Some(t), None));
        assert!(spec.layers.iter().all(
            |l| matches!(l.ffn, FeedForward::Moe(m) if m.intermediate == 8192
                    && m.shared == Some(8192) && m.weights_input())
        ));
        // The chunked layers keep a window pool of the chunk's size.
        let groups: Vec<_> = spec
            .kv_groups()
            .iter()
            .map(|g| (g.window, g.layers.len()))
            .collect();
        assert_eq!(groups, [(None, 2), (Some(8192), 6)]);
    }

    #[test]
    fn maverick_interleaves_dense_layers_of_their_own_width() {
        let extra = r#", "interleave_moe_layer_step": 2, "use_qk_norm": false"#;
        let spec = from_hf(&scout(extra)).unwrap();
        assert_eq!(spec.intermediate, 16384);
        let moe: Vec<bool> = spec
            .layers
            .iter()
            .map(|l| matches!(l.ffn, FeedForward::Moe(_)))
            .collect();
        assert_eq!(moe, [false, true, false, true, false, true, false, true]);
        assert!(!spec.layers[0].attention().unwrap().qk_norm);
        let listed = from_hf(&scout(r#", "moe_layers": [0, 5]"#)).unwrap();
        assert!(matches!(listed.layers[5].ffn, FeedForward::Moe(_)));
        assert!(!matches!(listed.layers[1].ffn, FeedForward::Moe(_)));
        let err = from_hf(&scout(r#", "moe_layers": [9]"#)).unwrap_err();
        assert!(err.to_string().contains("layer 9 of 8"), "{err}");
    }

    #[test]
    fn no_chunk_size_means_full_attention_and_a_short_no_rope_list_is_refused() {
        let spec = from_hf(&scout(r#", "attention_chunk_size": null"#)).unwrap();
        assert!(
            spec.layers
                .iter()
                .all(|l| l.attention().unwrap().chunk.is_none())
        );
        let err = from_hf(&scout(r#", "no_rope_layers": [1, 0]"#)).unwrap_err();
        assert!(err.to_string().contains("2 entries for 8 layers"), "{err}");
        let err = from_hf(&scout(r#", "attention_bias": true"#)).unwrap_err();
        assert!(err.to_string().contains("attention biases"), "{err}");
    }
}
