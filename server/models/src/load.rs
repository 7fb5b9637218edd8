//! Opening a model: GGUF file or Hugging Face directory, decoder and facts.

use std::path::Path;

use candle_core::Device;
use ferrox_plan::{DeviceKind, Footprint, Footprints, KvDtype, ModelGeometry};
use serde::Serialize;

use crate::arch::Family;
use crate::config::HfConfig;
use crate::decoder::Decoder;
use crate::embedder::Embedder;
use crate::error::{Error, Result};
use crate::gguf::GgufSource;
use crate::holding::device_kind;
use crate::pooling::activation::ModuleActivation;
use crate::pooling::config::PoolingFiles;
use crate::pooling::head::{ScoreHead, score_activation};
use crate::pooling::head_layout::{HeadSpec, gguf_head_config};
use crate::pooling::{Pooling, PoolingMethod};
use crate::safetensors::{self as st, SafetensorsSource, safetensors_files};
use crate::spec::{KvGroup, ModelSpec};
use crate::text::TextModel;
use crate::weights::build_decoder;
use crate::weights::source::WeightSource;

/// The on-disk format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// A single GGUF file.
    Gguf,
    /// A Hugging Face directory of safetensors.
    Safetensors,
}

/// What `ferrox-server inspect` reports: the model's shape and the bytes it
/// takes on each device, a superset of the capacity plan's `ModelGeometry`
/// (camelCase JSON). The top-level `kvDtype` and `weightBytes` are the CPU
/// figures; `devices` has both.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelInfo {
    /// Architecture name.
    pub architecture: String,
    /// File format.
    pub format: Format,
    /// The capacity plan's facts, with the CPU's weight bytes and the KV
    /// dtype `--kv-dtype auto` uses on CPU: `inspect --json` writes them at
    /// the top level under `ModelGeometry`'s own names, which the operator
    /// reads back.
    #[serde(flatten)]
    pub facts: ModelGeometry,
    /// The layers by KV kind: full attention, and each sliding window
    /// (which layer is which kind).
    pub kv_groups: Vec<KvGroup>,
    /// The weights and KV as held on each device.
    pub devices: Footprints,
    /// The half type a GPU computes this model in.
    #[serde(skip)]
    pub model_half: KvDtype,
}

impl ModelInfo {
    /// Facts of `spec`; `weight_bytes(device)` counts the weights as
    /// held there.
    fn new(
        config: &ModelSpec,
        (format, params): (Format, u64),
        model_half: KvDtype,
        weight_bytes: impl Fn(DeviceKind) -> Result<u64>,
    ) -> Result<Self> {
        let kv_values = config.kv_values_per_token();
        let footprint = |device: DeviceKind| -> Result<Footprint> {
            let kv_dtype = device.auto_kv_dtype(model_half);
            Ok(Footprint {
                weight_bytes: weight_bytes(device)?,
                kv_dtype,
                // Only attention layers keep KV.
                kv_bytes_per_token: kv_values as u64 * kv_dtype.bytes(),
            })
        };
        let devices = Footprints {
            cpu: footprint(DeviceKind::Cpu)?,
            cuda: footprint(DeviceKind::Cuda)?,
        };
        let (experts, active_experts) = config.expert_params();
        // The full-attention layers' heads, where they differ (Gemma 4).
        let full = config.full_head_shape();
        let facts = ModelGeometry {
            // The plan's KV layers are these less the recurrent ones.
            layers: config.mixer_layers() as u64,
            kv_heads: config.kv_heads as u64,
            head_dim: config.head_dim as u64,
            kv_dtype: devices.cpu.kv_dtype,
            weight_bytes: devices.cpu.weight_bytes,
            context_length: config.context as u64,
            heads: config.heads as u64,
            hidden_size: config.hidden as u64,
            intermediate_size: config.intermediate as u64,
            vocab_size: config.vocab as u64,
            sliding_windows: config.sliding_windows(),
            params,
            active_params: params.saturating_sub(experts - active_experts),
            recurrent_layers: config.recurrent_layers().len() as u64,
            state_bytes_per_seq: config.state_bytes(),
            // The plan counts a latent layer's one vector, not heads.
            kv_latent_dim: config.latent_width().unwrap_or(0) as u64,
            full_kv_heads: full.map_or(0, |h| h.kv_heads as u64),
            full_head_dim: full.map_or(0, |h| h.head_dim as u64),
            kv_shared_layers: config.kv_shared_layers() as u64,
        };
        Ok(ModelInfo {
            architecture: config.family.to_string(),
            format,
            facts,
            kv_groups: config.kv_groups(),
            devices,
            model_half,
        })
    }

    /// The capacity plan's view on `device`, with the KV held in `kv_dtype`.
    pub fn geometry(&self, device: DeviceKind, kv_dtype: KvDtype) -> ModelGeometry {
        ModelGeometry {
            kv_dtype,
            weight_bytes: self.devices.on(device).weight_bytes,
            ..self.facts.clone()
        }
    }
}

/// An opened model source, before weights are read.
pub enum Source {
    /// A GGUF file.
    Gguf(Box<GgufSource>),
    /// A Hugging Face directory.
    Dir {
        /// The directory.
        dir: std::path::PathBuf,
        /// Its family.
        family: &'static Family,
        /// The model its `config.json` describes.
        config: Box<ModelSpec>,
        /// `tie_word_embeddings`.
        tied: bool,
        /// The half type of its weights.
        half: KvDtype,
    },
}

impl Source {
    /// Opens `path`: a `.gguf` file or a directory with `config.json`.
    pub fn open(path: &Path) -> Result<Self> {
        let shown = path.display().to_string();
        if path.is_dir() {
            let text =
                std::fs::read_to_string(path.join("config.json")).map_err(|source| Error::Io {
                    path: format!("{shown}/config.json"),
                    source,
                })?;
            safetensors_files(path)?;
            let hf = HfConfig::parse(&text)?;
            let (family, config) = crate::arch::from_hf(&text)?;
            return Ok(Source::Dir {
                dir: path.to_path_buf(),
                family,
                config: Box::new(config),
                tied: hf.bool_or("tie_word_embeddings", family.tied_default)?,
                half: hf.half_dtype(),
            });
        }
        if !path.exists() {
            return Err(Error::Io {
                path: shown,
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            });
        }
        Ok(Source::Gguf(Box::new(GgufSource::open(path)?)))
    }

    /// The model's facts, without reading weights.
    pub fn info(&mut self) -> Result<ModelInfo> {
        match self {
            Source::Gguf(g) => {
                let config = g.spec()?;
                // GGUF carries no compute dtype; llama.cpp keeps KV in f16.
                let params = (Format::Gguf, g.params());
                ModelInfo::new(&config, params, KvDtype::F16, |d| Ok(g.weight_bytes(d)))
            }
            Source::Dir {
                dir,
                family,
                config,
                half,
                ..
            } => {
                let params = (Format::Safetensors, st::params(dir, family)?);
                // Dense modules are held beside the model, in f32 (their
                // files' errors are the load's to report).
                let dense: u64 = crate::pooling::config::from_dir(dir)
                    .map(|f| f.dense.iter().map(|d| d.held_bytes()).sum())
                    .unwrap_or(0);
                ModelInfo::new(config, params, *half, |d| {
                    Ok(st::weight_bytes(dir, family, d)? + dense)
                })
            }
        }
    }

    /// The tokenizer, chat template and end set.
    pub fn text(&self) -> Result<TextModel> {
        match self {
            Source::Gguf(g) => crate::text::from_gguf(g.metadata()),
            Source::Dir { dir, .. } => crate::text::from_dir(dir),
        }
    }

    /// Reads the weights and builds the decoder on `device`.
    pub fn decoder(&mut self, device: &Device) -> Result<Decoder> {
        self.decoder_held_as(device, device_kind(device))
    }

    /// The decoder on `device` with its weights held as on `kind`: a GPU's
    /// half and quantized weights run on the CPU, to test that path here.
    pub fn decoder_held_as(&mut self, device: &Device, kind: DeviceKind) -> Result<Decoder> {
        self.build(device, kind, false)
    }

    /// The model on `device` as a pooling model (an embedder): an encoder
    /// as it is, a decoder [`pooled`](ModelSpec::pooled), keeping no cache;
    /// each vector through the Dense modules its files name.
    pub fn embedder(&mut self, device: &Device, pooling: Pooling) -> Result<Embedder> {
        let modules = self.pooling_files()?.dense;
        let mut dense = Vec::with_capacity(modules.len());
        let decoder = self.build_then(device, device_kind(device), true, &mut |src| {
            for m in &modules {
                dense.push(m.load(src, device)?);
            }
            Ok(())
        })?;
        Ok(Embedder::new(decoder, pooling)?.with_dense(dense))
    }

    /// The model on `device` as a cross-encoder: its pooled state (as
    /// its family's head reads it: an encoder's first token or mean, a
    /// decoder's last token) through the score head its family and
    /// `config.json` describe (see [`HeadSpec`]) and the activation its
    /// files name, one score a sequence.
    pub fn scorer(&mut self, device: &Device) -> Result<Embedder> {
        let (activation, config) = match self {
            Source::Dir { dir, .. } => {
                let path = dir.join("config.json");
                let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
                    path: path.display().to_string(),
                    source,
                })?;
                (score_activation(dir)?, Some(HfConfig::parse(&text)?))
            }
            Source::Gguf(g) => (
                ModuleActivation::Sigmoid,
                Some(with_metadata(g, gguf_head_config)?),
            ),
        };
        let spec = self.spec()?;
        let encoder = !spec.keeps_cache();
        let head = HeadSpec::read(spec.family, encoder, config.as_ref(), spec.norms.eps)?;
        self.scoring(device, head.pooling, &mut |src| {
            ScoreHead::load(src, spec.hidden, (head, activation), device)
        })
    }

    /// The decoder on `device` as a reranker (Qwen3-Reranker): its last
    /// token's state scored by the `yes_no` tokens' logits (see
    /// [`ScoreHead`]), one score a sequence.
    pub fn token_scorer(&mut self, device: &Device, yes_no: (u32, u32)) -> Result<Embedder> {
        let spec = self.spec()?;
        self.scoring(device, PoolingMethod::Last, &mut |src| {
            ScoreHead::token_pair(src, (spec.vocab, spec.hidden), yes_no, device)
        })
    }

    /// The decoder on `device` as llama.cpp's GGUF of a reranker scored
    /// by its "yes" and "no" rows (`cls.output`, see
    /// [`ScoreHead::label_pair`]), one score a sequence.
    pub fn label_scorer(&mut self, device: &Device) -> Result<Embedder> {
        let hidden = self.spec()?.hidden;
        self.scoring(device, PoolingMethod::Last, &mut |src| {
            ScoreHead::label_pair(src, hidden, device)
        })
    }

    /// The model pooled by `method`, unnormalized, each sequence's state
    /// through the head `head` reads from the weights.
    fn scoring(
        &mut self,
        device: &Device,
        method: PoolingMethod,
        head: &mut dyn FnMut(&mut dyn WeightSource) -> Result<ScoreHead>,
    ) -> Result<Embedder> {
        let mut read = None;
        let decoder = self.build_then(device, device_kind(device), true, &mut |src| {
            read = Some(head(src)?);
            Ok(())
        })?;
        let read = read.ok_or_else(|| Error::MissingTensor("the score head".into()))?;
        let pooling = Pooling {
            method,
            normalize: false,
        };
        Ok(Embedder::new(decoder, pooling)?.with_head(read))
    }

    /// What the model's files say about pooling: sentence-transformers'
    /// modules in a directory, GGUF's `pooling_type`.
    pub fn pooling_files(&self) -> Result<PoolingFiles> {
        match self {
            Source::Gguf(g) => with_metadata(g, crate::pooling::config::from_gguf),
            Source::Dir { dir, .. } => crate::pooling::config::from_dir(dir),
        }
    }

    /// The model's description (before weights are read).
    pub fn spec(&mut self) -> Result<ModelSpec> {
        match self {
            Source::Gguf(g) => g.spec(),
            Source::Dir { config, .. } => Ok((**config).clone()),
        }
    }

    fn build(&mut self, device: &Device, kind: DeviceKind, pooled: bool) -> Result<Decoder> {
        self.build_then(device, kind, pooled, &mut |_| Ok(()))
    }

    /// Builds the decoder, then hands its weight source to `more` (a
    /// head's weights).
    fn build_then(
        &mut self,
        device: &Device,
        kind: DeviceKind,
        pooled: bool,
        more: &mut dyn FnMut(&mut dyn WeightSource) -> Result<()>,
    ) -> Result<Decoder> {
        let spec = |s: ModelSpec| if pooled { s.pooled() } else { s };
        match self {
            Source::Gguf(g) => {
                let config = spec(g.spec()?);
                g.hold_as(kind);
                let decoder = build_decoder(g.as_mut(), config, device)?;
                more(g.as_mut())?;
                Ok(decoder)
            }
            Source::Dir {
                dir,
                family,
                config,
                tied,
                ..
            } => {
                let mut src = SafetensorsSource::open_as(dir, family, kind)?;
                src.rope_pairs(config.head_dim);
                // A pooling model never reads its head.
                if !pooled && !*tied && !src.has("output.weight") {
                    return Err(Error::MissingTensor("lm_head.weight".into()));
                }
                let decoder = build_decoder(&mut src, spec((**config).clone()), device)?;
                more(&mut src)?;
                Ok(decoder)
            }
        }
    }
}

/// `f` of a GGUF's metadata, read with its architecture's key prefix.
fn with_metadata<T>(
    g: &GgufSource,
    f: impl FnOnce(&crate::config::Metadata<'_>) -> Result<T>,
) -> Result<T> {
    let arch = crate::config::md_string(g.metadata(), "general.architecture")?;
    f(&crate::config::Metadata {
        md: g.metadata(),
        arch: &arch,
    })
}
