//! Weights from a GGUF file.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Arc;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::{QMatMul, ggml_file::qtensor_from_ggml};
use candle_core::{DType, Device, Tensor};
use ferrox_kernels::{HalfMatrix, QMatrix, QuantType};

use ferrox_plan::DeviceKind;

use crate::arch::Family;
use crate::config::{Metadata, md_string};
use crate::error::{Error, Result};
use crate::gguf_header;
use crate::holding::{self, Held, Role, device_kind, elem_count};
use crate::linear::{Embedding, Linear};
use crate::mxfp4;
use crate::projection::Projection;
use crate::spec::{FeedForward, Mixer, ModelSpec, RopeScaling};
use crate::weights::source::{WeightSource, check_shape, check_small, check_vector};

mod raw;

use self::raw::{Raw, tensor_bytes, unpermute_rows};

/// An open GGUF file.
pub struct GgufSource {
    path: String,
    reader: BufReader<File>,
    content: Content,
    /// Tensors stored as MXFP4, listed in `content` as the Q5_0 they are
    /// transcoded to where candle reads them (on CPU our kernels run them
    /// as stored).
    mxfp4: HashSet<String>,
    file_size: u64,
    /// `(heads, kv_heads)` when q/k rows are stored interleaved for
    /// llama.cpp's RoPE and must be put back in Hugging Face order.
    unpermute: Option<(usize, usize)>,
    /// Use ferrox-kernels for the types they cover (on CPU).
    packed: bool,
    /// Hold weights as on this device kind, whatever device they land on.
    hold_as: Option<DeviceKind>,
    /// The family's own layer tensor names: (the common name, this file's).
    renames: &'static [(&'static str, &'static str)],
}

impl GgufSource {
    /// Opens `path` and reads its header and metadata.
    pub fn open(path: &Path) -> Result<Self> {
        let shown = path.display().to_string();
        let file = File::open(path).map_err(|source| Error::Io {
            path: shown.clone(),
            source,
        })?;
        let file_size = file.metadata().map(|m| m.len()).unwrap_or(0);
        let mut reader = BufReader::new(file);
        let header = gguf_header::read(&mut reader).map_err(|m| Error::Corrupt {
            path: shown.clone(),
            message: format!("not a readable GGUF file: {m}"),
        })?;
        Ok(GgufSource {
            path: shown,
            reader,
            content: header.content,
            mxfp4: header.mxfp4,
            file_size,
            unpermute: None,
            packed: true,
            hold_as: None,
            renames: &[],
        })
    }

    /// Loads every matrix through candle (dequantized floats for F16/F32,
    /// `QMatMul` otherwise) instead of ferrox-kernels: a reference for tests.
    pub fn set_packed_kernels(&mut self, on: bool) {
        self.packed = on;
    }

    /// Holds the weights as they are held on `kind` (another device's path,
    /// run on this one).
    pub fn hold_as(&mut self, kind: DeviceKind) {
        self.hold_as = Some(kind);
    }

    fn kind(&self, device: &Device) -> DeviceKind {
        self.hold_as.unwrap_or_else(|| device_kind(device))
    }

    /// The metadata key/values.
    pub fn metadata(&self) -> &HashMap<String, Value> {
        &self.content.metadata
    }

    /// The model's family, by `general.architecture`.
    pub fn family(&self) -> Result<&'static Family> {
        Family::by_gguf(&md_string(&self.content.metadata, "general.architecture")?)
    }

    /// The decoder's description from metadata (and the RoPE tensors some
    /// families keep); also arms the q/k un-permutation that Llama-layout
    /// GGUF files need.
    pub fn spec(&mut self) -> Result<ModelSpec> {
        let family = self.family()?;
        let arch = md_string(&self.content.metadata, "general.architecture")?;
        let md = Metadata {
            md: &self.content.metadata,
            arch: &arch,
        };
        let mut spec = (family.from_gguf)(&md)?;
        self.renames = family.gguf_tensors;
        // A layer without a router is a dense one (Qwen MoE's
        // `mlp_only_layers`; GGUF names no pattern).
        for (i, l) in spec.layers.iter_mut().enumerate() {
            if let Some(m) = l.moe()
                && !self
                    .content
                    .tensor_infos
                    .contains_key(&format!("blk.{i}.ffn_gate_inp.weight"))
            {
                l.ffn = FeedForward::Gated(m.activation);
            }
            // Per-head q/k norms where the file has them (GLM-4.5's are
            // optional, and its metadata does not say).
            let q_norm = format!("blk.{i}.attn_q_norm.weight");
            if let Mixer::Attention(a) = &mut l.mixer
                && self.content.tensor_infos.contains_key(&q_norm)
            {
                a.qk_norm = true;
            }
            // Gemma 4's layers (the kind with a value norm) that make their
            // own KV but have no v projection: their values are their keys'
            // (`attention_k_eq_v`, which llama.cpp's converter writes so).
            let has = |t: &str| (self.content.tensor_infos).contains_key(&format!("blk.{i}.{t}"));
            if let Mixer::Attention(a) = &mut l.mixer
                && a.kv.v_norm
                && a.kv.shared_from.is_none()
                && !has("attn_v.weight")
                && !has("attn_qkv.weight")
            {
                a.kv.values_from_keys = true;
            }
        }
        if family.gguf_permuted_qk {
            self.unpermute = Some((spec.heads, spec.kv_heads));
        }
        let half = spec.ropes.first().map_or(0, |r| r.rotary_dim / 2);
        // Llama 3.1's scaling travels as a tensor of per-frequency divisors,
        // Phi-3's LongRoPE as two.
        let cpu = &Device::Cpu;
        let mut read = |name: &str| -> Result<Option<Vec<f32>>> {
            match self.has(name) {
                true => Ok(Some(self.vector(name, half, cpu)?.to_vec1::<f32>()?)),
                false => Ok(None),
            }
        };
        let scaling = match (
            read("rope_freqs.weight")?,
            read("rope_factors_short.weight")?,
            read("rope_factors_long.weight")?,
        ) {
            (Some(d), _, _) => Some(RopeScaling::Divisors(d)),
            (None, Some(short), Some(long)) => {
                let md = Metadata {
                    md: &self.content.metadata,
                    arch: &arch,
                };
                Some(crate::arch::phi3::longrope(&md, short, long)?)
            }
            _ => None,
        };
        if let (Some(scaling), Some(rope)) = (scaling, spec.ropes.first_mut()) {
            rope.scaling = scaling;
        }
        spec.finish()
    }

    /// Bytes of all tensors as held on `device` (see [`crate::holding`]).
    pub fn weight_bytes(&self, device: DeviceKind) -> u64 {
        self.content
            .tensor_infos
            .iter()
            .map(|(name, t)| {
                let (dtype, dims) = (t.ggml_dtype, t.shape.dims());
                // An MXFP4 tensor's stored size is its Q5_0 transcoding's
                // (listed so), what a device holding it as stored holds.
                let stored = elem_count(dims).map_or(usize::MAX, |n| tensor_bytes(dtype, n));
                let role = Role::of(name, t.shape.rank());
                let held = match self.mxfp4.contains(name) {
                    true => holding::gguf_mxfp4(role, device),
                    false => holding::gguf(role, dtype, device),
                };
                held.bytes(dims, stored)
            })
            .fold(0, u64::saturating_add)
    }

    /// Parameters the file stores (elements of every tensor).
    pub fn params(&self) -> u64 {
        self.content
            .tensor_infos
            .values()
            .map(|t| elem_count(t.shape.dims()).map_or(u64::MAX, |n| n as u64))
            .fold(0, u64::saturating_add)
    }

    /// The file's name of the tensor `name` (the family's renames: a whole
    /// name, or a layer tensor's part).
    fn file_name<'a>(&self, name: &'a str) -> std::borrow::Cow<'a, str> {
        if let Some((_, file)) = self.renames.iter().find(|(ours, _)| *ours == name) {
            return std::borrow::Cow::Borrowed(file);
        }
        let renamed = name
            .strip_prefix("blk.")
            .and_then(|r| r.split_once('.'))
            .and_then(|(layer, tail)| {
                let (part, suffix) = tail.split_once('.')?;
                let (_, file) = self.renames.iter().find(|(ours, _)| *ours == part)?;
                Some(format!("blk.{layer}.{file}.{suffix}"))
            });
        renamed.map_or(std::borrow::Cow::Borrowed(name), std::borrow::Cow::Owned)
    }

    fn raw(&mut self, name: &str) -> Result<Raw> {
        let name = &*self.file_name(name).into_owned();
        let info = self
            .content
            .tensor_infos
            .get(name)
            .ok_or_else(|| Error::MissingTensor(name.to_string()))?;
        let (dtype, dims) = (info.ggml_dtype, info.shape.dims().to_vec());
        // Header numbers are untrusted: a product or sum that overflows is a
        // corrupt file, never a wrapped size.
        let corrupt = |message: String| Error::Corrupt {
            path: self.path.clone(),
            message,
        };
        let mxfp4 = self.mxfp4.contains(name);
        let size = elem_count(&dims)
            .filter(|_| !mxfp4 || dims.last().is_some_and(|c| c % mxfp4::BLOCK == 0))
            .map(|n| match mxfp4 {
                true => n / mxfp4::BLOCK * mxfp4::GGML_BLOCK_BYTES,
                false => tensor_bytes(dtype, n),
            })
            .ok_or_else(|| corrupt(format!("tensor {name} has impossible dimensions {dims:?}")))?;
        let start = self.content.tensor_data_offset.checked_add(info.offset);
        let end = start.and_then(|s| s.checked_add(size as u64));
        let (Some(start), Some(end)) = (start, end) else {
            return Err(corrupt(format!("tensor {name} has an impossible offset")));
        };
        if end > self.file_size {
            return Err(corrupt(format!(
                "truncated: tensor {name} needs {size} bytes at offset {start}, file has {}",
                self.file_size
            )));
        }
        let mut bytes = vec![0u8; size];
        let io = |source| Error::Io {
            path: self.path.clone(),
            source,
        };
        self.reader.seek(SeekFrom::Start(start)).map_err(io)?;
        self.reader
            .read_exact(&mut bytes)
            .map_err(|source| Error::Io {
                path: self.path.clone(),
                source,
            })?;
        let mut raw = Raw {
            name: name.to_string(),
            dtype,
            dims,
            bytes,
            mx: mxfp4,
        };
        if let Some((heads, kv_heads)) = self.unpermute {
            if name.ends_with("attn_q.weight") {
                unpermute_rows(&mut raw, heads);
            } else if name.ends_with("attn_k.weight") {
                unpermute_rows(&mut raw, kv_heads);
            }
        }
        Ok(raw)
    }

    /// `raw` as candle reads it: MXFP4 blocks transcoded to Q5_0 (exact;
    /// a block whose scale f16 cannot carry is refused by the tensor's name).
    fn for_candle(&self, mut raw: Raw) -> Result<Raw> {
        if raw.mx {
            raw.bytes = mxfp4::ggml_to_q5_0(&raw.bytes).map_err(|mxfp4::ScaleOutOfRange(e)| {
                Error::Corrupt {
                    path: self.path.clone(),
                    message: format!(
                        "tensor {}: an MXFP4 scale of 2^{} is past what Q5_0 holds",
                        raw.name,
                        i32::from(e) - 127
                    ),
                }
            })?;
            raw.mx = false;
        }
        Ok(raw)
    }

    /// How `raw` in `role` is held on `device`.
    fn held(&self, role: Role, raw: &Raw, device: &Device) -> Held {
        match raw.mx {
            true => holding::gguf_mxfp4(role, self.kind(device)),
            false => holding::gguf(role, raw.dtype, self.kind(device)),
        }
    }

    /// `raw` as floats of `dtype`.
    fn dense(&self, raw: Raw, dtype: DType, device: &Device) -> Result<Tensor> {
        let raw = self.for_candle(raw)?;
        let q = qtensor_from_ggml(raw.dtype, &raw.bytes, raw.dims, device)?;
        Ok(q.dequantize(device)?.to_dtype(dtype)?)
    }

    /// `bytes` (a `rows x cols` matrix of `ty`) repacked for ferrox-kernels;
    /// a refusal names the tensor(s).
    fn packed(
        &self,
        names: &str,
        ty: QuantType,
        rows: usize,
        cols: usize,
        bytes: Vec<u8>,
    ) -> Result<QMatrix> {
        QMatrix::new(ty, rows, cols, bytes).map_err(|e| Error::Corrupt {
            path: self.path.clone(),
            message: format!("tensor {names}: {e}"),
        })
    }

    fn linear(&self, raw: Raw, device: &Device) -> Result<Linear> {
        let held = self.held(Role::Matrix, &raw, device);
        let dims = || match raw.dims.as_slice() {
            &[rows, cols] => Ok((rows, cols)),
            _ => Err(Error::Corrupt {
                path: self.path.clone(),
                message: format!("tensor {} is not a matrix: {:?}", raw.name, raw.dims),
            }),
        };
        match held {
            Held::Float(dtype) => Ok(Linear::Dense(self.dense(raw, dtype, device)?)),
            Held::Packed(ty) if self.packed => {
                let (rows, cols) = dims()?;
                let m = self.packed(&raw.name, ty, rows, cols, raw.bytes)?;
                Ok(Linear::Packed(Arc::new(m)))
            }
            Held::Half if self.packed => {
                let (rows, cols) = dims()?;
                let m = HalfMatrix::new(rows, cols, &raw.bytes).map_err(|e| Error::Corrupt {
                    path: self.path.clone(),
                    message: format!("tensor {}: {e}", raw.name),
                })?;
                Ok(Linear::Half(Arc::new(m)))
            }
            // With the kernels switched off (a test reference), candle's.
            Held::Half => Ok(Linear::Dense(self.dense(raw, DType::F32, device)?)),
            Held::Packed(_) | Held::Quantized => {
                let raw = self.for_candle(raw)?;
                let q = qtensor_from_ggml(raw.dtype, &raw.bytes, raw.dims, device)?;
                Ok(Linear::Quant(QMatMul::from_qtensor(q)?))
            }
        }
    }
}

impl GgufSource {
    /// Matrices that read one input as one projection: one matrix of
    /// ferrox-kernels' when they share its type (on CPU), else one each.
    fn project(&self, raws: Vec<Raw>, cols: usize, device: &Device) -> Result<Projection> {
        let same_type = raws
            .iter()
            .all(|r| (r.dtype, r.mx) == (raws[0].dtype, raws[0].mx));
        let kernels = matches!(
            self.held(Role::Matrix, &raws[0], device),
            Held::Packed(_) | Held::Half
        );
        if same_type && kernels && self.packed && raws.len() > 1 {
            let names: Vec<&str> = raws.iter().map(|r| r.name.as_str()).collect();
            let fused = Raw {
                name: names.join(", "),
                dtype: raws[0].dtype,
                dims: vec![raws.iter().map(|r| r.dims[0]).sum(), cols],
                bytes: raws
                    .iter()
                    .map(|r| r.bytes.as_slice())
                    .collect::<Vec<_>>()
                    .concat(),
                mx: raws[0].mx,
            };
            return Ok(Projection::Fused(self.linear(fused, device)?));
        }
        let mut linears = raws
            .into_iter()
            .map(|r| self.linear(r, device))
            .collect::<Result<Vec<_>>>()?;
        Ok(if linears.len() == 1 {
            Projection::Fused(linears.remove(0))
        } else {
            Projection::Split(linears)
        })
    }
}

impl WeightSource for GgufSource {
    fn has(&self, name: &str) -> bool {
        self.content
            .tensor_infos
            .contains_key(&*self.file_name(name))
    }

    fn vector(&mut self, name: &str, len: usize, device: &Device) -> Result<Tensor> {
        let raw = self.raw(name)?;
        check_vector(name, &raw.dims, len)?;
        Ok(self.dense(raw, DType::F32, device)?.reshape(len)?)
    }

    fn small(&mut self, name: &str, shape: &[usize], device: &Device) -> Result<Tensor> {
        let raw = self.raw(name)?;
        check_small(name, &raw.dims, shape)?;
        Ok(self.dense(raw, DType::F32, device)?.reshape(shape)?)
    }

    fn projection(
        &mut self,
        parts: &[(&str, usize)],
        cols: usize,
        device: &Device,
    ) -> Result<Projection> {
        let mut raws = Vec::with_capacity(parts.len());
        for &(name, rows) in parts {
            let raw = self.raw(name)?;
            check_shape(name, &raw.dims, &[rows, cols])?;
            raws.push(raw);
        }
        self.project(raws, cols, device)
    }

    fn router(&mut self, name: &str, rows: usize, cols: usize, device: &Device) -> Result<Tensor> {
        let raw = self.raw(name)?;
        check_shape(name, &raw.dims, &[rows, cols])?;
        self.dense(raw, DType::F32, device)
    }

    fn experts(
        &mut self,
        parts: &[(&str, usize)],
        experts: usize,
        cols: usize,
        device: &Device,
    ) -> Result<Vec<Projection>> {
        let mut stacked = Vec::with_capacity(parts.len());
        for &(name, rows) in parts {
            let raw = self.raw(name)?;
            check_shape(name, &raw.dims, &[experts, rows, cols])?;
            stacked.push(raw);
        }
        (0..experts)
            .map(|e| {
                let raws = stacked
                    .iter()
                    .zip(parts)
                    .map(|(r, &(_, rows))| {
                        let size = rows * r.row_bytes(cols);
                        Raw {
                            name: format!("{}[{e}]", r.name),
                            dtype: r.dtype,
                            dims: vec![rows, cols],
                            bytes: r.bytes[e * size..(e + 1) * size].to_vec(),
                            mx: r.mx,
                        }
                    })
                    .collect();
                self.project(raws, cols, device)
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
        let raw = self.raw(name)?;
        check_shape(name, &raw.dims, &[experts, len])?;
        let all = self.dense(raw, DType::F32, device)?;
        (0..experts).map(|e| Ok(all.get(e)?)).collect()
    }

    fn embedding(
        &mut self,
        name: &str,
        vocab: usize,
        hidden: usize,
        device: &Device,
    ) -> Result<Embedding> {
        let raw = self.raw(name)?;
        // llama-quantize writes a table of one row (XLM-RoBERTa's one
        // token type) as a vector: it drops trailing unit dimensions.
        check_small(name, &raw.dims, &[vocab, hidden])?;
        let table = match self.held(Role::Embedding, &raw, device) {
            Held::Packed(ty) if self.packed => {
                let m = self.packed(name, ty, vocab, hidden, raw.bytes)?;
                return Ok(Embedding::Packed(Arc::new(m)));
            }
            Held::Float(dtype) => self.dense(raw, dtype, device)?,
            // Kernels switched off (a test reference), or a GPU table:
            // dequantized through candle.
            _ => self.dense(raw, DType::F32, device)?,
        };
        Ok(Embedding::Dense(table.reshape((vocab, hidden))?))
    }
}
