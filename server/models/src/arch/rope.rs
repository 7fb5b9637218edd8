//! RoPE settings from `config.json`, in either form transformers writes:
//! `rope_parameters` (5.x; one dict, or one per layer kind) or `rope_theta`
//! with `rope_scaling` (4.x and most checkpoints on the Hub).

use serde_json::{Map, Value as Json};

use crate::config::{HfConfig, Metadata};
use crate::error::{Error, Result};
use crate::spec::{RopeScaling, RopeSpec};

/// The RoPE of layers of `kind` (`"full_attention"`, `"sliding_attention"`,
/// or `None` where a model has one), `default_theta` where the config names
/// none. `legacy` is what a config without `rope_parameters` has for this
/// kind: its base (`rope_theta`, Gemma 3's `rope_local_base_freq`) and
/// scaling keys.
pub(crate) fn hf_rope(
    c: &HfConfig,
    kind: Option<&str>,
    legacy: (&str, Option<&str>),
    default_theta: f32,
    head_dim: usize,
) -> Result<RopeSpec> {
    let params = match (c.get("rope_parameters"), kind) {
        (Some(Json::Object(p)), Some(k)) if p.get(k).is_some_and(Json::is_object) => p.get(k),
        (Some(p @ Json::Object(_)), _) => Some(p),
        _ => None,
    };
    let (theta, scaling) = match params.and_then(Json::as_object) {
        Some(p) => (num(p, "rope_theta")?.or(c.f64_opt(legacy.0)?), Some(p)),
        None => {
            let scaling = legacy.1.and_then(|k| c.get(k)).and_then(Json::as_object);
            (c.f64_opt(legacy.0)?, scaling)
        }
    };
    let theta = theta.map_or(default_theta, |t| t as f32);
    let partial = match scaling
        .map(|p| num(p, "partial_rotary_factor"))
        .transpose()?
    {
        Some(Some(f)) => Some(f),
        _ => c.f64_opt("partial_rotary_factor")?,
    };
    let rotary_dim = match partial {
        Some(f) if f > 0.0 && f <= 1.0 => (head_dim as f64 * f) as usize,
        Some(f) => return Err(Error::Config(format!("partial_rotary_factor {f}"))),
        None => head_dim,
    };
    let scaling = match scaling {
        Some(s) => scaling_of(c, s, theta, rotary_dim)?,
        None => RopeScaling::None,
    };
    Ok(RopeSpec {
        theta,
        rotary_dim,
        scaling,
    })
}

pub(super) fn num(m: &Map<String, Json>, key: &str) -> Result<Option<f64>> {
    match m.get(key) {
        None | Some(Json::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| Error::Config(format!("rope {key} = {v} is not a number"))),
    }
}

fn need(m: &Map<String, Json>, key: &str, kind: &str) -> Result<f64> {
    num(m, key)?.ok_or_else(|| Error::Config(format!("rope scaling {kind} needs {key}")))
}

fn factors(m: &Map<String, Json>, key: &str, len: usize) -> Result<Vec<f32>> {
    let bad = || Error::Config(format!("rope scaling {key} must be {len} numbers"));
    let list = m.get(key).and_then(Json::as_array).ok_or_else(bad)?;
    let out: Vec<f32> = list
        .iter()
        .map(|v| v.as_f64().map(|x| x as f32).ok_or_else(bad))
        .collect::<Result<_>>()?;
    if out.len() != len || out.iter().any(|&f| !(f.is_finite() && f > 0.0)) {
        return Err(bad());
    }
    Ok(out)
}

/// The scaling a `rope_scaling` / `rope_parameters` dict describes.
fn scaling_of(
    c: &HfConfig,
    s: &Map<String, Json>,
    theta: f32,
    rotary_dim: usize,
) -> Result<RopeScaling> {
    let kind = s
        .get("rope_type")
        .or_else(|| s.get("type"))
        .and_then(Json::as_str)
        .unwrap_or("default");
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear(need(s, "factor", kind)? as f32)),
        "llama3" => {
            let (factor, low, high, old) = (
                need(s, "factor", kind)?,
                need(s, "low_freq_factor", kind)?,
                need(s, "high_freq_factor", kind)?,
                need(s, "original_max_position_embeddings", kind)?,
            );
            let band = [factor, low, high, old].map(|x| x as f32);
            Ok(RopeScaling::Divisors(llama3_divisors(
                theta, rotary_dim, band,
            )))
        }
        "yarn" => {
            let original = need(s, "original_max_position_embeddings", kind)?;
            let factor = match num(s, "factor")? {
                Some(f) => f,
                None => c.usize("max_position_embeddings")? as f64 / original,
            };
            let beta = |key: &str, default: f64| -> Result<f64> {
                Ok(num(s, key)?.filter(|&b| b != 0.0).unwrap_or(default))
            };
            let truncate = s.get("truncate").and_then(Json::as_bool).unwrap_or(true);
            // As transformers: the pair counts only where both are nonzero.
            let mscale = match (num(s, "mscale")?, num(s, "mscale_all_dim")?) {
                (Some(m), Some(all)) if m != 0.0 && all != 0.0 => Some((m, all)),
                _ => None,
            };
            let yarn = Yarn {
                factor,
                original,
                beta: (beta("beta_fast", 32.0)?, beta("beta_slow", 1.0)?),
                truncate,
                attention: num(s, "attention_factor")?,
                mscale,
            };
            Ok(yarn.scaling(theta, rotary_dim))
        }
        "longrope" | "su" => {
            let half = rotary_dim / 2;
            // Phi-3 keeps the pre-training length beside the scaling, and
            // derives the attention factor from the ratio of the two.
            let original = match c.usize_opt("original_max_position_embeddings")? {
                Some(o) => o as f64,
                None => need(s, "original_max_position_embeddings", kind)?,
            };
            let context = c.usize("max_position_embeddings")? as f64;
            let factor = num(s, "factor")?.unwrap_or(context / original);
            let attention = match num(s, "attention_factor")? {
                Some(a) => a,
                None if factor <= 1.0 => 1.0,
                None => (1.0 + factor.ln() / original.ln()).sqrt(),
            };
            Ok(RopeScaling::LongRope {
                short: factors(s, "short_factor", half)?,
                long: factors(s, "long_factor", half)?,
                original: original as usize,
                attention: attention as f32,
            })
        }
        other => Err(Error::Config(format!(
            "rope_scaling type {other:?} is not supported"
        ))),
    }
}

/// Llama 3's per-frequency divisors: high frequencies kept, low ones divided
/// by `factor`, a smooth blend between (as Hugging Face computes them).
pub(crate) fn llama3_divisors(
    theta: f32,
    dim: usize,
    [factor, low, high, old]: [f32; 4],
) -> Vec<f32> {
    let (low_wavelen, high_wavelen) = (old / low, old / high);
    (0..dim / 2)
        .map(|i| {
            let inv_freq = 1.0 / theta.powf(2.0 * i as f32 / dim as f32);
            let wavelen = 2.0 * std::f32::consts::PI / inv_freq;
            let scaled = if wavelen < high_wavelen {
                inv_freq
            } else if wavelen > low_wavelen {
                inv_freq / factor
            } else {
                let smooth = (old / wavelen - low) / (high - low);
                (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
            };
            inv_freq / scaled
        })
        .collect()
}

/// The YaRN a GGUF file's `rope.scaling.*` keys describe, if any, its ramp
/// rounded where `truncate`. llama.cpp's converter keeps `mscale_all_dim`
/// as `yarn_log_multiplier` and drops `mscale`, which llama.cpp takes as 1.
pub(crate) fn gguf_yarn(m: &Metadata<'_>, truncate: bool) -> Result<Option<Yarn>> {
    if m.str_opt("rope.scaling.type")?.as_deref() != Some("yarn") {
        return Ok(None);
    }
    let factor = m.f32_opt("rope.scaling.factor")?.unwrap_or(1.0);
    let original = m.usize("rope.scaling.original_context_length")?;
    let key =
        |k: &str, default: f32| -> Result<f64> { Ok(f64::from(m.f32_opt(k)?.unwrap_or(default))) };
    let log_mul = key("rope.scaling.yarn_log_multiplier", 0.0)?;
    Ok(Some(Yarn {
        factor: f64::from(factor),
        original: original as f64,
        beta: (
            key("rope.scaling.yarn_beta_fast", 32.0)?,
            key("rope.scaling.yarn_beta_slow", 1.0)?,
        ),
        truncate,
        attention: None,
        mscale: (log_mul != 0.0).then_some((1.0, log_mul)),
    }))
}

/// YaRN's settings (transformers' names).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Yarn {
    /// Context extension factor.
    pub factor: f64,
    /// The pre-training context.
    pub original: f64,
    /// `(beta_fast, beta_slow)`: rotations bounding the ramp.
    pub beta: (f64, f64),
    /// Whether the ramp's ends are rounded to whole dimensions.
    pub truncate: bool,
    /// cos/sin scaling, where given (else from `mscale`).
    pub attention: Option<f64>,
    /// `(mscale, mscale_all_dim)` where a config gives both (DeepSeek,
    /// Ministral 3): the attention factor is `m(mscale) / m(mscale_all_dim)`
    /// with `m(x) = 0.1 x ln(factor) + 1`; else `m(1)`.
    pub mscale: Option<(f64, f64)>,
}

impl Yarn {
    /// YaRN's magnitude correction `0.1 m ln(factor) + 1` (1 where the
    /// context is not extended).
    fn mscale_of(self, m: f64) -> f64 {
        match self.factor {
            f if f <= 1.0 => 1.0,
            f => 0.1 * m * f.ln() + 1.0,
        }
    }

    /// The divisors and attention factor, as transformers computes them:
    /// each frequency between interpolated (`/ factor`) and kept by a ramp
    /// over the dimensions whose wavelengths the beta rotations bound.
    pub(crate) fn scaling(self, theta: f32, dim: usize) -> RopeScaling {
        let base = f64::from(theta);
        let correction = |rot: f64| {
            (dim as f64 * (self.original / (rot * 2.0 * std::f64::consts::PI)).ln())
                / (2.0 * base.ln())
        };
        let (mut low, mut high) = (correction(self.beta.0), correction(self.beta.1));
        if self.truncate {
            (low, high) = (low.floor(), high.ceil());
        }
        let (low, mut high) = (low.max(0.0), high.min(dim as f64 - 1.0));
        if low == high {
            high += 0.001;
        }
        let divisors = (0..dim / 2)
            .map(|i| {
                let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                let keep = 1.0 - ramp;
                (1.0 / ((1.0 - keep) / self.factor + keep)) as f32
            })
            .collect();
        let attention = self.attention.unwrap_or_else(|| match self.mscale {
            Some((m, all)) => self.mscale_of(m) / self.mscale_of(all),
            None => self.mscale_of(1.0),
        });
        RopeScaling::Yarn {
            divisors,
            attention: attention as f32,
        }
    }
}
