//! A recurrent model's state slots in the decoder: a row that takes the
//! slot of a neighbour cancelled mid-prefill or mid-decode starts afresh
//! and still answers as transformers does; a slot that does not hold the
//! tokens before a row's chunk is refused, not read.

use ferrox_core::{BatchModel, Pool, Table};
use ferrox_plan::{CacheKind, KvDtype};

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

/// The families with recurrent layers of each kind: Mamba-2's, Gated
/// DeltaNet's among attention layers, LFM2's short convolutions (a state
/// of the convolution alone), and Nemotron-H's Mamba-2 among attention and
/// mixer-less MLP layers (or experts, Nemotron 3's).
const RECURRENT: [&str; 5] = ["mamba2", "qwen35", "lfm2", "nemotron_h", "nemotron_h_moe"];

/// A hybrid's tables are found by kind, never by position: the model built
/// with its pools listed in any order, and each row listing its tables in
/// any order, answers as transformers does, token for token the same as in
/// the model's own order. (With the old convention, tables matched to the
/// groups by position and the state slot as "the last table", both orders
/// below fed the attention layers the slot and the state the KV blocks.)
#[test]
fn a_hybrid_row_s_tables_are_addressed_by_kind_in_any_order() {
    for family in ["qwen35", "granitehybrid"] {
        let r = reference(family);
        let p = &r.runs[0].prompts[0];
        let mut tokens = Vec::new();
        for reverse in [false, true] {
            let d = super::reference::decoder(&dir(family), None);
            let mut pools = vec![
                Pool {
                    kind: CacheKind::Full,
                    blocks: 64,
                },
                Pool {
                    kind: CacheKind::State,
                    blocks: 2,
                },
            ];
            if reverse {
                pools.reverse();
            }
            let mut m = crate::PagedModel::with_pools(d, &pools, 4, KvDtype::F32).unwrap();
            let order = Pools::of(&m);
            let order = if reverse { order.reversed() } else { order };
            let mut kv = order.seq(p.ids.len() + p.steps.len(), 5);
            let kinds: Vec<CacheKind> = kv.tables().iter().map(|t| t.kind).collect();
            assert_eq!(
                kinds[0], pools[0].kind,
                "{family}: tables in the order asked"
            );
            let got = greedy(&mut m, &mut kv, &p.ids, p.steps.len(), 5);
            let compared =
                check_greedy(&format!("{family} reverse={reverse}"), &got, p, r.near_tie);
            assert!(compared >= 2, "{family}");
            tokens.push(got.into_iter().map(|(t, _)| t).collect::<Vec<u32>>());
        }
        assert_eq!(tokens[0], tokens[1], "{family}");
    }
}

#[test]
fn a_row_in_the_slot_of_a_cancelled_neighbour_matches_transformers() {
    for family in RECURRENT {
        cancelled_neighbour(family);
    }
}

fn cancelled_neighbour(family: &str) {
    let r = reference(family);
    let mut m = open(&dir(family), None);
    // One slot: every sequence takes the one its neighbour gave back.
    m.set_state_slots(1).unwrap();
    let pools = Pools::of(&m);
    let neighbour: Vec<u32> = (10..50).collect();
    for (i, p) in r.runs[0].prompts.iter().enumerate() {
        // Cancelled while prefilling (i even) or while decoding (i odd).
        let mut kv = pools.seq(128, 7);
        let part = if i % 2 == 0 { 14 } else { neighbour.len() };
        let logits = prefill(&mut m, &mut kv, &neighbour[..part], 7);
        if i % 2 == 1 {
            decode(&mut m, &mut kv, argmax(&logits), part);
        }
        drop(kv);
        assert_eq!(pools.used(), 0, "the neighbour's slot went back");
        let mut kv = pools.seq(p.ids.len() + p.steps.len(), 5);
        let got = greedy(&mut m, &mut kv, &p.ids, p.steps.len(), 5);
        let compared = check_greedy(&format!("{family} prompt {i}"), &got, p, r.near_tie);
        assert!(compared >= 2);
    }
}

#[test]
fn a_slot_that_does_not_hold_the_row_s_tokens_is_refused() {
    for family in RECURRENT {
        refused(family);
    }
}

fn refused(family: &str) {
    let mut m = open(&dir(family), None);
    let slots = m
        .cache_pools()
        .into_iter()
        .find(|p| p.kind == CacheKind::State);
    assert_eq!(slots.map(|p| p.blocks), Some(super::reference::SLOTS));
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
    let kv_only: Vec<Table<'_>> = tables
        .iter()
        .copied()
        .filter(|t| t.kind != CacheKind::State)
        .collect();
    let err = m.prefill(&kv_only, &[5], 10, true).unwrap_err();
    assert!(
        err.to_string().contains("the state table is missing"),
        "{err}"
    );
    let past = [super::reference::SLOTS as u32];
    let mut bad = kv_only.clone();
    bad.push(Table {
        kind: CacheKind::State,
        blocks: &past,
    });
    let err = m.prefill(&bad, &[5], 10, true).unwrap_err();
    assert!(
        err.to_string().contains("state table must be one slot"),
        "{err}"
    );
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
        speculative: true,
    };
    m.set_state_slots(shape.max_seqs + 1).unwrap();
    crate::profile::worst_step(&mut m, &shape).unwrap();
}

#[test]
fn inspect_reports_the_state_and_the_plan_gives_it_slots() {
    // Mamba-2, per layer: conv 3 * (128 + 2 * 2 * 16) = 576 values, SSM
    // 8 * 16 * 16 = 2048; two layers, no KV at all. Qwen3.5, per DeltaNet
    // layer: conv 3 * (2 * 2 * 16 + 4 * 16) = 384, state 4 * 16 * 16 =
    // 1024; three layers, and one attention layer's K and V of 2 heads of
    // 32 values a token (held in half on the CPU, in f32 below). LFM2,
    // per convolution layer: the last 2 inputs of 64 channels; three
    // layers, and one attention layer's K and V of 2 heads of 16. Granite
    // 4.0-H with experts: Mamba-2's layers (two), two attention layers of
    // 2 heads of 16. Nemotron-H: two Mamba-2 layers, one attention layer,
    // and MLP layers that keep nothing.
    for (family, state, layers, kv) in [
        ("mamba2", 2 * 4 * (576 + 2048), 2, 0),
        ("qwen35", 3 * 4 * (384 + 1024), 3, 2 * 2 * 32),
        ("lfm2", 3 * 4 * 2 * 64, 3, 2 * 2 * 16),
        ("granitehybrid_moe", 2 * 4 * (576 + 2048), 2, 2 * 2 * 2 * 16),
        ("nemotron_h", 2 * 4 * (576 + 2048), 2, 2 * 2 * 16),
    ] {
        let info = crate::Source::open(&dir(family)).unwrap().info().unwrap();
        assert_eq!(
            (info.facts.state_bytes_per_seq, info.facts.recurrent_layers),
            (state, layers)
        );
        assert_eq!(info.devices.cpu.kv_bytes_per_token, 2 * kv, "{family}");
        let g = info.geometry(ferrox_plan::DeviceKind::Cpu, ferrox_plan::KvDtype::F32);
        let config = ferrox_plan::PlanConfig {
            block_size: 4,
            max_model_len: Some(256),
            max_seqs_cap: Some(64),
            ..ferrox_plan::PlanConfig::default()
        };
        // Ten slots, and each sequence's full context of KV beside them.
        let kv_room = 10 * 256 * 4 * kv;
        let plan = ferrox_plan::plan_for_kv_bytes(&g, &config, 10 * state + kv_room).unwrap();
        let blocks = |kind| plan.blocks(kind);
        assert_eq!(
            (blocks(CacheKind::State), plan.max_seqs),
            (10, 10),
            "{family}"
        );
        assert_eq!(blocks(CacheKind::Full) * 4 * 4 * kv, kv_room, "{family}");
    }
}

#[test]
fn inspect_json_reads_back_as_the_geometry_the_operator_plans_with() {
    // The operator parses `inspect --json` as a `ModelGeometry`: every
    // field the plan needs must travel under the geometry's own names.
    let families = [
        "mamba2",
        "granitehybrid",
        "granitehybrid_moe",
        "qwen35",
        "qwen3next",
        "qwen35moe",
        "lfm2",
        "nemotron_h",
    ];
    for family in families {
        let gguf = reference(family)
            .gguf
            .expect("a GGUF beside the safetensors");
        for path in [dir(family), dir(family).join(gguf)] {
            let info = crate::Source::open(&path).unwrap().info().unwrap();
            let read: ferrox_plan::ModelGeometry =
                serde_json::from_value(serde_json::to_value(&info).unwrap()).unwrap();
            let want = info.geometry(ferrox_plan::DeviceKind::Cpu, info.facts.kv_dtype);
            assert_eq!(read, want, "{}", path.display());
            assert!(read.state_bytes_per_seq > 0 && read.recurrent_layers > 0);
        }
    }
}
