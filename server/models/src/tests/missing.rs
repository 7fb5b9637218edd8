//! A committed family's files with one tensor taken out, and the refusal
//! that must name it: the hybrids' layer kinds (LFM2's convolution,
//! Granite 4.0-H's experts, Nemotron-H's MLP layers) each read what they
//! need by name.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::Device;
use candle_core::quantized::gguf_file;

use super::reference::{dir, reference};
use crate::Source;

/// `family`'s safetensors folder without the tensor `name`.
pub(super) fn checkpoint_without(family: &str, name: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let from = dir(family);
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(from.join(f), tmp.path().join(f)).unwrap();
    }
    let mut tensors =
        candle_core::safetensors::load(from.join("model.safetensors"), &Device::Cpu).unwrap();
    assert!(tensors.remove(name).is_some(), "{family} has {name}");
    candle_core::safetensors::save(&tensors, tmp.path().join("model.safetensors")).unwrap();
    tmp
}

/// `family`'s GGUF without the tensor `name` (the folder, and the file).
pub(super) fn gguf_without(family: &str, name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let src = reference(family).gguf_path().unwrap();
    let mut file = std::fs::File::open(&src).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    assert!(
        content.tensor_infos.contains_key(name),
        "{family} has {name}"
    );
    let mut tensors = HashMap::new();
    for t in content.tensor_infos.keys().filter(|t| *t != name) {
        let q = content.tensor(&mut file, t, &Device::Cpu).unwrap();
        tensors.insert(t.clone(), q);
    }
    let path = tmp.path().join("model.gguf");
    let mut out = std::fs::File::create(&path).unwrap();
    let metadata: Vec<(&str, &gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let tensors: Vec<(&str, &candle_core::quantized::QTensor)> =
        tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut out, &metadata, &tensors).unwrap();
    (tmp, path)
}

/// Opening `path` works (the metadata is whole); building its decoder is
/// refused, naming `tensor`.
pub(super) fn assert_refused(path: &Path, tensor: &str) {
    let mut source = Source::open(path).unwrap();
    let err = source.decoder(&Device::Cpu).unwrap_err().to_string();
    assert!(err.contains(tensor), "{err}");
}

#[test]
fn a_granite_4_h_checkpoint_without_an_expert_tensor_is_refused_by_its_name() {
    for name in [
        "model.layers.1.block_sparse_moe.input_linear.weight",
        "model.layers.2.block_sparse_moe.output_linear.weight",
        "model.layers.3.block_sparse_moe.router.layer.weight",
        "model.layers.0.shared_mlp.input_linear.weight",
    ] {
        let tmp = checkpoint_without("granitehybrid_moe", name);
        assert_refused(tmp.path(), name);
    }
}

#[test]
fn a_granite_4_h_gguf_without_an_expert_tensor_is_refused_by_its_name() {
    for name in [
        "blk.1.ffn_gate_exps.weight",
        "blk.1.ffn_up_exps.weight",
        "blk.2.ffn_down_exps.weight",
        "blk.0.ffn_down_shexp.weight",
    ] {
        // (A GGUF layer without its router is a dense one, as Qwen MoE's
        // `mlp_only_layers` are written: not a refusal to test here.)
        let (_tmp, path) = gguf_without("granitehybrid_moe", name);
        assert_refused(&path, name);
    }
}

#[test]
fn a_nemotron_h_file_without_an_mlp_layer_s_tensor_is_refused_by_its_name() {
    // Layer 1 is an MLP layer: its up projection and its one norm.
    for name in [
        "backbone.layers.1.mixer.up_proj.weight",
        "backbone.layers.1.norm.weight",
    ] {
        let tmp = checkpoint_without("nemotron_h", name);
        assert_refused(tmp.path(), name);
    }
    for name in ["blk.1.ffn_up.weight", "blk.1.attn_norm.weight"] {
        let (_tmp, path) = gguf_without("nemotron_h", name);
        assert_refused(&path, name);
    }
}
