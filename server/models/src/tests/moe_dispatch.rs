//! Batched expert dispatch on the committed Qwen3-MoE model (8 experts, 2 a
//! token, 2 layers): rows whose tokens choose disjoint experts, and rows
//! that all choose the same ones, each get in a batch exactly the logits
//! they get alone (bit for bit on the fused CPU path), and an expert no
//! token chose is never read.

use std::collections::BTreeMap;

use candle_core::quantized::GgmlDType;
use ferrox_core::{BatchModel, DecodeRow, Table};

use super::helpers::{Pools, SeqKv, argmax, decode};
use super::reference::{dir, open, reference, requantize};
use crate::PagedModel;

/// Per layer, the experts a step read (each at most once).
type Chosen = Vec<Vec<usize>>;

/// The reads since `before`, as the experts read per layer; panics if one
/// was read more than once in the step.
fn read_since(m: &PagedModel, before: &[Vec<u64>]) -> Chosen {
    let now = m.decoder().expert_reads();
    now.iter()
        .zip(before)
        .enumerate()
        .map(|(layer, (n, b))| {
            n.iter()
                .zip(b)
                .enumerate()
                .filter_map(|(e, (n, b))| {
                    assert!(n - b <= 1, "layer {layer} expert {e} read {} times", n - b);
                    (n > b).then_some(e)
                })
                .collect()
        })
        .collect()
}

/// Token `t` alone at position 0 of its own blocks: its logits and the
/// experts it chose.
fn alone(m: &mut PagedModel, pools: &Pools, t: u32) -> (Vec<f32>, Chosen) {
    let mut kv = pools.seq(1, 1);
    let before = m.decoder().expert_reads();
    let logits = decode(m, &mut kv, t, 0);
    (logits, read_since(m, &before))
}

/// `tokens` in one step, each at position 0 of its own blocks: their
/// logits and the experts the step read.
fn batched(m: &mut PagedModel, pools: &Pools, tokens: &[u32]) -> (Vec<Vec<f32>>, Chosen) {
    let mut leases: Vec<_> = tokens.iter().map(|_| pools.seq(1, 1)).collect();
    leases.iter_mut().for_each(|kv| kv.prepare(0, 1));
    let tables: Vec<Vec<Table<'_>>> = leases.iter().map(|kv| kv.tables()).collect();
    let rows: Vec<DecodeRow<'_>> = tokens
        .iter()
        .zip(&tables)
        .map(|(&token, tables)| DecodeRow {
            token,
            pos: 0,
            tables,
        })
        .collect();
    let before = m.decoder().expert_reads();
    let logits = m.decode(&rows).unwrap();
    (logits, read_since(m, &before))
}

/// Three tokens whose experts are pairwise disjoint in every layer
/// (greedily): six of the eight experts, two left unchosen.
fn disjoint(alone: &BTreeMap<u32, (Vec<f32>, Chosen)>) -> Vec<u32> {
    let mut picked: Vec<u32> = Vec::new();
    for (&t, (_, c)) in alone {
        if picked.len() == 3 {
            break;
        }
        let clash = picked.iter().any(|p| {
            let pc = &alone[p].1;
            c.iter()
                .zip(pc)
                .any(|(a, b)| a.iter().any(|e| b.contains(e)))
        });
        if !clash {
            picked.push(t);
        }
    }
    picked
}

/// The largest set of tokens that chose the same experts in every layer.
fn alike(alone: &BTreeMap<u32, (Vec<f32>, Chosen)>) -> Vec<u32> {
    let mut groups: BTreeMap<&Chosen, Vec<u32>> = BTreeMap::new();
    for (&t, (_, c)) in alone {
        groups.entry(c).or_default().push(t);
    }
    groups
        .into_values()
        .max_by_key(Vec::len)
        .unwrap_or_default()
}

fn check_model(m: &mut PagedModel, exact: bool) {
    let pools = Pools::of(m);
    let vocab = m.decoder().spec().vocab as u32;
    let experts = m.decoder().spec().layers[0].moe().unwrap().experts;
    let runs: BTreeMap<u32, (Vec<f32>, Chosen)> =
        (8..vocab).map(|t| (t, alone(m, &pools, t))).collect();
    let sets = [("disjoint", disjoint(&runs)), ("alike", alike(&runs))];
    for (what, tokens) in sets {
        assert!(tokens.len() >= 3, "{what}: only {tokens:?}");
        let (logits, read) = batched(m, &pools, &tokens);
        for (layer, got) in read.iter().enumerate() {
            let mut want: Vec<usize> = tokens
                .iter()
                .flat_map(|t| runs[t].1[layer].clone())
                .collect();
            want.sort();
            want.dedup();
            assert_eq!(got, &want, "{what} layer {layer}: experts read");
            assert!(got.len() < experts, "{what}: some expert is left unread");
        }
        if what == "disjoint" {
            let distinct: usize = tokens.iter().map(|t| runs[t].1[0].len()).sum();
            assert_eq!(
                read[0].len(),
                distinct,
                "disjoint rows read disjoint experts"
            );
        } else {
            assert_eq!(read[0], runs[&tokens[0]].1[0], "alike rows read one set");
        }
        for (t, got) in tokens.iter().zip(&logits) {
            let want = &runs[t].0;
            if exact {
                assert_eq!(got, want, "{what}: token {t} batched vs alone");
            } else {
                let diff = got
                    .iter()
                    .zip(want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(diff < 1e-4, "{what}: token {t} off by {diff}");
                assert_eq!(argmax(got), argmax(want), "{what}: token {t}");
            }
        }
    }
}

#[test]
fn batched_rows_get_their_own_experts_and_unchosen_experts_are_not_read() {
    let r = reference("qwen3moe");
    let tmp = tempfile::tempdir().unwrap();
    let q8 = tmp.path().join("q8.gguf");
    requantize(
        &r.gguf_path().unwrap(),
        &q8,
        GgmlDType::Q8_0,
        GgmlDType::Q8_0,
    );
    // The fused CPU path: every row's arithmetic is its own, bit for bit.
    let mut fused = open(&q8, None);
    assert!(fused.decoder().fused_layers());
    check_model(&mut fused, true);
    // The op-by-op path (every other device's) groups the same way.
    let mut ops = open(&dir("qwen3moe"), None);
    assert!(!ops.decoder().fused_layers());
    check_model(&mut ops, false);
}
