//! DeepSeek-V2/V3's latent attention through the real loaders: prompts
//! prefilled in chunks of several sizes answer as transformers does from
//! both formats and both attention paths; the cache holds the latent
//! vector alone (what `inspect` and the plan count); the plan runs as many
//! more long sequences as the latent is smaller than per-head K and V; a
//! file whose latent ranks disagree with its tensors is refused by the
//! tensor's name.

use std::collections::HashMap;
use std::path::Path;

use candle_core::Device;
use candle_core::quantized::gguf_file;
use ferrox_plan::{CacheKind, KvDtype, PlanConfig, plan_for_kv_bytes};

use super::helpers::{Pools, argmax, decode, prefill};
use super::reference::{check_greedy, dir, log_softmax, open, reference};
use crate::Source;

const FIXTURES: [&str; 2] = ["deepseek_v3", "deepseek_v2"];

/// The tiny models' latent: kv_lora_rank 32 + qk_rope_head_dim 8, in 3
/// layers; per head they would cache 4 heads x (24 key + 16 value).
const LATENT: u64 = 32 + 8;
const PER_HEAD: u64 = 4 * (24 + 16);

#[test]
fn prompts_prefilled_in_chunks_match_transformers_on_both_paths() {
    for family in FIXTURES {
        let r = reference(family);
        let run = &r.runs[0];
        for path in r.files(run) {
            for paged in [true, false] {
                let mut m = open(&path, run.context);
                m.decoder_mut().set_fused_attention(paged);
                let pools = Pools::of(&m);
                for chunk in [1, 5, 512] {
                    for (i, p) in run.prompts.iter().enumerate() {
                        let mut kv = pools.seq(p.ids.len() + p.steps.len(), chunk);
                        let mut logits = prefill(&mut m, &mut kv, &p.ids, chunk);
                        let mut got = Vec::new();
                        for s in 0..p.steps.len() {
                            let token = argmax(&logits);
                            got.push((token, log_softmax(&logits)));
                            if s + 1 < p.steps.len() {
                                logits = decode(&mut m, &mut kv, token, p.ids.len() + s);
                            }
                        }
                        let what =
                            format!("{} paged {paged} chunk {chunk} prompt {i}", path.display());
                        assert!(check_greedy(&what, &got, p, r.near_tie) >= 2, "{what}");
                    }
                }
                assert_eq!(pools.used(), 0);
            }
        }
    }
}

#[test]
fn the_latent_cache_held_is_what_inspect_and_the_plan_count() {
    for family in FIXTURES {
        let r = reference(family);
        let gguf = r.gguf_path().expect("a GGUF beside the safetensors");
        for path in [dir(family), gguf] {
            let what = path.display().to_string();
            let info = Source::open(&path).unwrap().info().unwrap();
            assert_eq!(info.architecture, "deepseek2", "{what}");
            assert_eq!(info.facts.kv_latent_dim, LATENT, "{what}");
            let f32_geometry = info.geometry(ferrox_plan::DeviceKind::Cpu, KvDtype::F32);
            assert_eq!(f32_geometry.kv_bytes_per_token(), 3 * LATENT * 4, "{what}");
            // Allocated: K alone, one latent vector a slot (blocks of 4, f32).
            let m = open(&path, None);
            let (kind, bytes) = m.pool_bytes()[0];
            assert_eq!(kind, CacheKind::Full, "{what}");
            let blocks = 256;
            assert_eq!(bytes, blocks * 4 * 3 * LATENT * 4, "{what}");
        }
    }
}

#[test]
fn the_plan_runs_as_many_more_long_sequences_as_the_latent_is_smaller() {
    let info = Source::open(&dir("deepseek_v3")).unwrap().info().unwrap();
    let latent = info.geometry(ferrox_plan::DeviceKind::Cpu, KvDtype::F32);
    // The same model planned as if it cached K and V per head (a head's
    // K and V averaged: 20 each).
    let per_head = ferrox_plan::ModelGeometry {
        kv_latent_dim: 0,
        kv_heads: 4,
        head_dim: PER_HEAD / 4 / 2,
        ..latent.clone()
    };
    let config = PlanConfig {
        max_seqs_cap: Some(1 << 20),
        typical_seq_len: Some(256),
        max_model_len: Some(256),
        block_size: 16,
        ..PlanConfig::default()
    };
    let kv_bytes = 3 * PER_HEAD * 4 * 256 * 10;
    let a = plan_for_kv_bytes(&latent, &config, kv_bytes).unwrap();
    let b = plan_for_kv_bytes(&per_head, &config, kv_bytes).unwrap();
    let want = 0.9 * (PER_HEAD / LATENT) as f64;
    let got = a.max_seqs as f64 / b.max_seqs as f64;
    assert!(
        b.max_seqs >= 1 && got >= want,
        "{} vs {}",
        a.max_seqs,
        b.max_seqs
    );
}

#[test]
fn a_checkpoint_whose_latent_rank_disagrees_with_its_tensors_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let from = dir("deepseek_v3");
    for f in [
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(from.join(f), tmp.path().join(f)).unwrap();
    }
    let text = std::fs::read_to_string(from.join("config.json")).unwrap();
    let text = text.replace("\"kv_lora_rank\": 32", "\"kv_lora_rank\": 24");
    std::fs::write(tmp.path().join("config.json"), text).unwrap();
    assert_refused(
        tmp.path(),
        "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
    );
}

#[test]
fn a_gguf_whose_latent_rank_disagrees_with_its_tensors_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let src = reference("deepseek_v3").gguf_path().unwrap();
    let mut file = std::fs::File::open(&src).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let mut tensors = HashMap::new();
    for t in content.tensor_infos.keys() {
        tensors.insert(
            t.clone(),
            content.tensor(&mut file, t, &Device::Cpu).unwrap(),
        );
    }
    let mut metadata = content.metadata.clone();
    let key = "deepseek2.attention.q_lora_rank".to_string();
    let wrong = match &metadata[&key] {
        gguf_file::Value::U32(_) => gguf_file::Value::U32(16),
        other => panic!("q_lora_rank is {other:?}"),
    };
    metadata.insert(key, wrong);
    let path = tmp.path().join("model.gguf");
    let mut out = std::fs::File::create(&path).unwrap();
    let metadata: Vec<(&str, &gguf_file::Value)> =
        metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &candle_core::quantized::QTensor)> =
        tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut out, &metadata, &tensors).unwrap();
    drop(out);
    assert_refused(&path, "blk.0.attn_q_a.weight");
}

/// Opening `path` works (the metadata is whole); building its decoder is
/// refused, naming `tensor`.
fn assert_refused(path: &Path, tensor: &str) {
    let mut source = Source::open(path).unwrap();
    let err = source.decoder(&Device::Cpu).unwrap_err().to_string();
    assert!(err.contains(tensor), "{err}");
}
