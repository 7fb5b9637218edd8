//! Weights from a Hugging Face model directory (`*.safetensors`, single or sharded).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};
use crate::linear::{Embedding, Linear};
use crate::llama::Projection;
use crate::weights::{WeightSource, check_shape};

/// All tensors of a model directory, by their Hugging Face names.
pub struct SafetensorsSource {
    tensors: HashMap<String, Tensor>,
    bytes: u64,
}

impl SafetensorsSource {
    /// Loads every `*.safetensors` file in `dir`.
    pub fn open(dir: &Path, device: &Device) -> Result<Self> {
        let files = safetensors_files(dir)?;
        let mut tensors = HashMap::new();
        let mut bytes = 0;
        for file in &files {
            let shown = file.display().to_string();
            bytes += std::fs::metadata(file).map(|m| m.len()).unwrap_or(0);
            let loaded =
                candle_core::safetensors::load(file, device).map_err(|e| Error::Corrupt {
                    path: shown,
                    message: format!("not a readable safetensors file: {e}"),
                })?;
            tensors.extend(loaded);
        }
        Ok(SafetensorsSource { tensors, bytes })
    }

    /// Bytes of the weight files.
    pub fn weight_bytes(&self) -> u64 {
        self.bytes
    }

    fn get(&self, gguf_name: &str) -> Result<&Tensor> {
        let name = hf_name(gguf_name);
        self.tensors.get(&name).ok_or(Error::MissingTensor(name))
    }

    fn matrix(&self, gguf_name: &str, rows: usize, cols: usize) -> Result<Tensor> {
        let t = self.get(gguf_name)?;
        check_shape(&hf_name(gguf_name), t.dims(), &[rows, cols])?;
        Ok(t.to_dtype(DType::F32)?)
    }
}

/// The `*.safetensors` files of a directory, sorted (shards in order).
pub fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).map_err(|source| Error::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Error::UnknownFormat(dir.display().to_string()));
    }
    Ok(files)
}

/// Translates a GGUF tensor name to the Hugging Face one.
fn hf_name(gguf: &str) -> String {
    let fixed = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return f.to_string();
    }
    let Some(rest) = gguf.strip_prefix("blk.") else {
        return gguf.to_string();
    };
    let Some((layer, tail)) = rest.split_once('.') else {
        return gguf.to_string();
    };
    let (part, suffix) = tail.rsplit_once('.').unwrap_or((tail, ""));
    let hf = match part {
        "attn_norm" => "input_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_norm" => "post_attention_layernorm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        other => other,
    };
    format!("model.layers.{layer}.{hf}.{suffix}")
}

impl WeightSource for SafetensorsSource {
    fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(&hf_name(name))
    }

    fn vector(&mut self, name: &str, len: usize, _device: &Device) -> Result<Tensor> {
        let t = self.get(name)?;
        check_shape(&hf_name(name), t.dims(), &[len])?;
        Ok(t.to_dtype(DType::F32)?)
    }

    fn projection(
        &mut self,
        parts: &[(&str, usize)],
        cols: usize,
        _device: &Device,
    ) -> Result<Projection> {
        let mats = parts
            .iter()
            .map(|&(name, rows)| self.matrix(name, rows, cols))
            .collect::<Result<Vec<_>>>()?;
        // Dense weights fuse by concatenating rows: one matmul instead of several.
        Ok(Projection::Fused(Linear::Dense(Tensor::cat(&mats, 0)?)))
    }

    fn embedding(
        &mut self,
        name: &str,
        vocab: usize,
        hidden: usize,
        _device: &Device,
    ) -> Result<Embedding> {
        Ok(Embedding::Dense(self.matrix(name, vocab, hidden)?))
    }
}

#[cfg(test)]
mod tests {
    use super::hf_name;

    #[test]
    fn names_translate() {
        for (gguf, hf) in [
            ("token_embd.weight", "model.embed_tokens.weight"),
            (
                "blk.3.attn_q.weight",
                "model.layers.3.self_attn.q_proj.weight",
            ),
            ("blk.0.attn_k.bias", "model.layers.0.self_attn.k_proj.bias"),
            (
                "blk.11.ffn_down.weight",
                "model.layers.11.mlp.down_proj.weight",
            ),
            (
                "blk.2.ffn_norm.weight",
                "model.layers.2.post_attention_layernorm.weight",
            ),
            ("output.weight", "lm_head.weight"),
        ] {
            assert_eq!(hf_name(gguf), hf);
        }
    }
}
