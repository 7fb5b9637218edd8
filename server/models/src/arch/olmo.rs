//! OLMo 2 and OLMo 3: the Llama layout with no input norms, an RMSNorm of
//! each block's output before its residual add instead (the post-norms
//! Gemma adds to its pre-norms), and q/k RMSNorms over every head at once
//! (one weight of `heads * head_dim`). OLMo 3 slides a window on the layers
//! `layer_types` names (three of every four), its RoPE per layer kind.
//! llama.cpp reads both as `olmo2`, with the window pattern in the file.

use super::rope::hf_rope;
use super::{Family, HfExperts, Shape, sliding_pattern, swiglu_layer};
use crate::config::{HfConfig, Metadata};
use crate::error::{Error, Result};
use crate::spec::{LayerSpec, Mixer, ModelSpec, Norms};

/// Their Hugging Face names: `post_attention_layernorm` is the attention's
/// post-norm here, not the MLP's input norm.
const TENSORS: &[(&str, &str)] = &[
    ("post_attention_norm", "post_attention_layernorm"),
    ("post_ffw_norm", "post_feedforward_layernorm"),
];

/// OLMo 2 and 3.
pub(super) static OLMO2: Family = Family {
    name: "olmo2",
    gguf: &["olmo2"],
    hf: &["Olmo2ForCausalLM", "Olmo3ForCausalLM", "olmo2", "olmo3"],
    hf_tensors: TENSORS,
    hf_layers: "layers",
    gguf_tensors: &[],
    hf_experts: HfExperts::PerExpert,
    tied_default: false,
    gguf_permuted_qk: false,
    hf_rope_pairs: false,
    from_hf,
    from_gguf,
};

/// Post-norms only.
fn norms(eps: f64) -> Norms {
    Norms {
        eps,
        layer_norm: false,
        after_residual: false,
        offset: 0.0,
        pre: false,
        post_attention: true,
        post_ffn: true,
    }
}

/// A SwiGLU layer with whole-width q/k norms, attending with `window` and
/// RoPE `rope`.
fn layer(window: Option<usize>, scale: f32, rope: usize) -> LayerSpec {
    let mut l = swiglu_layer(window, scale, true);
    if let Mixer::Attention(a) = &mut l.mixer {
        a.qk_norm_whole = true;
        a.rope = rope;
    }
    l
}

fn from_hf(c: &HfConfig) -> Result<ModelSpec> {
    let shape = Shape::hf(c, &[])?;
    let hd = shape.head_dim;
    let legacy = ("rope_theta", Some("rope_scaling"));
    let full = hf_rope(c, Some("full_attention"), legacy, 10_000.0, hd)?;
    let local = hf_rope(c, Some("sliding_attention"), legacy, 10_000.0, hd)?;
    let window = c.usize_opt("sliding_window")?.filter(|&w| w > 0);
    // OLMo 2 names no window; OLMo 3 every fourth layer full by default.
    let slides = match window {
        Some(_) => sliding_pattern(c, shape.layers, |i| (i + 1) % 4 != 0)?,
        None => vec![false; shape.layers],
    };
    let eps = c.f64_opt("rms_norm_eps")?.unwrap_or(1e-6);
    let scale = shape.plain_scale();
    Ok(shape.spec("olmo2", norms(eps), vec![full, local], |i| {
        layer(window.filter(|_| slides[i]), scale, usize::from(slides[i]))
    }))
}

fn from_gguf(m: &Metadata<'_>) -> Result<ModelSpec> {
    let shape = Shape::gguf(m)?;
    let window = m.usize_opt("attention.sliding_window")?.filter(|&w| w > 0);
    let slides = match (window, m.bools_opt("attention.sliding_window_pattern")?) {
        (Some(_), Some(list)) if list.len() != shape.layers => {
            return Err(Error::Config(format!(
                "{} sliding-window pattern entries for {} layers",
                list.len(),
                shape.layers
            )));
        }
        (Some(_), Some(list)) => list,
        (Some(_), None) => (0..shape.layers).map(|i| (i + 1) % 4 != 0).collect(),
        (None, _) => vec![false; shape.layers],
    };
    let eps = m
        .f32_opt("attention.layer_norm_rms_epsilon")?
        .unwrap_or(1e-6);
    let rope = m.plain_rope(shape.head_dim)?;
    let scale = shape.plain_scale();
    Ok(shape.spec("olmo2", norms(f64::from(eps)), vec![rope], |i| {
        layer(window.filter(|_| slides[i]), scale, 0)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::tests::eight_layers as config;

    fn windows(spec: &ModelSpec) -> Vec<Option<usize>> {
        (spec.layers.iter())
            .map(|l| l.attention().unwrap().window)
            .collect()
    }

    #[test]
    fn olmo2_has_post_norms_only_and_whole_width_qk_norms() {
        let spec = from_hf(&config("")).unwrap();
        let n = &spec.norms;
        assert!(!n.pre && n.post_attention && n.post_ffn && !n.after_residual);
        let a = spec.layers[0].attention().unwrap();
        assert!(a.qk_norm && a.qk_norm_whole);
        assert!(windows(&spec).iter().all(Option::is_none));
    }

    #[test]
    fn olmo3_slides_where_layer_types_say_with_that_kinds_rope() {
        let types = r#", "sliding_window": 16, "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 500000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}"#;
        let spec = from_hf(&config(types)).unwrap();
        let want: Vec<_> = (0..8).map(|i| ((i + 1) % 4 != 0).then_some(16)).collect();
        assert_eq!(windows(&spec), want);
        let rope_of = |i: usize| spec.ropes[spec.layers[i].attention().unwrap().rope].theta;
        assert_eq!((rope_of(0), rope_of(3)), (10_000.0, 500_000.0));
        let listed = r#", "sliding_window": 16, "layer_types": ["full_attention"]"#;
        let err = from_hf(&config(listed)).unwrap_err().to_string();
        assert!(err.contains("1 entries for 8 layers"), "{err}");
    }
}
