//! A recurrent model's state slots in the decoder: a row that takes the
//! slot of a neighbour cancelled mid-prefill or mid-decode starts afresh
//! and still answers as transformers does; a slot that does not hold the
//! tokens before a row's chunk is refused, not read.

use ferrox_core::BatchModel;

use super::helpers::{Pools, SeqKv, argmax, decode, prefill};
use super::reference::{check_greedy, dir, log_softmax, open, reference};

/// Greedy steps after `prompt` in `kv`, with their log-probabilities.
fn greedy(
    m: &mut crate::PagedModel,
    kv: &mut impl SeqKv,
    prompt: &[u32],
    n: usize,
    chunk: usize,
) -> Vec<(u32, Vec<f32>)> {
    let mut logits = prefill(m, kv, prompt, chunk);
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let token = argmax(&logits);
        out.push((token, log_softmax(&logits)));
        if i + 1 < n {
            logits = decode(m, kv, token, prompt.len() + i);
        }
    }
    out
}

#[test]
fn a_row_in_the_slot_of_a_cancelled_neighbour_matches_transformers() {
    let r = reference("mamba2");
    let mut m = open(&dir("mamba2"), None);
    // One slot: every sequence takes the one its neighbour gave back.
    m.set_state_slots(1).unwrap();
    let pools = Pools::of(&m);
    let neighbour: Vec<u32> = (10..50).collect();
    for (i, p) in r.runs[0].prompts.iter().enumerate() {
        // Cancelled while prefilling (i even) or while decoding (i odd).
        let mut kv = pools.seq(64, 7);
        let part = if i % 2 == 0 { 14 } else { neighbour.len() };
        let logits = prefill(&mut m, &mut kv, &neighbour[..part], 7);
        if i % 2 == 1 {
            decode(&mut m, &mut kv, argmax(&logits), part);
        }
        drop(kv);
        assert_eq!(pools.used(), 0, "the neighbour's slot went back");
        let mut kv = pools.seq(p.ids.len() + p.steps.len(), 5);
        let got = greedy(&mut m, &mut kv, &p.ids, p.steps.len(), 5);
        let compared = check_greedy(&format!("mamba2 prompt {i}"), &got, p, r.near_tie);
        assert!(compared >= 2);
    }
}

#[test]
fn a_slot_that_does_not_hold_the_row_s_tokens_is_refused() {
    let mut m = open(&dir("mamba2"), None);
    assert_eq!(m.state_slots(), Some(super::reference::SLOTS));
    let pools = Pools::of(&m);
    let mut kv = pools.seq(32, 8);
    let prompt: Vec<u32> = (10..20).collect();
    prefill(&mut m, &mut kv, &prompt, 8);
    let tables = kv.tables();
    // Resuming past (or before) the 10 tokens the slot holds.
    for pos in [9, 12] {
        let err = m.prefill(&tables, &[5], pos, true).unwrap_err();
        assert!(err.to_string().contains("holds 10 tokens"), "{err}");
    }
    // No slot, or one past the store.
    let kv_only = &tables[..tables.len() - 1];
    assert!(m.prefill(kv_only, &[5], 10, true).is_err());
    let past = [super::reference::SLOTS as u32];
    let mut bad = kv_only.to_vec();
    bad.push(&past);
    let err = m.prefill(&bad, &[5], 10, true).unwrap_err();
    assert!(err.to_string().contains("state slot"), "{err}");
    // The refusals read and wrote nothing: the row goes on.
    assert!(m.prefill(&tables, &[5], 10, true).unwrap().is_some());
    // Two rows in one slot are refused.
    let rows = [
        ferrox_core::DecodeRow {
            token: 3,
            pos: 11,
            tables: &tables,
        },
        ferrox_core::DecodeRow {
            token: 4,
            pos: 11,
            tables: &tables,
        },
    ];
    assert!(m.decode(&rows).is_err());
}

#[test]
fn the_profile_step_gives_each_row_a_slot() {
    let mut m = open(&dir("mamba2"), None);
    let shape = crate::profile::ProfileShape {
        prefill_chunk: 16,
        max_seqs: 3,
        block_size: 4,
    };
    m.set_state_slots(shape.max_seqs + 1).unwrap();
    crate::profile::worst_step(&mut m, &shape).unwrap();
}

#[test]
fn inspect_reports_the_state_and_the_plan_gives_it_slots() {
    let info = crate::Source::open(&dir("mamba2")).unwrap().info().unwrap();
    // Per layer: conv 3 * (128 + 2 * 2 * 16) = 576 values, SSM 8 * 16 * 16
    // = 2048, in f32; two layers; no KV at all.
    let state = 2 * 4 * (576 + 2048);
    assert_eq!(
        (info.state_bytes_per_seq, info.recurrent_layers),
        (state, 2)
    );
    assert_eq!(info.devices.cpu.kv_bytes_per_token, 0);
    let g = info.geometry(ferrox_plan::DeviceKind::Cpu, ferrox_plan::KvDtype::F32);
    let config = ferrox_plan::PlanConfig {
        block_size: 4,
        max_model_len: Some(1024),
        max_seqs_cap: Some(64),
        ..ferrox_plan::PlanConfig::default()
    };
    let plan = ferrox_plan::plan_for_kv_bytes(&g, &config, 10 * state).unwrap();
    assert_eq!(
        (plan.kv_blocks, plan.state_slots, plan.max_seqs),
        (0, 10, 10)
    );
}

#[test]
fn inspect_json_reads_back_as_the_geometry_the_operator_plans_with() {
    // The operator parses `inspect --json` as a `ModelGeometry`: every
    // field the plan needs must travel under the geometry's own names.
    for family in ["mamba2", "granitehybrid"] {
        let gguf = reference(family)
            .gguf
            .expect("a GGUF beside the safetensors");
        for path in [dir(family), dir(family).join(gguf)] {
            let info = crate::Source::open(&path).unwrap().info().unwrap();
            let read: ferrox_plan::ModelGeometry =
                serde_json::from_value(serde_json::to_value(&info).unwrap()).unwrap();
            let want = info.geometry(ferrox_plan::DeviceKind::Cpu, info.kv_dtype);
            assert_eq!(read, want, "{}", path.display());
            assert!(read.state_bytes_per_seq > 0 && read.recurrent_layers > 0);
        }
    }
}
