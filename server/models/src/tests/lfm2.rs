//! LFM2's short convolutions: prompts prefilled in chunks of every size
//! around the kernel (the held inputs cross every chunk edge) answer as
//! transformers does; the convolution state is what `inspect` reports and
//! the plan gives slots for; a file missing a convolution tensor is refused
//! by the tensor's name.

use ferrox_plan::CacheKind;

use super::helpers::{Pools, argmax, decode, prefill};
use super::missing::{assert_refused, checkpoint_without, gguf_without};
use super::reference::{check_greedy, dir, open, reference};
use crate::Source;

#[test]
fn prompts_prefilled_in_chunks_across_the_kernel_match_transformers() {
    let r = reference("lfm2");
    let run = &r.runs[0];
    for path in r.files(run) {
        let mut m = open(&path, run.context);
        let pools = Pools::of(&m);
        // Chunks of 1 to 4 tokens: the kernel of 3 holds 2 inputs, which
        // fall on either side of every edge.
        for chunk in 1..=4 {
            for (i, p) in run.prompts.iter().enumerate() {
                let mut kv = pools.seq(p.ids.len() + p.steps.len(), chunk);
                let mut logits = prefill(&mut m, &mut kv, &p.ids, chunk);
                let mut got = Vec::new();
                for s in 0..p.steps.len() {
                    let token = argmax(&logits);
                    got.push((token, super::reference::log_softmax(&logits)));
                    if s + 1 < p.steps.len() {
                        logits = decode(&mut m, &mut kv, token, p.ids.len() + s);
                    }
                }
                let what = format!("{} chunk {chunk} prompt {i}", path.display());
                assert!(check_greedy(&what, &got, p, r.near_tie) >= 2, "{what}");
            }
        }
        assert_eq!(pools.used(), 0);
    }
}

#[test]
fn the_convolution_state_held_is_what_inspect_counts() {
    // Three convolution layers, each the last 2 inputs of 64 channels in
    // f32 (the plan's slots: `tests/recurrent.rs`, with the other hybrids).
    let state = 3 * 4 * 2 * 64;
    let r = reference("lfm2");
    let gguf = r.gguf_path().expect("a GGUF beside the safetensors");
    for path in [dir("lfm2"), gguf] {
        let info = Source::open(&path).unwrap().info().unwrap();
        let what = path.display().to_string();
        assert_eq!(info.architecture, "lfm2", "{what}");
        assert_eq!(
            (info.facts.state_bytes_per_seq, info.facts.recurrent_layers),
            (state, 3),
            "{what}"
        );
        // What the slots hold as allocated is what the plan counted.
        let m = open(&path, None);
        let held = m
            .pool_bytes()
            .into_iter()
            .find(|(k, _)| *k == CacheKind::State);
        let slots = super::reference::SLOTS as u64;
        assert_eq!(held, Some((CacheKind::State, slots * state)), "{what}");
    }
}

#[test]
fn a_checkpoint_without_a_convolution_tensor_is_refused_by_its_name() {
    let name = "model.layers.1.conv.conv.weight";
    let tmp = checkpoint_without("lfm2", name);
    assert_refused(tmp.path(), name);
}

#[test]
fn a_gguf_without_a_convolution_tensor_is_refused_by_its_name() {
    let name = "blk.3.shortconv.conv.weight";
    let (_tmp, path) = gguf_without("lfm2", name);
    assert_refused(&path, name);
}
