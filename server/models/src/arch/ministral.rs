//! Ministral 3 (3B, 8B, 14B; the text model of Mistral 3's multimodal
//! wrapper too): Mistral's layers, YaRN whose attention factor is the
//! ratio of two mscales, and Llama 4's query temperature by position
//! (`llama_4_scaling_beta`, its step the pre-training context). llama.cpp
//! writes it as `mistral3`: the temperature as `attention.temperature_scale`,
//! its step the YaRN original context.

use serde_json::Value as Json;

use super::llama::{llama_like, plain_gguf};
use super::rope::gguf_yarn;
use super::{Family, HfExperts, Shape};
use crate::config::{HfConfig, Metadata};
use crate::error::{Error, Result};
use crate::spec::{Mixer, ModelSpec, QueryTemperature};

/// Ministral 3, and Mistral 3's wrapper around it.
pub(super) static MINISTRAL3: Family = Family {
    name: "mistral3",
    gguf: &["mistral3"],
    hf: &[
        "Ministral3ForCausalLM",
        "Mistral3ForConditionalGeneration",
        "ministral3",
        "mistral3",
    ],
    hf_tensors: &[],
    gguf_tensors: &[],
    hf_layers: "layers",
    hf_experts: HfExperts::PerExpert,
    tied_default: false,
    gguf_permuted_qk: true,
    hf_rope_pairs: false,
    from_hf,
    from_gguf,
};

/// Every attention layer of `spec` with `temperature`.
fn with_temperature(spec: &mut ModelSpec, temperature: Option<QueryTemperature>) {
    for l in &mut spec.layers {
        if let Mixer::Attention(a) = &mut l.mixer {
            a.temperature = temperature;
        }
    }
}

/// The query temperature `rope_parameters` names (`llama_4_scaling_beta`,
/// stepping every `original_max_position_embeddings`); none where the beta
/// is absent or zero (a factor of 1 everywhere).
fn hf_temperature(c: &HfConfig) -> Result<Option<QueryTemperature>> {
    let params = ["rope_parameters", "rope_scaling"]
        .into_iter()
        .find_map(|k| c.get(k).and_then(Json::as_object));
    let Some(p) = params else {
        return Ok(None);
    };
    let beta = match p.get("llama_4_scaling_beta") {
        None | Some(Json::Null) => return Ok(None),
        Some(v) => v
            .as_f64()
            .ok_or_else(|| Error::Config(format!("llama_4_scaling_beta = {v} is not a number")))?,
    };
    if beta == 0.0 {
        return Ok(None);
    }
    let floor = p
        .get("original_max_position_embeddings")
        .and_then(Json::as_u64)
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            Error::Config("llama_4_scaling_beta needs original_max_position_embeddings".into())
        })?;
    Ok(Some(QueryTemperature {
        scale: beta as f32,
        floor: floor as usize,
        offset: 0,
    }))
}

fn from_hf(c: &HfConfig) -> Result<ModelSpec> {
    // Mistral 4 shares the wrapper's name but has DeepSeek-V2's layers.
    if let Some(t @ "mistral4") = c.str_opt("model_type") {
        return Err(Error::Config(format!(
            "{t}'s latent attention and experts are not supported"
        )));
    }
    let mut spec = llama_like(c, "mistral3")?;
    with_temperature(&mut spec, hf_temperature(c)?);
    Ok(spec)
}

fn from_gguf(m: &Metadata<'_>) -> Result<ModelSpec> {
    let shape = Shape::gguf(m)?;
    let mut spec = plain_gguf(m, &shape, "mistral3")?;
    let yarn = gguf_yarn(m, true)?;
    if let Some(y) = yarn {
        spec.ropes[0].scaling = y.scaling(spec.ropes[0].theta, spec.ropes[0].rotary_dim);
    }
    let temperature = match m.f32_opt("attention.temperature_scale")? {
        Some(scale) if scale != 0.0 => {
            // llama.cpp's step: the YaRN original context.
            let floor = m
                .usize_opt("rope.scaling.original_context_length")?
                .filter(|&n| n > 0)
                .ok_or_else(|| {
                    Error::Config(
                        "a temperature scale needs rope.scaling.original_context_length".into(),
                    )
                })?;
            Some(QueryTemperature {
                scale,
                floor,
                offset: 0,
            })
        }
        _ => None,
    };
    with_temperature(&mut spec, temperature);
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::RopeScaling;

    /// Ministral 3 3B's text model as its wrapper's `config.json` has it.
    fn wrapper(rope: &str) -> HfConfig {
        let text = format!(
            r#"{{"architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
            "text_config": {{"model_type": "ministral3", "head_dim": 128, "hidden_size": 3072,
            "intermediate_size": 9216, "max_position_embeddings": 262144,
            "num_attention_heads": 32, "num_hidden_layers": 26, "num_key_value_heads": 8,
            "rms_norm_eps": 1e-05, "sliding_window": null, "vocab_size": 131072,
            "rope_parameters": {{"rope_type": "yarn", "rope_theta": 1000000.0,
            "factor": 16.0, "original_max_position_embeddings": 16384, "beta_fast": 32.0,
            "beta_slow": 1.0, {rope}}}}},
            "vision_config": {{"hidden_size": 8}}}}"#
        );
        HfConfig::parse(&text).unwrap()
    }

    fn attention_factor(spec: &ModelSpec) -> f32 {
        match &spec.ropes[0].scaling {
            RopeScaling::Yarn { attention, .. } => *attention,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn ministral3_reads_its_temperature_and_mscale_ratio() {
        let rope = r#""mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1"#;
        let spec = from_hf(&wrapper(rope)).unwrap();
        assert_eq!((spec.head_dim, spec.layers.len()), (128, 26));
        let want = QueryTemperature {
            scale: 0.1,
            floor: 16_384,
            offset: 0,
        };
        let a = spec.layers[25].attention().unwrap();
        assert_eq!((a.temperature, a.window), (Some(want), None));
        // Equal mscales cancel: no magnitude correction at all.
        assert_eq!(attention_factor(&spec), 1.0);
        let rope = r#""mscale": 0.8, "mscale_all_dim": 0.5, "llama_4_scaling_beta": 0.0"#;
        let spec = from_hf(&wrapper(rope)).unwrap();
        let m = |x: f64| 0.1 * x * 16f64.ln() + 1.0;
        let want = (m(0.8) / m(0.5)) as f32;
        assert!((attention_factor(&spec) - want).abs() < 1e-6);
        assert_eq!(spec.layers[0].attention().unwrap().temperature, None);
    }

    #[test]
    fn without_both_mscales_yarn_keeps_its_usual_factor() {
        let spec = from_hf(&wrapper(r#""mscale": 1.0"#)).unwrap();
        let want = (0.1 * 16f64.ln() + 1.0) as f32;
        assert!((attention_factor(&spec) - want).abs() < 1e-6);
    }

    #[test]
    fn mistral_4_under_the_same_wrapper_is_refused() {
        let c = HfConfig::parse(
            r#"{"architectures": ["Mistral3ForConditionalGeneration"],
            "text_config": {"model_type": "mistral4"}}"#,
        )
        .unwrap();
        let err = from_hf(&c).unwrap_err().to_string();
        assert!(err.contains("mistral4"), "{err}");
    }
}
