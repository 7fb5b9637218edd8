//! PEFT's format: a directory with `adapter_config.json` and
//! `adapter_model.safetensors`, tensors named
//! `base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight`.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use super::adapter::{LoraAdapter, LoraPair, LoraShapes, assemble};
use super::gguf::unpermute;
use super::{Target, module_parts, refuse};
use crate::error::Result;

/// What `adapter_config.json` decides, checked.
#[derive(Debug, Clone, PartialEq)]
struct PeftConfig {
    alpha: f64,
    rslora: bool,
}

/// Reads and checks `adapter_config.json`: LoRA only, without the options
/// whose math this server does not do (DoRA, biases, per-module ranks,
/// modules saved whole), and only targets it knows.
fn read_config(name: &str, text: &str) -> Result<PeftConfig> {
    let v: Value = serde_json::from_str(text)
        .map_err(|e| refuse(name, format!("adapter_config.json is not JSON: {e}")))?;
    let field = |k: &str| v.get(k).filter(|x| !x.is_null());
    if let Some(t) = field("peft_type").and_then(Value::as_str)
        && t != "LORA"
    {
        return Err(refuse(name, format!("peft_type {t} is not LORA")));
    }
    let flag = |k: &str| field(k).and_then(Value::as_bool).unwrap_or(false);
    for (key, why) in [
        ("use_dora", "DoRA"),
        ("fan_in_fan_out", "fan_in_fan_out (Conv1D layers)"),
    ] {
        if flag(key) {
            return Err(refuse(name, format!("{why} is not supported")));
        }
    }
    if let Some(b) = field("bias").and_then(Value::as_str)
        && b != "none"
    {
        return Err(refuse(
            name,
            format!("bias {b:?} is not supported (only none)"),
        ));
    }
    let non_empty = |k: &str| match field(k) {
        Some(Value::Object(m)) => !m.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
        None => false,
    };
    for key in ["rank_pattern", "alpha_pattern", "modules_to_save"] {
        if non_empty(key) {
            return Err(refuse(name, format!("{key} is not supported")));
        }
    }
    if let Some(Value::Array(list)) = field("target_modules") {
        for m in list {
            let m = m.as_str().unwrap_or_default();
            if module_parts(m).is_none() {
                return Err(refuse(name, format!("unknown target module {m:?}")));
            }
        }
    }
    let alpha = field("lora_alpha").map_or(Some(8.0), Value::as_f64);
    let alpha = alpha.ok_or_else(|| refuse(name, "lora_alpha is not a number"))?;
    Ok(PeftConfig {
        alpha,
        rslora: flag("use_rslora"),
    })
}

/// `(layer, targets, is_a)` of a PEFT tensor name (the targets of a fused
/// module, [`module_parts`], in row order).
fn parse_name(tensor: &str) -> Option<(usize, Vec<Target>, bool)> {
    let rest = tensor.strip_prefix("base_model.model.")?;
    let rest = rest.strip_prefix("model.layers.")?;
    let (layer, tail) = rest.split_once('.')?;
    let (module, which) = tail
        .strip_suffix(".lora_A.weight")
        .map(|m| (m, true))
        .or_else(|| tail.strip_suffix(".lora_B.weight").map(|m| (m, false)))?;
    Some((layer.parse().ok()?, module_parts(module)?, which))
}

/// The scale PEFT applies: `alpha / r`, or `alpha / sqrt(r)` with rsLoRA.
fn scale(c: &PeftConfig, rank: usize) -> f32 {
    let r = rank as f64;
    (if c.rslora {
        c.alpha / r.sqrt()
    } else {
        c.alpha / r
    }) as f32
}

fn host(t: &Tensor) -> candle_core::Result<Vec<f32>> {
    t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()
}

/// Loads the PEFT adapter in `dir` as `name`, checked against `shapes`.
pub fn load_peft(name: &str, dir: &Path, shapes: &LoraShapes) -> Result<LoraAdapter> {
    let cfg_path = dir.join("adapter_config.json");
    let text = std::fs::read_to_string(&cfg_path)
        .map_err(|e| refuse(name, format!("{}: {e}", cfg_path.display())))?;
    let config = read_config(name, &text)?;
    let st = dir.join("adapter_model.safetensors");
    if !st.exists() {
        return Err(refuse(
            name,
            format!("{} is missing (only safetensors are read)", st.display()),
        ));
    }
    let tensors = candle_core::safetensors::load(&st, &Device::Cpu)
        .map_err(|e| refuse(name, format!("unreadable {}: {e}", st.display())))?;
    // (layer, targets) -> (A, B)
    type Halves = (Option<Tensor>, Option<Tensor>);
    let mut halves: BTreeMap<(usize, Vec<Target>), Halves> = BTreeMap::new();
    for (tensor, t) in tensors {
        let (layer, target, is_a) = parse_name(&tensor)
            .ok_or_else(|| refuse(name, format!("unknown target: tensor {tensor}")))?;
        let slot = halves.entry((layer, target)).or_default();
        *(if is_a { &mut slot.0 } else { &mut slot.1 }) = Some(t);
    }
    let mut pairs = Vec::with_capacity(halves.len());
    for ((layer, targets), halves) in halves {
        let modules: Vec<&str> = targets.iter().map(|t| t.module()).collect();
        let what = format!("layer {layer} {}", modules.join("+"));
        let (Some(a), Some(b)) = halves else {
            return Err(refuse(
                name,
                format!("{what} has only one of lora_A, lora_B"),
            ));
        };
        let (Ok((rank, _)), Ok((rows, b_rank))) = (a.dims2(), b.dims2()) else {
            return Err(refuse(
                name,
                format!("{what}: lora_A and lora_B must be matrices"),
            ));
        };
        if b_rank != rank {
            return Err(refuse(
                name,
                format!("{what}: lora_A has rank {rank}, lora_B {b_rank}"),
            ));
        }
        let read = |t: &Tensor| host(t).map_err(|e| refuse(name, format!("{what}: {e}")));
        let (a, b) = (read(&a)?, read(&b)?);
        // A fused module's B: each part's block of rows (one part: all).
        let widths: Vec<usize> = match targets.as_slice() {
            [_] => vec![rows],
            parts => parts.iter().map(|&t| shapes.dims(t).0).collect(),
        };
        if widths.iter().sum::<usize>() != rows {
            return Err(refuse(
                name,
                format!("{what}: lora_B has {rows} rows, the base's parts {widths:?}"),
            ));
        }
        let mut first = 0;
        for (&target, width) in targets.iter().zip(widths) {
            let part = &b[first * rank..(first + width) * rank];
            first += width;
            let heads = match (shapes.peft_unpermute, target) {
                (Some((h, _)), Target::Q) | (Some((_, h)), Target::K) => Some(h),
                _ => None,
            };
            let regrouped;
            let b = match heads {
                Some(h) => {
                    regrouped = unpermute(part, rank, h).ok_or_else(|| {
                        refuse(
                            name,
                            format!("{what}: {width} rows do not split into {h} heads"),
                        )
                    })?;
                    &regrouped[..]
                }
                None => part,
            };
            let pair =
                LoraPair::new(&a, b, rank, width, scale(&config, rank)).ok_or_else(|| {
                    refuse(name, format!("{what}: empty, or values past f16's range"))
                })?;
            pairs.push((layer, target, pair));
        }
    }
    assemble(name, shapes, pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_read_or_refused_with_the_reason() {
        let ok = |text: &str| read_config("x", text).unwrap();
        assert_eq!(
            ok(
                r#"{"peft_type":"LORA","r":8,"lora_alpha":16,"target_modules":["q_proj","down_proj"]}"#
            ),
            PeftConfig {
                alpha: 16.0,
                rslora: false
            }
        );
        assert!(ok(r#"{"lora_alpha":4,"use_rslora":true,"target_modules":"all-linear","rank_pattern":{}}"#).rslora);
        for (text, why) in [
            (r#"{"peft_type":"IA3"}"#, "peft_type IA3 is not LORA"),
            (r#"{"use_dora":true}"#, "DoRA"),
            (r#"{"bias":"all"}"#, "bias \"all\""),
            (r#"{"rank_pattern":{"q_proj":4}}"#, "rank_pattern"),
            (r#"{"modules_to_save":["lm_head"]}"#, "modules_to_save"),
            (
                r#"{"target_modules":["q_proj","embed_tokens"]}"#,
                "unknown target module \"embed_tokens\"",
            ),
            (r#"{"lora_alpha":"x"}"#, "lora_alpha"),
            ("not json", "not JSON"),
        ] {
            let e = read_config("x", text).unwrap_err().to_string();
            assert!(e.contains(why) && e.contains("\"x\""), "{text}: {e}");
        }
    }

    #[test]
    fn tensor_names_and_scales() {
        assert_eq!(
            parse_name("base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight"),
            Some((3, vec![Target::Q], true))
        );
        assert_eq!(
            parse_name("base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"),
            Some((0, vec![Target::Down], false))
        );
        assert_eq!(
            parse_name("base_model.model.model.layers.2.self_attn.qkv_proj.lora_B.weight"),
            Some((2, vec![Target::Q, Target::K, Target::V], false))
        );
        for bad in [
            "base_model.model.lm_head.lora_A.weight",
            "base_model.model.model.embed_tokens.lora_embedding_A",
            "base_model.model.model.layers.x.mlp.up_proj.lora_A.weight",
            "base_model.model.model.layers.1.mlp.up_proj.lora_A.bias",
        ] {
            assert_eq!(parse_name(bad), None, "{bad}");
        }
        let c = PeftConfig {
            alpha: 16.0,
            rslora: false,
        };
        assert_eq!(scale(&c, 8), 2.0);
        assert_eq!(scale(&PeftConfig { rslora: true, ..c }, 16), 4.0);
    }
}
