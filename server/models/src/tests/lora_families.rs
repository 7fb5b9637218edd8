//! LoRA adapters on every family: the decoder's one hook serves each
//! family's seven projections through its extras (q/k/v biases, q/k norms,
//! post-norms, GELU, fused q/k/v and gate/up tensors): an unmerged adapter
//! equals its merged model, and the fused CPU path equals the op-by-op one.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use ferrox_core::batch_model::PrefillChunk;
use ferrox_core::{AdapterRef, BatchModel, Table};

use super::helpers::{Pools, SeqKv};
use super::reference::{dir, open, reference, requantize};
use crate::PagedModel;
use crate::lora::fixtures::{LoraSpec, random_peft_of, write_peft};
use crate::lora::{self, LoraShapes, Target};

/// The family's committed tiny model with its weights as f32 (merging then
/// rounds nothing), `edit`ed, written under `to`.
fn copy_f32(family: &str, to: &Path, edit: impl FnOnce(&mut HashMap<String, Tensor>)) {
    let from = dir(family);
    std::fs::create_dir_all(to).unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(from.join(f), to.join(f)).unwrap();
    }
    let mut w =
        candle_core::safetensors::load(from.join("model.safetensors"), &Device::Cpu).unwrap();
    for t in w.values_mut() {
        *t = t.to_dtype(DType::F32).unwrap();
    }
    edit(&mut w);
    candle_core::safetensors::save(&w, to.join("model.safetensors")).unwrap();
}

/// Where `target`'s rows live in `w`: its own tensor, or its section of the
/// fused q/k/v or gate/up tensor (Phi-3); `None` where the layer has no
/// such projection (a recurrent layer's attention).
fn rows_of(
    w: &HashMap<String, Tensor>,
    s: &LoraShapes,
    layer: usize,
    t: Target,
) -> Option<(String, usize)> {
    let own = format!("model.layers.{layer}.{}.weight", t.module_path());
    if w.contains_key(&own) {
        return Some((own, 0));
    }
    let (fused, offset) = match t {
        Target::Q => ("self_attn.qkv_proj", 0),
        Target::K => ("self_attn.qkv_proj", s.dims(Target::Q).0),
        Target::V => (
            "self_attn.qkv_proj",
            s.dims(Target::Q).0 + s.dims(Target::K).0,
        ),
        Target::Gate => ("mlp.gate_up_proj", 0),
        Target::Up => ("mlp.gate_up_proj", s.dims(Target::Gate).0),
        Target::O | Target::Down => return None,
    };
    let name = format!("model.layers.{layer}.{fused}.weight");
    w.contains_key(&name).then_some((name, offset))
}

/// `w` with the adapter merged in: `W + scale * B @ A` on each target's rows.
fn merge(
    w: &mut HashMap<String, Tensor>,
    s: &LoraShapes,
    spec: &LoraSpec,
    lora: &HashMap<String, Tensor>,
) {
    for layer in 0..s.layers {
        for &t in &spec.targets {
            let p = format!("base_model.model.model.layers.{layer}.{}", t.module_path());
            let (a, b) = (
                &lora[&format!("{p}.lora_A.weight")],
                &lora[&format!("{p}.lora_B.weight")],
            );
            let delta = (b.matmul(a).unwrap() * f64::from(spec.scale())).unwrap();
            let Some((name, offset)) = rows_of(w, s, layer, t) else {
                continue;
            };
            let base = &w[&name];
            let rows = delta.dims()[0];
            let total = base.dims()[0];
            let mut parts = vec![(base.narrow(0, offset, rows).unwrap() + delta).unwrap()];
            if offset > 0 {
                parts.insert(0, base.narrow(0, 0, offset).unwrap());
            }
            if offset + rows < total {
                parts.push(
                    base.narrow(0, offset + rows, total - offset - rows)
                        .unwrap(),
                );
            }
            let merged = Tensor::cat(&parts, 0).unwrap();
            w.insert(name, merged);
        }
    }
}

/// A random adapter over every projection of `m`'s family, written under
/// `dir` as PEFT does and loaded as a request carries it; and its tensors
/// by target. With `fused`, as PEFT writes one for Phi-3: q/k/v in one
/// `qkv_proj` pair and gate/up in one `gate_up_proj` (each part then has
/// its module's `A`).
fn adapter(
    m: &PagedModel,
    dir: &Path,
    spec: &LoraSpec,
    fused: bool,
) -> (AdapterRef, HashMap<String, Tensor>) {
    let shapes = LoraShapes::of(m.decoder().spec());
    let mut tensors = random_peft_of(&shapes, spec);
    if fused {
        let file = fuse(&mut tensors, shapes.layers);
        write_peft(dir, spec, &file);
        let modules = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"];
        let config = serde_json::json!({"peft_type": "LORA", "r": spec.rank,
            "lora_alpha": spec.alpha, "target_modules": modules, "bias": "none"});
        std::fs::write(dir.join("adapter_config.json"), config.to_string()).unwrap();
    } else {
        write_peft(dir, spec, &tensors);
    }
    let a = lora::load("a", dir, &shapes, 16).unwrap();
    (AdapterRef::new("a", &a.cache_key(), Arc::new(a)), tensors)
}

/// `tensors` (by target) as a fused module's file: each fused module's `A`
/// is its first part's (which `tensors` then takes for every part) and its
/// `B` the parts' stacked.
fn fuse(tensors: &mut HashMap<String, Tensor>, layers: usize) -> HashMap<String, Tensor> {
    let mut file = tensors.clone();
    for layer in 0..layers {
        let p = format!("base_model.model.model.layers.{layer}");
        for (module, parts) in [
            ("self_attn.qkv_proj", &[Target::Q, Target::K, Target::V][..]),
            ("mlp.gate_up_proj", &[Target::Gate, Target::Up][..]),
        ] {
            let name =
                |t: Target, half: &str| format!("{p}.{}.lora_{half}.weight", t.module_path());
            let a = tensors[&name(parts[0], "A")].clone();
            let bs: Vec<Tensor> = parts
                .iter()
                .map(|&t| tensors[&name(t, "B")].clone())
                .collect();
            for &t in parts {
                tensors.insert(name(t, "A"), a.clone());
                file.remove(&name(t, "A"));
                file.remove(&name(t, "B"));
            }
            file.insert(format!("{p}.{module}.lora_A.weight"), a);
            file.insert(
                format!("{p}.{module}.lora_B.weight"),
                Tensor::cat(&bs, 0).unwrap(),
            );
        }
    }
    file
}

/// Logits of every prompt (one chunk each, all in one step), the rows with
/// `adapters`.
fn logits(
    m: &mut PagedModel,
    prompts: &[Vec<u32>],
    adapters: &[Option<AdapterRef>],
) -> Vec<Vec<f32>> {
    let pools = Pools::keeping(m);
    let kv: Vec<_> = prompts
        .iter()
        .map(|p| pools.seq(p.len(), p.len()))
        .collect();
    let tables: Vec<Vec<Table<'_>>> = kv.iter().map(|k| k.tables()).collect();
    let chunks: Vec<PrefillChunk<'_>> = prompts
        .iter()
        .zip(&tables)
        .map(|(p, t)| PrefillChunk {
            tables: t,
            tokens: p,
            pos: 0,
            want_logits: true,
            all_logits: false,
        })
        .collect();
    let out = m.step_with_adapters(&chunks, &[], adapters).unwrap();
    out.prefill.into_iter().map(Option::unwrap).collect()
}

/// The families whose every layer has a dense MLP: experts take no
/// adapters (see the refusal's test below).
const DENSE: [&str; 7] = [
    "llama", "qwen2", "mistral", "qwen3", "gemma2", "gemma3", "phi3",
];

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn prompts(m: &PagedModel) -> Vec<Vec<u32>> {
    let vocab = m.decoder().spec().vocab as u32;
    [(11, 1), (6, 2)]
        .iter()
        .map(|&(n, seed)| (0..n).map(|i| (i * 29 + seed * 13 + 1) % vocab).collect())
        .collect()
}

#[test]
fn every_family_with_an_unmerged_adapter_equals_its_merged_model() {
    // Qwen3.5 too: its attention layers' gated q_proj, every layer's MLP
    // (its DeltaNet layers have no attention projections to adapt).
    for family in DENSE.into_iter().chain(["qwen35"]) {
        let tmp = tempfile::tempdir().unwrap();
        let (base, merged) = (tmp.path().join("base"), tmp.path().join("merged"));
        copy_f32(family, &base, |_| {});
        let mut m = open(&base, None);
        let spec = LoraSpec::all(4, 41);
        // Phi-3's adapters name its fused modules.
        let (a, tensors) = adapter(&m, &tmp.path().join("a"), &spec, family == "phi3");
        let shapes = LoraShapes::of(m.decoder().spec());
        copy_f32(family, &merged, |w| merge(w, &shapes, &spec, &tensors));
        let ps = prompts(&m);
        // Row 0 with the adapter beside row 1 without: each as its model.
        let with = logits(&mut m, &ps, &[Some(a), None]);
        let plain = logits(&mut m, &ps, &[]);
        let want = logits(&mut open(&merged, None), &ps, &[]);
        let d = max_diff(&with[0], &want[0]);
        assert!(d < 2e-3, "{family}: adapter vs merged {d}");
        assert_eq!(with[1], plain[1], "{family}: the base row moved");
        let moved = max_diff(&plain[0], &want[0]);
        assert!(
            moved > 1e-2,
            "{family}: the adapter changed nothing ({moved})"
        );
    }
}

#[test]
fn every_family_s_fused_cpu_path_equals_the_op_by_op_path_with_an_adapter() {
    for family in DENSE {
        let tmp = tempfile::tempdir().unwrap();
        let r = reference(family);
        let path = tmp.path().join("q8.gguf");
        requantize(
            &r.gguf_path().unwrap(),
            &path,
            GgmlDType::Q8_0,
            GgmlDType::Q8_0,
        );
        let (mut fused, mut ops) = (open(&path, None), open(&path, None));
        ops.decoder_mut().set_fused_layers(false);
        assert!(
            fused.decoder().fused_layers(),
            "{family}: fused path not taken"
        );
        let (a, _) = adapter(&fused, &tmp.path().join("a"), &LoraSpec::all(4, 43), false);
        let ps = prompts(&fused);
        let rows = [Some(a), None];
        let (x, y) = (logits(&mut fused, &ps, &rows), logits(&mut ops, &ps, &rows));
        let plain = logits(&mut fused, &ps, &[]);
        for i in 0..2 {
            let d = max_diff(&x[i], &y[i]);
            assert!(d < 1e-3, "{family} row {i}: fused vs op-by-op {d}");
        }
        assert!(
            max_diff(&x[0], &plain[0]) > 1e-2,
            "{family}: the adapter changed nothing"
        );
    }
}

#[test]
fn an_adapter_of_a_mixture_s_experts_is_refused_by_layer_and_module() {
    let tmp = tempfile::tempdir().unwrap();
    let m = open(&dir("mixtral"), None);
    let shapes = LoraShapes::of(m.decoder().spec());
    assert!(!shapes.expert_layers.is_empty());
    write_peft(
        tmp.path(),
        &LoraSpec::all(4, 7),
        &random_peft_of(&shapes, &LoraSpec::all(4, 7)),
    );
    let err = lora::load("a", tmp.path(), &shapes, 16)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("layer 0 gate_proj") && err.contains("mixture of experts"),
        "{err}"
    );
    // Attention-only adapters of the same model load.
    let attn = LoraSpec {
        targets: vec![Target::Q, Target::K, Target::V, Target::O],
        ..LoraSpec::all(4, 7)
    };
    let at = tmp.path().join("attn");
    write_peft(&at, &attn, &random_peft_of(&shapes, &attn));
    lora::load("b", &at, &shapes, 16).unwrap();
}

#[test]
fn llama_4_s_adapter_on_its_pairs_rope_q_and_k_equals_its_merged_model() {
    // Its checkpoints' q/k rows rotate in adjacent pairs and are regrouped
    // into halves at load: a PEFT adapter's B of q and k must be regrouped
    // alike. Its expert layers take no adapters: this one adapts attention.
    let tmp = tempfile::tempdir().unwrap();
    let (base, merged) = (tmp.path().join("base"), tmp.path().join("merged"));
    copy_f32("llama4", &base, |_| {});
    let mut m = open(&base, None);
    let spec = LoraSpec {
        targets: vec![Target::Q, Target::K, Target::V, Target::O],
        ..LoraSpec::all(4, 47)
    };
    let (a, tensors) = adapter(&m, &tmp.path().join("a"), &spec, false);
    let shapes = LoraShapes::of(m.decoder().spec());
    copy_f32("llama4", &merged, |w| merge(w, &shapes, &spec, &tensors));
    let ps = prompts(&m);
    let with = logits(&mut m, &ps, &[Some(a), None]);
    let want = logits(&mut open(&merged, None), &ps, &[]);
    let d = max_diff(&with[0], &want[0]);
    assert!(d < 2e-3, "llama4: adapter vs merged {d}");
    let plain = logits(&mut m, &ps, &[]);
    let moved = max_diff(&plain[0], &want[0]);
    assert!(
        moved > 1e-2,
        "llama4: the adapter changed nothing ({moved})"
    );
}

#[test]
fn an_adapter_of_gemma_4_whose_layers_differ_in_shape_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let m = open(&dir("gemma4"), None);
    let shapes = LoraShapes::of(m.decoder().spec());
    assert!(shapes.refused.is_some());
    let attn = LoraSpec {
        targets: vec![Target::Q, Target::O],
        ..LoraSpec::all(4, 7)
    };
    write_peft(tmp.path(), &attn, &random_peft_of(&shapes, &attn));
    let err = lora::load("g", tmp.path(), &shapes, 16)
        .unwrap_err()
        .to_string();
    assert!(err.contains("differ in projection shapes"), "{err}");
    // A family of even layers takes the same adapter.
    let llama = LoraShapes::of(open(&dir("llama"), None).decoder().spec());
    assert!(llama.refused.is_none());
}
