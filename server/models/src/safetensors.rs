//! Weights from a Hugging Face model directory (`*.safetensors`, single or sharded).

use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use ferrox_plan::DeviceKind;

use crate::error::{Error, Result};
use crate::holding::{self, Role, device_kind};
use crate::layer::Projection;
use crate::linear::{Embedding, Linear};
use crate::weights::{WeightSource, check_shape};

/// The tensors of a model directory, by their Hugging Face names, mapped
/// from the files and read one at a time (no whole-file copy on load).
pub struct SafetensorsSource {
    files: MmapedSafetensors,
    /// The kind of device the decoder is built for (decides the held dtype).
    device: DeviceKind,
}

fn corrupt(files: &[PathBuf], e: candle_core::Error) -> Error {
    let shown: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    Error::Corrupt {
        path: shown.join(", "),
        message: format!("not a readable safetensors file: {e}"),
    }
}

/// Maps every `*.safetensors` file in `dir`.
fn map(dir: &Path) -> Result<(Vec<PathBuf>, MmapedSafetensors)> {
    let files = safetensors_files(dir)?;
    // SAFETY: the files are only read; a model directory is not rewritten
    // while a server loads it (the mapping is dropped once weights are built).
    let mapped = unsafe { MmapedSafetensors::multi(&files) }.map_err(|e| corrupt(&files, e))?;
    Ok((files, mapped))
}

/// Bytes the weights of `dir` take as held on `device`.
pub fn weight_bytes(dir: &Path, device: DeviceKind) -> Result<u64> {
    let (files, mapped) = map(dir)?;
    let mut total = 0u64;
    for (_, view) in mapped.tensors() {
        let stored = DType::try_from(view.dtype()).map_err(|e| corrupt(&files, e))?;
        let role = Role::of("", view.shape().len());
        let held = holding::safetensors(role, stored, device);
        let bytes = holding::elem_count(view.shape())
            .and_then(|n| n.checked_mul(held.size_in_bytes()))
            .ok_or_else(|| {
                corrupt(
                    &files,
                    candle_core::Error::Msg("a tensor's size overflows".into()),
                )
            })?;
        total = total.saturating_add(bytes as u64);
    }
    Ok(total)
}

impl SafetensorsSource {
    /// Maps every `*.safetensors` file in `dir`, for a decoder on `device`.
    pub fn open(dir: &Path, device: &Device) -> Result<Self> {
        Self::open_as(dir, device_kind(device))
    }

    /// Maps `dir`, holding the weights as they are held on `kind`.
    pub fn open_as(dir: &Path, kind: DeviceKind) -> Result<Self> {
        let (_, files) = map(dir)?;
        Ok(SafetensorsSource {
            files,
            device: kind,
        })
    }

    /// The tensor stored under `gguf_name`'s Hugging Face name, in its held dtype.
    fn load(&self, gguf_name: &str, device: &Device) -> Result<Tensor> {
        let name = hf_name(gguf_name);
        let view = self
            .files
            .get(&name)
            .map_err(|_| Error::MissingTensor(name.clone()))?;
        let t =
            candle_core::safetensors::Load::load(&view, device).map_err(|e| Error::Corrupt {
                path: name,
                message: format!("unreadable tensor: {e}"),
            })?;
        let role = Role::of("", t.rank());
        Ok(t.to_dtype(holding::safetensors(role, t.dtype(), self.device))?)
    }

    fn matrix(&self, gguf_name: &str, rows: usize, cols: usize, device: &Device) -> Result<Tensor> {
        let t = self.load(gguf_name, device)?;
        check_shape(&hf_name(gguf_name), t.dims(), &[rows, cols])?;
        Ok(t)
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
        self.files.get(&hf_name(name)).is_ok()
    }

    fn vector(&mut self, name: &str, len: usize, device: &Device) -> Result<Tensor> {
        let t = self.load(name, device)?;
        check_shape(&hf_name(name), t.dims(), &[len])?;
        Ok(t.to_dtype(DType::F32)?)
    }

    fn projection(
        &mut self,
        parts: &[(&str, usize)],
        cols: usize,
        device: &Device,
    ) -> Result<Projection> {
        let mats = parts
            .iter()
            .map(|&(name, rows)| self.matrix(name, rows, cols, device))
            .collect::<Result<Vec<_>>>()?;
        // Dense weights fuse by concatenating rows: one matmul instead of several.
        Ok(Projection::Fused(Linear::Dense(Tensor::cat(&mats, 0)?)))
    }

    fn embedding(
        &mut self,
        name: &str,
        vocab: usize,
        hidden: usize,
        device: &Device,
    ) -> Result<Embedding> {
        Ok(Embedding::Dense(self.matrix(name, vocab, hidden, device)?))
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
