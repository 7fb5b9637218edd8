//! The committed tiny models of every family (`scripts/reference-models`)
//! and transformers' answers for them, read for the tests, and the rule the
//! tests judge by: greedy tokens equal transformers' up to the first
//! near-tie (its own top two closer than `near_tie`), the log-probabilities
//! of its top five within [`TOL`] at every step compared.

use std::path::{Path, PathBuf};

use candle_core::Device;
use candle_core::quantized::GgmlDType;
use candle_core::quantized::gguf_file::{self, Content};
use ferrox_plan::KvDtype;
use serde::Deserialize;

use crate::{Decoder, PagedModel, Source};

/// |d logprob| allowed against transformers (f32 compute and KV on both
/// sides: only summation order differs; 1e-5 is typical).
pub const TOL: f32 = 2e-3;

/// Every family with a committed reference.
pub const FAMILIES: &[&str] = &[
    "llama",
    "qwen2",
    "mistral",
    "qwen3",
    "gemma2",
    "gemma3",
    "phi3",
    "mixtral",
    "qwen3moe",
    "qwen3moe_sparse",
    "qwen2moe",
    "gpt_oss",
    "mamba2",
    "granitehybrid",
    "qwen35",
    "qwen3next",
    "smollm3",
    "glm4moe",
    "olmo2",
    "olmo3",
    "ministral3",
    "lfm2",
    "deepseek_v3",
    "deepseek_v2",
    "qwen35moe",
    "granitehybrid_moe",
    "nemotron_h",
    "nemotron_h_moe",
    "llama4",
    "gemma4",
    "gemma4_moe",
];

/// A routing margin half precision keeps: every matrix held in bf16 moves
/// a router's logits (of magnitude ~1) by up to ~1e-2 (gpt-oss's tiny model
/// flips an expert at a margin of 6.8e-3).
pub const HALF_ROUTE_TIE: f32 = 1e-2;

/// One model's references.
#[derive(Debug, Deserialize)]
pub struct Reference {
    pub family: String,
    pub near_tie: f32,
    /// Routing margins below this may flip in half precision.
    #[serde(default)]
    pub route_tie: Option<f32>,
    pub runs: Vec<Run>,
    /// The GGUF llama.cpp's converter made of it (none where it maps no
    /// such layout).
    #[serde(default)]
    pub gguf: Option<String>,
}

/// One set of prompts, the context served, which files it checks.
#[derive(Debug, Clone, Deserialize)]
pub struct Run {
    pub name: String,
    pub context: Option<usize>,
    /// `safetensors`, `gguf` or `both`.
    pub files: String,
    pub prompts: Vec<Prompt>,
}

/// A prompt and transformers' greedy steps after it.
#[derive(Debug, Clone, Deserialize)]
pub struct Prompt {
    pub ids: Vec<u32>,
    pub steps: Vec<RefStep>,
}

/// One greedy step: the token and the top five `(id, logprob)`.
#[derive(Debug, Clone, Deserialize)]
pub struct RefStep {
    pub token: u32,
    pub top: Vec<(u32, f32)>,
    /// A mixture of experts' smallest routing margin of any token so far.
    #[serde(default)]
    pub route_gap: Option<f32>,
}

impl Reference {
    /// Whether `step`'s experts were chosen clearly enough for half
    /// precision to choose the same ones (always, for a dense model): by
    /// [`HALF_ROUTE_TIE`], or the reference's own margin where wider.
    pub fn routes_clearly(&self, step: &RefStep) -> bool {
        let tie = self.route_tie.unwrap_or(0.0).max(HALF_ROUTE_TIE);
        step.route_gap.is_none_or(|gap| gap >= tie)
    }
}

/// The folder of `family`'s committed model.
pub fn dir(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/families")
        .join(family)
}

/// `family`'s references.
pub fn reference(family: &str) -> Reference {
    let text = std::fs::read_to_string(dir(family).join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

impl Reference {
    /// The files `run` checks: the safetensors folder and/or the GGUF.
    pub fn files(&self, run: &Run) -> Vec<PathBuf> {
        let d = dir(&self.family);
        let gguf = self.gguf.as_ref().map(|g| d.join(g));
        match (run.files.as_str(), gguf) {
            ("safetensors", _) | (_, None) => vec![d],
            ("gguf", Some(g)) => vec![g],
            (_, Some(g)) => vec![d, g],
        }
    }

    /// The GGUF, for a family that has one.
    pub fn gguf_path(&self) -> Option<PathBuf> {
        self.gguf.as_ref().map(|g| dir(&self.family).join(g))
    }
}

/// State slots the tests' models hold (a model with recurrent layers).
pub const SLOTS: usize = 8;

/// `path` on the CPU, served to `context`, KV in f32 in blocks of 4.
pub fn open(path: &Path, context: Option<usize>) -> PagedModel {
    let mut m = PagedModel::new(decoder(path, context), 256, 4, KvDtype::F32).unwrap();
    m.set_state_slots(SLOTS).unwrap();
    m
}

/// The decoder of the model at `path`, serving `context` positions.
pub fn decoder(path: &Path, context: Option<usize>) -> Decoder {
    let mut d = Source::open(path).unwrap().decoder(&Device::Cpu).unwrap();
    if let Some(c) = context {
        d.set_context(c).unwrap();
    }
    d
}

/// Log-softmax of a logit row.
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&x| f64::from(x - max).exp()).sum();
    let log_sum = sum.ln() as f32;
    logits.iter().map(|&x| x - max - log_sum).collect()
}

/// Checks one step's log-probabilities `lp` (and the greedy token `token`)
/// against transformers'; `false` where the comparison must stop (the
/// reference's own top two are a near-tie: greedy paths may part there).
pub fn check_step(what: &str, token: u32, lp: &[f32], want: &RefStep, near_tie: f32) -> bool {
    for &(id, ref_lp) in &want.top {
        let got = lp[id as usize];
        assert!(
            (got - ref_lp).abs() <= TOL,
            "{what}: logprob of {id} is {got}, transformers {ref_lp}"
        );
    }
    assert_eq!(token, want.token, "{what}: greedy token");
    want.top[0].1 - want.top[1].1 >= near_tie
}

/// Checks a greedy continuation, each step's token and log-probabilities,
/// against `prompt`'s reference; returns the steps compared.
pub fn check_greedy(what: &str, got: &[(u32, Vec<f32>)], prompt: &Prompt, near_tie: f32) -> usize {
    assert_eq!(got.len(), prompt.steps.len(), "{what}: steps");
    for (i, ((token, lp), want)) in got.iter().zip(&prompt.steps).enumerate() {
        if !check_step(&format!("{what} step {i}"), *token, lp, want, near_tie) {
            return i + 1;
        }
    }
    got.len()
}

/// A copy of the GGUF at `src` with every matrix (the embedding too: a tied
/// head is it) quantized: `q` for most,
/// `other` for k, v and up (their projections then cannot share one packed
/// matrix with q and gate, as in K-quant files). Metadata as it was.
pub fn requantize(src: &Path, dst: &Path, q: GgmlDType, other: GgmlDType) {
    let mut f = std::fs::File::open(src).unwrap();
    let content = Content::read(&mut f).unwrap();
    let mut tensors = Vec::new();
    for name in content.tensor_infos.keys() {
        let t = content.tensor(&mut f, name, &Device::Cpu).unwrap();
        let ty = match (t.shape().dims().len(), name.as_str()) {
            (1, _) => GgmlDType::F32,
            (_, n)
                if ["attn_k.", "attn_v.", "ffn_up."]
                    .iter()
                    .any(|p| n.contains(p)) =>
            {
                other
            }
            _ => q,
        };
        let w = t.dequantize(&Device::Cpu).unwrap();
        // Rows narrower than a block stay f32, as llama-quantize keeps them
        // (the tiny latent models' per-head `attn_k_b`).
        let whole = w.dims().last().is_some_and(|&d| d % ty.block_size() == 0);
        let ty = if whole { ty } else { GgmlDType::F32 };
        let t = candle_core::quantized::QTensor::quantize(&w, ty).unwrap();
        tensors.push((name.clone(), t));
    }
    let md: Vec<(&str, &gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let ts: Vec<(&str, &candle_core::quantized::QTensor)> =
        tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut out = std::fs::File::create(dst).unwrap();
    gguf_file::write(&mut out, &md, &ts).unwrap();
}

/// A fixture written but not listed would be checked by nothing.
#[test]
fn every_committed_family_fixture_is_listed() {
    let root = dir("");
    let mut found: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.path().join("reference.json").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    let mut listed: Vec<&str> = FAMILIES.to_vec();
    listed.sort();
    assert_eq!(found, listed);
}
