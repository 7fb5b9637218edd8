//! Every family against transformers (the committed tiny models and their
//! references): from safetensors and from llama.cpp's GGUF, through the
//! paged kernel and the gather path, whole prompts and chunks of every size
//! that crosses a window edge, batched; and the fused CPU path against the
//! op-by-op one on quantized copies.

use super::helpers::{Joiner, Pools, argmax, decode, greedy_batched, prefill};
use super::reference::{
    FAMILIES, Prompt, Reference, check_greedy, dir, log_softmax, open, reference, requantize,
};
use crate::PagedModel;
use candle_core::quantized::GgmlDType;

/// Greedy steps after `prompt` (prefilled in chunks of `chunk`), each with
/// its log-probabilities; windowed pools give back what their windows have
/// left before every step, as the worker's do.
fn greedy(m: &mut PagedModel, prompt: &[u32], n: usize, chunk: usize) -> Vec<(u32, Vec<f32>)> {
    let pools = Pools::of(m);
    let mut kv = pools.seq(prompt.len() + n, chunk);
    let mut logits = prefill(m, &mut kv, prompt, chunk);
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let token = argmax(&logits);
        out.push((token, log_softmax(&logits)));
        if i + 1 < n {
            logits = decode(m, &mut kv, token, prompt.len() + i);
        }
    }
    out
}

/// The widest window of a family's model, or its recurrent scan's block
/// (0: neither): chunk edges must fall at every offset from their edges.
fn widest_edge(r: &Reference) -> usize {
    let m = open(&dir(&r.family), None);
    let spec = m.decoder().spec();
    let windows = m.decoder().kv_groups().iter().filter_map(|g| g.window);
    let scans = spec.layers.iter().filter_map(|l| l.scan_chunk());
    windows.chain(scans).max().unwrap_or(0)
}

fn check_prompts(what: &str, m: &mut PagedModel, prompts: &[Prompt], r: &Reference, chunk: usize) {
    for (i, p) in prompts.iter().enumerate() {
        let got = greedy(m, &p.ids, p.steps.len(), chunk);
        let compared = check_greedy(&format!("{what} prompt {i}"), &got, p, r.near_tie);
        assert!(compared >= 2, "{what} prompt {i}: a near-tie at once");
    }
}

#[test]
fn every_family_matches_transformers_from_both_formats_and_both_attention_paths() {
    for family in FAMILIES {
        let r = reference(family);
        for run in &r.runs {
            for path in r.files(run) {
                for paged in [true, false] {
                    let mut m = open(&path, run.context);
                    m.decoder_mut().set_fused_attention(paged);
                    let what = format!("{family} {} {} paged {paged}", run.name, path.display());
                    check_prompts(&what, &mut m, &run.prompts, &r, 512);
                }
            }
        }
    }
}

#[test]
fn prompts_chunked_at_every_size_across_a_window_edge_match_transformers() {
    for family in FAMILIES {
        let r = reference(family);
        let window = widest_edge(&r);
        if window == 0 {
            continue;
        }
        let run = &r.runs[0];
        let path = &r.files(run)[0];
        let mut m = open(path, run.context);
        // Every chunk size up to past the window: chunk edges fall at every
        // offset from the window's edges.
        for chunk in 1..=window + 2 {
            check_prompts(
                &format!("{family} chunk {chunk}"),
                &mut m,
                &run.prompts,
                &r,
                chunk,
            );
        }
    }
}

#[test]
fn batched_rows_of_every_family_equal_each_alone() {
    for family in FAMILIES {
        let r = reference(family);
        let run = &r.runs[0];
        let mut m = open(&r.files(run)[0], run.context);
        let pools = Pools::of(&m);
        let n = run.prompts[0].steps.len();
        let seqs: Vec<Joiner> = run
            .prompts
            .iter()
            .enumerate()
            .map(|(i, p)| Joiner {
                prompt: p.ids.clone(),
                join: 2 * i,
                n,
            })
            .collect();
        let batched = greedy_batched(&mut m, &pools, &seqs, 5);
        for (i, (p, got)) in run.prompts.iter().zip(&batched).enumerate() {
            let alone: Vec<u32> = greedy(&mut m, &p.ids, n, 512).iter().map(|s| s.0).collect();
            assert_eq!(got, &alone, "{family} prompt {i}: batched vs alone");
        }
        assert_eq!(pools.used(), 0);
    }
}

#[test]
fn the_fused_cpu_path_matches_the_op_by_op_path_for_every_family() {
    let tmp = tempfile::tempdir().unwrap();
    for family in FAMILIES {
        let r = reference(family);
        let run = &r.runs[0];
        let Some(src) = r.gguf_path() else {
            continue;
        };
        // A layer with a packed gated feed-forward takes the fused path,
        // its mixer too where that is plain attention (a recurrent or latent
        // layer's mixer runs op by op before its fused feed-forward). These
        // run op by op throughout: Mamba-2's and Nemotron-H's feed-forwards
        // are plain or none, Granite's multipliers are not in the fused ops,
        // nor Gemma 4's value norm, per-layer inputs and output scales.
        const NONE_FUSED: [&str; 7] = [
            "mamba2",
            "nemotron_h",
            "nemotron_h_moe",
            "granitehybrid",
            "granitehybrid_moe",
            "gemma4",
            "gemma4_moe",
        ];
        if NONE_FUSED.contains(family) {
            continue;
        }
        // One packed type for q/k/v and gate/up, then split ones (k, v and
        // up of another type: one activation quantisation feeds both).
        for (q, other) in [
            (GgmlDType::Q8_0, GgmlDType::Q8_0),
            (GgmlDType::Q8_0, GgmlDType::Q4_0),
        ] {
            let path = tmp.path().join(format!("{family}-{q:?}-{other:?}.gguf"));
            requantize(&src, &path, q, other);
            let (mut fused, mut ops) = (open(&path, run.context), open(&path, run.context));
            ops.decoder_mut().set_fused_layers(false);
            assert!(
                fused.decoder().fused_layers(),
                "{family}: fused path not taken"
            );
            for (i, p) in run.prompts.iter().enumerate() {
                let a = greedy(&mut fused, &p.ids, 4, 7);
                let b = greedy(&mut ops, &p.ids, 4, 7);
                for (s, (x, y)) in a.iter().zip(&b).enumerate() {
                    let diff =
                        x.1.iter()
                            .zip(&y.1)
                            .map(|(u, v)| (u - v).abs())
                            .fold(0f32, f32::max);
                    // Same quantisation, norms and RoPE arithmetic: only the
                    // summation order inside the matmuls differs.
                    assert!(
                        diff < 1e-3,
                        "{family} {other:?} prompt {i} step {s}: {diff}"
                    );
                    assert_eq!(x.0, y.0, "{family} {other:?} prompt {i} step {s}");
                }
            }
        }
    }
}

#[test]
fn each_family_s_text_side_reads_alike_from_both_formats() {
    use ferrox_core::ChatMessage;
    for family in FAMILIES {
        let r = reference(family);
        let d = dir(family);
        let st = crate::Source::open(&d).unwrap().text().unwrap();
        let Some(gguf) = r.gguf_path() else {
            continue;
        };
        let gg = crate::Source::open(&gguf).unwrap().text().unwrap();
        let text = "The capital of France is Paris. Name three colors!";
        let (a, b) = (
            st.tokenizer.encode(text, false).unwrap(),
            gg.tokenizer.encode(text, false).unwrap(),
        );
        assert_eq!(a, b, "{family}: the GGUF's vocabulary tokenizes alike");
        assert_eq!(gg.tokenizer.decode(&b, false).unwrap(), text, "{family}");
        let msgs = [ChatMessage::new("user", "hi")];
        let (ts, tg) = (
            st.chat_template.as_ref().unwrap(),
            gg.chat_template.as_ref().unwrap(),
        );
        let opts = ferrox_core::chat_template::RenderOptions {
            add_generation_prompt: true,
            ..Default::default()
        };
        let shown = ts.render_with(&msgs, &opts).unwrap();
        assert_eq!(shown, tg.render_with(&msgs, &opts).unwrap(), "{family}");
        // Gemma's turns end at <end_of_turn>, ChatML's at <|im_end|>.
        let end = if shown.contains("<start_of_turn>") {
            "<end_of_turn>"
        } else if shown.contains("<|im_start|>") {
            "<|im_end|>"
        } else {
            "<eos>"
        };
        for t in [&st, &gg] {
            let id = t.tokenizer.token_to_id(end).unwrap();
            assert!(
                t.end_of_generation.contains(id),
                "{family}: {end} ends a turn"
            );
        }
    }
}

#[test]
fn qwen3_s_enable_thinking_reaches_its_template() {
    let t = crate::Source::open(&dir("qwen3")).unwrap().text().unwrap();
    let template = t.chat_template.unwrap();
    let off: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(r#"{"enable_thinking": false}"#).unwrap();
    let msgs = [ferrox_core::ChatMessage::new("user", "hi")];
    let render = |kwargs| {
        let opts = ferrox_core::chat_template::RenderOptions {
            add_generation_prompt: true,
            kwargs,
            ..Default::default()
        };
        template.render_with(&msgs, &opts).unwrap()
    };
    assert!(render(Some(&off)).ends_with("<think>\n\n</think>\n\n"));
    assert!(render(None).ends_with("<|im_start|>assistant\n"));
}

/// A multimodal checkpoint around a text model of the fixtures.
struct Multimodal {
    /// The fixture.
    family: &'static str,
    /// Its multimodal class and `model_type`.
    arch: (&'static str, &'static str),
    /// Tensors beside the text model's (a vision tower, MTP layers).
    beside: &'static [&'static str],
}

/// `m`'s fixture rewritten as its multimodal checkpoint: its config under
/// `text_config`, its tensors under `prefix`, `m.beside` next to them.
fn as_multimodal(m: &Multimodal, to: &std::path::Path, prefix: &str) {
    let from = dir(m.family);
    let text: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(from.join("config.json")).unwrap()).unwrap();
    let config = serde_json::json!({"architectures": [m.arch.0],
        "model_type": m.arch.1, "text_config": text, "vision_config": {"hidden_size": 8}});
    std::fs::write(to.join("config.json"), config.to_string()).unwrap();
    let mut tensors =
        candle_core::safetensors::load(from.join("model.safetensors"), &candle_core::Device::Cpu)
            .unwrap();
    let zeros = || {
        candle_core::Tensor::zeros((8, 8), candle_core::DType::F32, &candle_core::Device::Cpu)
            .unwrap()
    };
    let renamed: std::collections::HashMap<String, candle_core::Tensor> = tensors
        .drain()
        .map(|(k, v)| match k.strip_prefix("model.") {
            Some(rest) => (format!("{prefix}{rest}"), v),
            None => (k, v),
        })
        .chain(m.beside.iter().map(|n| (n.to_string(), zeros())))
        .collect();
    candle_core::safetensors::save(&renamed, to.join("model.safetensors")).unwrap();
    std::fs::copy(from.join("tokenizer.json"), to.join("tokenizer.json")).unwrap();
}

const GEMMA3: Multimodal = Multimodal {
    family: "gemma3",
    arch: ("Gemma3ForConditionalGeneration", "gemma3"),
    beside: &["vision_tower.vision_model.embeddings.patch_embedding.weight"],
};

#[test]
fn a_multimodal_qwen3_5_checkpoint_serves_its_language_model() {
    // As on the Hub: the language model under `model.language_model.`, the
    // vision tower under `model.visual.`, the MTP layers under `mtp.`.
    let qwen = Multimodal {
        family: "qwen35",
        arch: ("Qwen3_5ForConditionalGeneration", "qwen3_5"),
        beside: &["model.visual.patch_embed.proj.weight", "mtp.fc.weight"],
    };
    let r = reference("qwen35");
    let info = crate::Source::open(&dir("qwen35")).unwrap().info().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    as_multimodal(&qwen, tmp.path(), "model.language_model.");
    let got = crate::Source::open(tmp.path()).unwrap().info().unwrap();
    assert_eq!(got.architecture, "qwen35");
    assert_eq!(
        (got.facts.weight_bytes, got.facts.state_bytes_per_seq),
        (info.facts.weight_bytes, info.facts.state_bytes_per_seq)
    );
    let mut m = open(tmp.path(), None);
    for (i, p) in r.runs[0].prompts.iter().enumerate() {
        let steps = greedy(&mut m, &p.ids, p.steps.len(), 16);
        check_greedy(
            &format!("multimodal qwen35 prompt {i}"),
            &steps,
            p,
            r.near_tie,
        );
    }
}

#[test]
fn a_multimodal_gemma3_checkpoint_serves_its_language_model() {
    let r = reference("gemma3");
    let p = &r.runs[0].prompts[0];
    let mut info = crate::Source::open(&dir("gemma3")).unwrap().info().unwrap();
    for prefix in ["model.language_model.", "language_model.model."] {
        let tmp = tempfile::tempdir().unwrap();
        as_multimodal(&GEMMA3, tmp.path(), prefix);
        let mut src = crate::Source::open(tmp.path()).unwrap();
        let got = src.info().unwrap();
        assert_eq!(got.architecture, "gemma3");
        // The vision tower is not the decoder's: not counted.
        assert_eq!(got.facts.weight_bytes, info.facts.weight_bytes, "{prefix}");
        let mut m = open(tmp.path(), None);
        let steps = greedy(&mut m, &p.ids, p.steps.len(), 512);
        check_greedy(&format!("gemma3 under {prefix}"), &steps, p, r.near_tie);
    }
    // inspect names the layer kinds: one full layer in six, the rest slide.
    info.kv_groups.iter_mut().for_each(|g| g.layers.truncate(2));
    let groups: Vec<_> = info
        .kv_groups
        .iter()
        .map(|g| (g.window, g.layers.clone()))
        .collect();
    assert_eq!(groups, [(None, vec![5]), (Some(8), vec![0, 1])]);
    let json = serde_json::to_value(&info).unwrap();
    assert_eq!(json["kvGroups"][1]["window"], 8);
}

#[test]
fn a_multimodal_mistral3_checkpoint_serves_its_ministral3_text_model() {
    // Ministral 3 ships inside Mistral 3's wrapper: a Pixtral tower and
    // its projector beside the language model.
    let mistral3 = Multimodal {
        family: "ministral3",
        arch: ("Mistral3ForConditionalGeneration", "mistral3"),
        beside: &[
            "model.vision_tower.patch_conv.weight",
            "model.multi_modal_projector.linear_1.weight",
        ],
    };
    let r = reference("ministral3");
    let p = &r.runs[0].prompts[2];
    let tmp = tempfile::tempdir().unwrap();
    as_multimodal(&mistral3, tmp.path(), "model.language_model.");
    let got = crate::Source::open(tmp.path()).unwrap().info().unwrap();
    assert_eq!(got.architecture, "mistral3");
    let mut m = open(tmp.path(), None);
    let steps = greedy(&mut m, &p.ids, p.steps.len(), 16);
    check_greedy("multimodal ministral3", &steps, p, r.near_tie);
}

#[test]
fn every_family_held_as_on_a_gpu_tracks_transformers() {
    // Half matrices through a dense matmul, KV in the model's half type: the
    // path a CUDA server takes, minus the device. Teacher-forced along
    // transformers' tokens, every step's top five within half precision's
    // reach: the device check's bound for bf16 (tests/device/check.py), which
    // holds the GPU itself to the same references.
    use ferrox_plan::DeviceKind;
    for family in FAMILIES {
        let r = reference(family);
        let run = &r.runs[0];
        let path = dir(family);
        let mut src = crate::Source::open(&path).unwrap();
        let kv = src.info().unwrap().devices.cuda.kv_dtype;
        let mut d = src
            .decoder_held_as(&candle_core::Device::Cpu, DeviceKind::Cuda)
            .unwrap();
        if let Some(c) = run.context {
            d.set_context(c).unwrap();
        }
        let mut m = PagedModel::new(d, 256, 4, kv).unwrap();
        m.set_state_slots(super::reference::SLOTS).unwrap();
        let pools = Pools::of(&m);
        for (i, p) in run.prompts.iter().enumerate() {
            let mut kv = pools.seq(p.ids.len() + p.steps.len(), 512);
            let mut logits = prefill(&mut m, &mut kv, &p.ids, 512);
            for (s, want) in p.steps.iter().enumerate() {
                // Past a routing near-tie half precision may pick other experts.
                if !r.routes_clearly(want) {
                    break;
                }
                let lp = log_softmax(&logits);
                for &(id, ref_lp) in &want.top {
                    let d = (lp[id as usize] - ref_lp).abs();
                    assert!(d < 0.2, "{family} prompt {i} step {s}: {id} off by {d}");
                }
                logits = decode(&mut m, &mut kv, want.token, p.ids.len() + s);
            }
        }
    }
}
