//! SmolLM3: the Llama layout with no RoPE on every fourth layer
//! (`no_rope_layers`, 1 where a layer rotates; llama.cpp's `smollm3` fixes
//! the step at 4), a window only on those NoPE layers when
//! `use_sliding_window` says so.

use super::{Family, HfExperts, llama, sliding_pattern};
use crate::config::{HfConfig, Metadata};
use crate::error::{Error, Result};
use crate::spec::{Mixer, ModelSpec};

/// SmolLM3.
pub(super) static SMOLLM3: Family = Family {
    name: "smollm3",
    gguf: &["smollm3"],
    hf: &["SmolLM3ForCausalLM", "smollm3"],
    hf_tensors: &[],
    hf_layers: "layers",
    gguf_tensors: &[],
    hf_experts: HfExperts::PerExpert,
    tied_default: true,
    gguf_permuted_qk: true,
    hf_rope_pairs: false,
    from_hf,
    from_gguf,
};

/// llama.cpp's step: layer `i` rotates unless `(i + 1) % 4 == 0`.
const GGUF_NO_ROPE_STEP: usize = 4;

fn from_hf(c: &HfConfig) -> Result<ModelSpec> {
    let mut spec = llama::llama_like(c, "smollm3")?;
    let layers = spec.layers.len();
    let rotary = rotary_layers(c, layers)?;
    let window = match c.bool_or("use_sliding_window", false)? {
        true => c.usize_opt("sliding_window")?,
        false => None,
    };
    let sliding = sliding_pattern(c, layers, |i| window.is_some() && !rotary[i])?;
    for ((l, rotates), slides) in spec.layers.iter_mut().zip(rotary).zip(sliding) {
        if let Mixer::Attention(a) = &mut l.mixer {
            a.nope = !rotates;
            a.window = window.filter(|_| slides);
        }
    }
    Ok(spec)
}

/// Which layers rotate: `no_rope_layers` (one 0/1 a layer), else every
/// layer but each `no_rope_layer_interval`-th (transformers' default;
/// Llama 4's too).
pub(super) fn rotary_layers(c: &HfConfig, layers: usize) -> Result<Vec<bool>> {
    let listed = c.usizes("no_rope_layers")?;
    if listed.is_empty() {
        let step = c.usize_opt("no_rope_layer_interval")?.unwrap_or(4);
        if step == 0 {
            return Err(Error::Config(
                "config.json no_rope_layer_interval is 0".into(),
            ));
        }
        return Ok((0..layers).map(|i| (i + 1) % step != 0).collect());
    }
    if listed.len() != layers {
        return Err(Error::Config(format!(
            "config.json no_rope_layers has {} entries for {layers} layers",
            listed.len()
        )));
    }
    Ok(listed.into_iter().map(|r| r != 0).collect())
}

fn from_gguf(m: &Metadata<'_>) -> Result<ModelSpec> {
    let mut spec = llama::gguf(m, "smollm3")?;
    for (i, l) in spec.layers.iter_mut().enumerate() {
        if let Mixer::Attention(a) = &mut l.mixer {
            a.nope = (i + 1) % GGUF_NO_ROPE_STEP == 0;
        }
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::tests::eight_layers as config;

    fn nope(spec: &ModelSpec) -> Vec<bool> {
        spec.layers
            .iter()
            .map(|l| l.attention().unwrap().nope)
            .collect()
    }

    #[test]
    fn every_fourth_layer_has_no_rope_unless_the_config_lists_them() {
        let every_fourth = [false, false, false, true, false, false, false, true];
        assert_eq!(nope(&from_hf(&config("")).unwrap()), every_fourth);
        let listed = r#", "no_rope_layers": [1, 0, 1, 1, 1, 1, 1, 1]"#;
        let spec = from_hf(&config(listed)).unwrap();
        assert_eq!(nope(&spec)[..2], [false, true]);
        let short = r#", "no_rope_layers": [1, 0]"#;
        let err = from_hf(&config(short)).unwrap_err().to_string();
        assert!(
            err.contains("no_rope_layers has 2 entries for 8 layers"),
            "{err}"
        );
        let zero = r#", "no_rope_layer_interval": 0"#;
        assert!(from_hf(&config(zero)).is_err());
    }

    #[test]
    fn a_window_slides_only_on_the_no_rope_layers_and_only_when_switched_on() {
        let windows = |extra: &str| -> Vec<Option<usize>> {
            let spec = from_hf(&config(extra)).unwrap();
            spec.layers
                .iter()
                .map(|l| l.attention().unwrap().window)
                .collect()
        };
        assert!(
            windows(r#", "sliding_window": 16"#)
                .iter()
                .all(Option::is_none)
        );
        let on = windows(r#", "sliding_window": 16, "use_sliding_window": true"#);
        let want: Vec<_> = (0..8).map(|i| ((i + 1) % 4 == 0).then_some(16)).collect();
        assert_eq!(on, want);
    }
}
