//! Typed reads of a model's settings: `config.json` keys and GGUF metadata
//! keys, each with an error that names the key. The families (`crate::arch`)
//! read through these.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;
use ferrox_plan::KvDtype;
use serde_json::{Map, Value as Json};

use crate::error::{Error, Result};
use crate::spec::{RopeScaling, RopeSpec};

/// A parsed `config.json`: the text model's keys (a multimodal checkpoint's
/// `text_config`, else the top level), then the top level's.
#[derive(Debug, Clone)]
pub struct HfConfig {
    top: Map<String, Json>,
    text: Option<Map<String, Json>>,
}

impl HfConfig {
    /// Parses `config.json`'s text.
    pub fn parse(text: &str) -> Result<Self> {
        let v: Json =
            serde_json::from_str(text).map_err(|e| Error::Config(format!("config.json: {e}")))?;
        let Json::Object(top) = v else {
            return Err(Error::Config("config.json is not an object".into()));
        };
        let text = match top.get("text_config") {
            Some(Json::Object(t)) => Some(t.clone()),
            _ => None,
        };
        Ok(HfConfig { top, text })
    }

    /// The value of `key`, the text model's first.
    pub fn get(&self, key: &str) -> Option<&Json> {
        self.text
            .as_ref()
            .and_then(|t| t.get(key))
            .or_else(|| self.top.get(key))
            .filter(|v| !v.is_null())
    }

    /// Whether `key` is present at all (`null` included: a config that
    /// says "none" rather than leaving the default).
    pub fn has(&self, key: &str) -> bool {
        self.text.as_ref().is_some_and(|t| t.contains_key(key)) || self.top.contains_key(key)
    }

    /// The names that say which family this is: `architectures`, then the
    /// `model_type`s (the text model's, then the top level's).
    pub fn family_names(&self) -> Vec<String> {
        let mut names: Vec<String> = match self.top.get("architectures") {
            Some(Json::Array(a)) => a
                .iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect(),
            _ => Vec::new(),
        };
        for map in [self.text.as_ref(), Some(&self.top)].into_iter().flatten() {
            if let Some(t) = map.get("model_type").and_then(Json::as_str) {
                names.push(t.to_string());
            }
        }
        names
    }

    /// A non-negative integer.
    pub fn usize(&self, key: &str) -> Result<usize> {
        self.usize_opt(key)?
            .ok_or_else(|| Error::Config(format!("config.json has no {key}")))
    }

    /// A non-negative integer, or `default` when absent.
    pub fn usize_or(&self, key: &str, default: usize) -> Result<usize> {
        Ok(self.usize_opt(key)?.unwrap_or(default))
    }

    /// A non-negative integer, if present.
    pub fn usize_opt(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| Error::Config(format!("config.json {key} = {v} is not a count"))),
        }
    }

    /// A number, if present.
    pub fn f64_opt(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| Error::Config(format!("config.json {key} = {v} is not a number"))),
        }
    }

    /// A boolean, or `default` when absent.
    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| Error::Config(format!("config.json {key} = {v} is not a boolean"))),
        }
    }

    /// A list of counts (`mlp_only_layers`); empty when absent.
    pub fn usizes(&self, key: &str) -> Result<Vec<usize>> {
        let Some(v) = self.get(key) else {
            return Ok(Vec::new());
        };
        let bad = || Error::Config(format!("config.json {key} = {v} is not a list of counts"));
        v.as_array()
            .ok_or_else(bad)?
            .iter()
            .map(|x| {
                x.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(bad)
            })
            .collect()
    }

    /// A string, if present.
    pub fn str_opt(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Json::as_str)
    }

    /// `layer_types` (`"full_attention"` / `"sliding_attention"`), if given:
    /// whether each layer slides.
    pub fn sliding_layers(&self) -> Result<Option<Vec<bool>>> {
        let Some(v) = self.get("layer_types") else {
            return Ok(None);
        };
        let bad = || {
            Error::Config(format!(
                "config.json layer_types = {v} is not a list of kinds"
            ))
        };
        let list = v.as_array().ok_or_else(bad)?;
        list.iter()
            .map(|k| match k.as_str() {
                Some("full_attention") => Ok(false),
                Some("sliding_attention") => Ok(true),
                _ => Err(bad()),
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// `layer_types` of a hybrid, if given: whether each of `layers` is
    /// recurrent, by the names in `recurrent` and `attends`.
    pub fn recurrent_kinds(
        &self,
        layers: usize,
        (recurrent, attends): (&[&str], &[&str]),
    ) -> Result<Option<Vec<bool>>> {
        let Some(v) = self.get("layer_types") else {
            return Ok(None);
        };
        let bad = || {
            Error::Config(format!(
                "config.json layer_types = {v} is not a list of {} / {}",
                recurrent.join(", "),
                attends.join(", ")
            ))
        };
        let list = v.as_array().ok_or_else(bad)?;
        if list.len() != layers {
            return Err(Error::Config(format!(
                "config.json layer_types has {} entries for {layers} layers",
                list.len()
            )));
        }
        list.iter()
            .map(|t| match t.as_str() {
                Some(k) if recurrent.contains(&k) => Ok(true),
                Some(k) if attends.contains(&k) => Ok(false),
                _ => Err(bad()),
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// The half type a GPU computes this model in: bf16 for bf16 weights,
    /// else f16 (vLLM's choice for f16 and f32 checkpoints too).
    pub fn half_dtype(&self) -> KvDtype {
        match self
            .str_opt("torch_dtype")
            .or_else(|| self.str_opt("dtype"))
        {
            Some("bfloat16" | "bf16") => KvDtype::Bf16,
            _ => KvDtype::F16,
        }
    }
}

/// GGUF metadata, read with the architecture's key prefix.
#[derive(Debug, Clone, Copy)]
pub struct Metadata<'a> {
    /// Every key/value.
    pub md: &'a HashMap<String, Value>,
    /// `general.architecture`: the prefix of the model's keys.
    pub arch: &'a str,
}

impl Metadata<'_> {
    fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    /// `{arch}.{suffix}` as a count.
    pub fn usize(&self, suffix: &str) -> Result<usize> {
        md_usize(self.md, &self.key(suffix))
    }

    /// `{arch}.{suffix}` as a count, if present.
    pub fn usize_opt(&self, suffix: &str) -> Result<Option<usize>> {
        let key = self.key(suffix);
        match self.md.contains_key(&key) {
            true => md_usize(self.md, &key).map(Some),
            false => Ok(None),
        }
    }

    /// `{arch}.{suffix}` as a float, if present.
    pub fn f32_opt(&self, suffix: &str) -> Result<Option<f32>> {
        let key = self.key(suffix);
        match self.md.contains_key(&key) {
            true => md_f32(self.md, &key).map(Some),
            false => Ok(None),
        }
    }

    /// `{arch}.{suffix}` as a string, if present.
    pub fn str_opt(&self, suffix: &str) -> Result<Option<String>> {
        let key = self.key(suffix);
        match self.md.contains_key(&key) {
            true => md_string(self.md, &key).map(Some),
            false => Ok(None),
        }
    }

    /// `{arch}.{suffix}` as a list of strings, if present as one.
    pub fn strings_opt(&self, suffix: &str) -> Option<Vec<String>> {
        let Some(Value::Array(a)) = self.md.get(&self.key(suffix)) else {
            return None;
        };
        a.iter()
            .map(|v| match v {
                Value::String(s) => Some(s.clone()),
                _ => None,
            })
            .collect()
    }

    /// `{arch}.{suffix}` as a boolean, if present.
    pub fn bool_opt(&self, suffix: &str) -> Result<Option<bool>> {
        let key = self.key(suffix);
        match self.md.get(&key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(Error::Config(format!(
                "{key} holds {other:?}, not a boolean"
            ))),
        }
    }

    /// `{arch}.{suffix}` as a list of booleans (a per-layer pattern), if
    /// present as an array.
    pub fn bools_opt(&self, suffix: &str) -> Result<Option<Vec<bool>>> {
        let key = self.key(suffix);
        match self.md.get(&key) {
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| match v {
                    Value::Bool(b) => Ok(*b),
                    other => Err(Error::Config(format!(
                        "{key} holds {other:?}, not booleans"
                    ))),
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            _ => Ok(None),
        }
    }

    /// The rotary embedding llama.cpp records without long-context
    /// scaling: `rope.freq_base` (10000 when absent) over
    /// `rope.dimension_count` leading dimensions (`head_dim` when absent).
    pub fn plain_rope(&self, head_dim: usize) -> Result<RopeSpec> {
        Ok(RopeSpec {
            theta: self.f32_opt("rope.freq_base")?.unwrap_or(10_000.0),
            rotary_dim: self.usize_opt("rope.dimension_count")?.unwrap_or(head_dim),
            scaling: RopeScaling::None,
        })
    }

    /// `{arch}.{suffix}` as one count per layer (an array, or one count
    /// for every layer), if present: llama.cpp writes a hybrid's
    /// `attention.head_count_kv` per layer, 0 for a recurrent one.
    pub fn per_layer_opt(&self, suffix: &str, layers: usize) -> Result<Option<Vec<usize>>> {
        let key = self.key(suffix);
        let Some(Value::Array(a)) = self.md.get(&key) else {
            return Ok(self.usize_opt(suffix)?.map(|n| vec![n; layers]));
        };
        if a.len() != layers {
            return Err(Error::Config(format!(
                "{key} has {} entries for {layers} layers",
                a.len()
            )));
        }
        a.iter()
            .map(|v| count(&key, v))
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// The vocabulary size: `{arch}.vocab_size`, else the tokenizer's count.
    pub fn vocab(&self) -> Result<usize> {
        match self.usize("vocab_size") {
            Ok(v) => Ok(v),
            Err(_) => match self.md.get("tokenizer.ggml.tokens") {
                Some(Value::Array(a)) => Ok(a.len()),
                _ => Err(Error::Config(
                    "no vocab_size and no tokenizer.ggml.tokens".into(),
                )),
            },
        }
    }
}

pub(crate) fn md_string(md: &HashMap<String, Value>, key: &str) -> Result<String> {
    match md.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(v) => Err(Error::Config(format!(
            "{key} is {:?}, not a string",
            v.value_type()
        ))),
        None => Err(Error::Config(format!("missing metadata {key}"))),
    }
}

pub(crate) fn md_usize(md: &HashMap<String, Value>, key: &str) -> Result<usize> {
    let v = md
        .get(key)
        .ok_or_else(|| Error::Config(format!("missing metadata {key}")))?;
    count(key, v)
}

/// A metadata value (`key`'s, or one entry of its array) as a count.
fn count(key: &str, v: &Value) -> Result<usize> {
    let n = match v {
        Value::U8(x) => *x as u64,
        Value::U16(x) => *x as u64,
        Value::U32(x) => *x as u64,
        Value::U64(x) => *x,
        Value::I8(x) if *x >= 0 => *x as u64,
        Value::I16(x) if *x >= 0 => *x as u64,
        Value::I32(x) if *x >= 0 => *x as u64,
        Value::I64(x) if *x >= 0 => *x as u64,
        other => {
            return Err(Error::Config(format!(
                "{key} is {other:?}, not a non-negative integer"
            )));
        }
    };
    usize::try_from(n).map_err(|_| Error::Config(format!("{key} = {n} is too large")))
}

pub(crate) fn md_f32(md: &HashMap<String, Value>, key: &str) -> Result<f32> {
    match md.get(key) {
        Some(Value::F32(x)) => Ok(*x),
        Some(Value::F64(x)) => Ok(*x as f32),
        Some(v) => Err(Error::Config(format!(
            "{key} is {:?}, not a float",
            v.value_type()
        ))),
        None => Err(Error::Config(format!("missing metadata {key}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_config_keys_win_and_types_are_checked() {
        let c = HfConfig::parse(
            r#"{"architectures":["Gemma3ForConditionalGeneration"],"model_type":"gemma3",
            "torch_dtype":"bfloat16","hidden_size":1,
            "text_config":{"model_type":"gemma3_text","hidden_size":2560,"sliding_window":null,
            "layer_types":["sliding_attention","full_attention"]}}"#,
        )
        .unwrap();
        assert_eq!(c.usize("hidden_size").unwrap(), 2560);
        assert_eq!(c.usize_opt("sliding_window").unwrap(), None);
        assert_eq!(c.usize_or("head_dim", 256).unwrap(), 256);
        assert_eq!(
            c.family_names(),
            ["Gemma3ForConditionalGeneration", "gemma3_text", "gemma3"]
        );
        assert_eq!(c.sliding_layers().unwrap(), Some(vec![true, false]));
        assert_eq!(c.half_dtype(), KvDtype::Bf16);
        let err = c.f64_opt("model_type").unwrap_err().to_string();
        assert!(err.contains("model_type"), "{err}");
        assert!(
            c.usize("vocab_size")
                .unwrap_err()
                .to_string()
                .contains("vocab_size")
        );
        assert!(HfConfig::parse("[1]").is_err());
        assert!(HfConfig::parse("{").is_err());
    }
}
