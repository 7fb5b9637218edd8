//! Weights from a Hugging Face model directory (`*.safetensors`, single or sharded).

use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use ferrox_plan::DeviceKind;

use crate::arch::{Family, HfExperts};
use crate::error::{Error, Result};
use crate::holding::{self, Role, device_kind};
use crate::linear::{Embedding, Linear};
use crate::pooling::head_layout::HeadLayout;
use crate::projection::Projection;
use crate::weights::source::{WeightSource, check_shape, check_small, check_vector};

mod mxfp4_experts;

/// The tensors of a model directory, by their Hugging Face names, mapped
/// from the files and read one at a time (no whole-file copy on load).
pub struct SafetensorsSource {
    files: MmapedSafetensors,
    /// The kind of device the decoder is built for (decides the held dtype).
    device: DeviceKind,
    names: HfNames,
    /// The last stacked (3-D) expert tensor read, by name.
    stacked: std::cell::RefCell<Option<(String, Tensor)>>,
    /// The head width of a family whose q/k rows rotate in pairs, once
    /// known ([`Self::rope_pairs`]).
    pairs_head_dim: Option<usize>,
}

/// How a family's checkpoint names the text model's tensors.
#[derive(Debug, Clone)]
pub(crate) struct HfNames {
    family: &'static Family,
    /// Where the text model's tensors live: `model.`, or a multimodal
    /// checkpoint's `model.language_model.` / `language_model.model.`.
    prefix: &'static str,
    /// The LM head's name.
    head: &'static str,
}

/// Text-model prefixes, in the order they are tried.
const PREFIXES: [&str; 7] = [
    "model.",
    "model.language_model.",
    "language_model.model.",
    "backbone.",
    // A cross-encoder's encoder under its head.
    "bert.",
    "roberta.",
    // A bare base model (sentence-transformers' BERT, Qwen3-Embedding).
    "",
];
/// LM head names, in the order they are tried.
const HEADS: [&str; 2] = ["lm_head.weight", "language_model.lm_head.weight"];

impl HfNames {
    /// The names `files` uses for `family`'s tensors.
    fn find(family: &'static Family, files: &MmapedSafetensors) -> Self {
        let has = |n: &str| files.get(n).is_ok();
        let embed = family
            .hf_global("token_embd.weight")
            .unwrap_or("embed_tokens.weight");
        let prefix = PREFIXES
            .into_iter()
            .find(|p| has(&format!("{p}{embed}")))
            .unwrap_or(PREFIXES[0]);
        let head = HEADS.into_iter().find(|h| has(h)).unwrap_or(HEADS[0]);
        HfNames {
            family,
            prefix,
            head,
        }
    }

    /// Translates a GGUF tensor name to this checkpoint's.
    fn hf(&self, gguf: &str) -> String {
        let p = self.prefix;
        if let Some(part) = gguf.strip_prefix("cls.") {
            return HeadLayout::of(self.family.name).checkpoint_name(p, part);
        }
        if let Some(hf) = self.family.hf_global(gguf) {
            return format!("{p}{hf}");
        }
        match gguf {
            "token_embd.weight" => return format!("{p}embed_tokens.weight"),
            "output_norm.weight" => return format!("{p}norm.weight"),
            "output.weight" => return self.head.to_string(),
            _ => {}
        }
        let Some((layer, tail)) = gguf.strip_prefix("blk.").and_then(|r| r.split_once('.')) else {
            return gguf.to_string();
        };
        // A whole name first (`attn_sinks.weight` is gpt-oss's `sinks`).
        let layers = self.family.hf_layers;
        if let Some(hf) = self.family.hf_tensor(tail) {
            return format!("{p}{layers}.{layer}.{hf}");
        }
        let (part, suffix) = tail.rsplit_once('.').unwrap_or((tail, ""));
        let hf = self.family.hf_tensor(part).unwrap_or(part);
        format!("{p}{layers}.{layer}.{hf}.{suffix}")
    }

    /// How the checkpoint's tensor `name` of `rank` dimensions is held:
    /// routers (by the family's names) in f32, biases as vectors.
    fn role(&self, name: &str, rank: usize) -> Role {
        let router = ["ffn_gate_inp", "ffn_gate_inp_shexp"]
            .iter()
            .filter_map(|g| self.family.hf_tensor(g))
            .any(|r| name.ends_with(&format!(".{r}.weight")));
        match router {
            true => Role::Router,
            false if name.ends_with("bias") => Role::Vector,
            false => Role::of("", rank),
        }
    }

    /// Whether a tensor of the checkpoint belongs to the text model (a
    /// multimodal checkpoint's vision tower does not; a cross-encoder's
    /// head, `classifier.*` or a decoder's `score.*`, does).
    fn is_text(&self, name: &str) -> bool {
        let head = ["classifier.", "score."];
        name.starts_with(self.prefix)
            || name == self.head
            || head.iter().any(|h| name.starts_with(h))
    }
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

/// Bytes the text model's weights in `dir` take as held on `device`.
pub fn weight_bytes(dir: &Path, family: &'static Family, device: DeviceKind) -> Result<u64> {
    let (files, mapped) = map(dir)?;
    let names = HfNames::find(family, &mapped);
    let mut total = 0u64;
    for (name, view) in mapped.tensors() {
        if !names.is_text(&name) {
            continue;
        }
        if let Some(b) = mxfp4_experts::held_bytes(&name, view.shape(), device) {
            total = total.saturating_add(b);
            continue;
        }
        let stored = DType::try_from(view.dtype()).map_err(|e| corrupt(&files, e))?;
        let role = names.role(&name, view.shape().len());
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

/// Parameters of the text model's tensors in `dir` (elements stored).
pub fn params(dir: &Path, family: &'static Family) -> Result<u64> {
    let (_, mapped) = map(dir)?;
    let names = HfNames::find(family, &mapped);
    Ok(mapped
        .tensors()
        .iter()
        .filter(|(name, _)| names.is_text(name))
        .map(|(name, view)| {
            let n = holding::elem_count(view.shape()).unwrap_or(usize::MAX);
            mxfp4_experts::params(name, n).unwrap_or(n as u64)
        })
        .fold(0, u64::saturating_add))
}

impl SafetensorsSource {
    /// Maps every `*.safetensors` file in `dir`, for a `family` decoder on
    /// `device`.
    pub fn open(dir: &Path, family: &'static Family, device: &Device) -> Result<Self> {
        Self::open_as(dir, family, device_kind(device))
    }

    /// Maps `dir`, holding the weights as they are held on `kind`.
    pub fn open_as(dir: &Path, family: &'static Family, kind: DeviceKind) -> Result<Self> {
        let (_, files) = map(dir)?;
        let names = HfNames::find(family, &files);
        Ok(SafetensorsSource {
            files,
            device: kind,
            names,
            stacked: Default::default(),
            pairs_head_dim: None,
        })
    }

    /// The tensor stored under `gguf_name`'s Hugging Face name, in its held dtype.
    fn load(&self, gguf_name: &str, device: &Device) -> Result<Tensor> {
        self.load_named(&self.names.hf(gguf_name), device)
    }

    /// The tensor stored as `name`, in its held dtype.
    fn load_named(&self, name: &str, device: &Device) -> Result<Tensor> {
        let name = name.to_string();
        let view = self
            .files
            .get(&name)
            .map_err(|_| Error::MissingTensor(name.clone()))?;
        let t =
            candle_core::safetensors::Load::load(&view, device).map_err(|e| Error::Corrupt {
                path: name.clone(),
                message: format!("unreadable tensor: {e}"),
            })?;
        let role = self.names.role(&name, t.rank());
        Ok(t.to_dtype(holding::safetensors(role, t.dtype(), self.device))?)
    }

    /// Expert `e`'s tensor of the stacked GGUF tensor `gguf_name`: its own
    /// (`{e}` in the name), or row `e` of a 3-D one, its gate or up part
    /// cut out by the family's layout ([`Self::stacked_part`]).
    fn expert(&self, gguf_name: &str, e: usize, device: &Device) -> Result<Tensor> {
        let name = self.names.hf(gguf_name);
        if name.contains("{e}") {
            return self.load_named(&name.replace("{e}", &e.to_string()), device);
        }
        // The stacked tensor is read once for all its experts.
        let cached = self
            .stacked
            .borrow()
            .as_ref()
            .filter(|(n, _)| *n == name)
            .map(|(_, t)| t.clone());
        let all = match cached {
            Some(t) => t,
            None => {
                let t = self.load_named(&name, device)?;
                *self.stacked.borrow_mut() = Some((name.clone(), t.clone()));
                t
            }
        };
        self.stacked_part(all.get(e)?, gguf_name)
    }

    /// The part of one expert's stacked tensor `t` that the GGUF tensor
    /// `gguf_name` is: gpt-oss's `[in, out]` applied as `x @ W`, transposed
    /// here, gate and up interleaved column by column (the even ones
    /// gate's); Granite's `[out, in]`, gate's rows then up's; Llama 4's
    /// `[in, out]`, gate's columns then up's, transposed.
    fn stacked_part(&self, t: Tensor, gguf_name: &str) -> Result<Tensor> {
        let layout = self.names.family.hf_experts;
        let part = ["ffn_gate_exps.", "ffn_up_exps."]
            .iter()
            .position(|p| gguf_name.contains(p));
        let t = match (layout, part) {
            (HfExperts::StackedInterleaved, Some(c)) => {
                let dims = t.dims().to_vec();
                let (last, lead) = dims.split_last().unwrap_or((&0, &[]));
                let mut shape = lead.to_vec();
                shape.extend([last / 2, 2]);
                t.reshape(shape)?
                    .narrow(lead.len() + 1, c, 1)?
                    .squeeze(lead.len() + 1)?
            }
            (HfExperts::StackedHalves, Some(c)) => {
                let rows = t.dim(0)? / 2;
                t.narrow(0, c * rows, rows)?.contiguous()?
            }
            (HfExperts::StackedHalvesInOut, Some(c)) => {
                let cols = t.dim(1)? / 2;
                t.narrow(1, c * cols, cols)?
            }
            _ => t,
        };
        Ok(match (t.rank(), layout) {
            (2, HfExperts::StackedInterleaved | HfExperts::StackedHalvesInOut) => {
                t.t()?.contiguous()?
            }
            _ => t,
        })
    }

    /// Where gate (0) or up (1) sits in a family's interleaved `gate_up`
    /// tensor, for the GGUF tensor `gguf_name`.
    fn interleaved_column(&self, gguf_name: &str) -> Option<usize> {
        let interleaved = self.names.family.hf_experts == HfExperts::StackedInterleaved;
        ["ffn_gate_exps.", "ffn_up_exps."]
            .iter()
            .position(|p| gguf_name.contains(p))
            .filter(|_| interleaved)
    }

    fn matrix(&self, gguf_name: &str, rows: usize, cols: usize, device: &Device) -> Result<Tensor> {
        let t = self.load(gguf_name, device)?;
        check_shape(&self.names.hf(gguf_name), t.dims(), &[rows, cols])?;
        self.rope_halves(gguf_name, t)
    }

    /// A q/k weight or bias of a family whose RoPE rotates adjacent pairs,
    /// its rows regrouped into each head's halves (row `h*d + j*d/2 + i`
    /// from row `h*d + 2i + j`, as a permuted GGUF's); any other as it is.
    fn rope_halves(&self, gguf_name: &str, t: Tensor) -> Result<Tensor> {
        let Some(d) = self.pairs_head_dim else {
            return Ok(t);
        };
        let qk = [".attn_q.", ".attn_k."]
            .iter()
            .any(|p| gguf_name.contains(p));
        let rows = t.dim(0)?;
        if !qk || d < 2 || !rows.is_multiple_of(d) {
            return Ok(t);
        }
        let rest: Vec<usize> = t.dims()[1..].to_vec();
        let mut shape = vec![rows / d, d / 2, 2];
        shape.extend(&rest);
        Ok(t.reshape(shape)?
            .transpose(1, 2)?
            .contiguous()?
            .reshape(t.shape())?)
    }

    /// Sets the head width by which a pairs-RoPE family's q/k rows are
    /// regrouped ([`Family::hf_rope_pairs`]); no-op for other families.
    pub fn rope_pairs(&mut self, head_dim: usize) {
        if self.names.family.hf_rope_pairs {
            self.pairs_head_dim = Some(head_dim);
        }
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

impl WeightSource for SafetensorsSource {
    fn has(&self, name: &str) -> bool {
        self.files.get(&self.names.hf(name)).is_ok()
    }

    fn vector(&mut self, name: &str, len: usize, device: &Device) -> Result<Tensor> {
        let t = self.load(name, device)?;
        check_vector(&self.names.hf(name), t.dims(), len)?;
        self.rope_halves(name, t.to_dtype(DType::F32)?.reshape(len)?)
    }

    fn small(&mut self, name: &str, shape: &[usize], device: &Device) -> Result<Tensor> {
        let t = self.load(name, device)?;
        check_small(&self.names.hf(name), t.dims(), shape)?;
        Ok(t.to_dtype(DType::F32)?.reshape(shape)?)
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

    fn router(&mut self, name: &str, rows: usize, cols: usize, device: &Device) -> Result<Tensor> {
        Ok(self
            .matrix(name, rows, cols, device)?
            .to_dtype(DType::F32)?)
    }

    fn experts(
        &mut self,
        parts: &[(&str, usize)],
        experts: usize,
        cols: usize,
        device: &Device,
    ) -> Result<Vec<Projection>> {
        if let Some(packed) = self.mxfp4_experts(parts, experts, cols, device)? {
            return Ok(packed);
        }
        (0..experts)
            .map(|e| {
                let mats = parts
                    .iter()
                    .map(|&(name, rows)| {
                        let t = self.expert(name, e, device)?;
                        let shown = format!("{}[{e}]", self.names.hf(name));
                        check_shape(&shown, t.dims(), &[rows, cols])?;
                        Ok(t)
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(Projection::Fused(Linear::Dense(Tensor::cat(&mats, 0)?)))
            })
            .collect()
    }

    fn expert_vectors(
        &mut self,
        name: &str,
        experts: usize,
        len: usize,
        device: &Device,
    ) -> Result<Vec<Tensor>> {
        (0..experts)
            .map(|e| {
                let t = self.expert(name, e, device)?;
                check_shape(&format!("{}[{e}]", self.names.hf(name)), t.dims(), &[len])?;
                Ok(t.to_dtype(DType::F32)?)
            })
            .collect()
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
mod tests;
