//! The window memory model on real numerics: a tiny Mistral-shaped model whose
//! every layer has an 8-token window, served by the engine's worker with
//! window reclaim in a small window pool, gives exactly the tokens each
//! request gives alone with nothing given back; its layers see only their
//! window; and the pool holds no more than each row's reservation.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::Device;
use ferrox_core::BatchModel;
use ferrox_engine::{EngineConfig, Event, Metrics, Scheduler};
use ferrox_plan::KvDtype;

use super::helpers::{Pools, argmax, greedy_alone, prefill};
use super::request::{greedy, request};
use crate::fixtures::{Tiny, random_weights, write_safetensors};
use crate::{PagedModel, Source};

const WINDOW: usize = 8;
const BLOCK: usize = 4;

/// A tiny Mistral with an 8-token window on both layers.
fn mistral(dir: &Path) {
    let t = Tiny::default();
    write_safetensors(dir, &t, &random_weights(&t, 7));
    let path = dir.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["architectures"] = serde_json::json!(["MistralForCausalLM"]);
    config["sliding_window"] = serde_json::json!(WINDOW);
    std::fs::write(&path, config.to_string()).unwrap();
}

/// The model with a pool of `blocks` blocks for its one (windowed) group.
fn open(dir: &Path, blocks: usize) -> PagedModel {
    let llama = Source::open(dir).unwrap().decoder(&Device::Cpu).unwrap();
    let pool = ferrox_core::Pool {
        kind: ferrox_plan::CacheKind::Window(WINDOW as u64),
        blocks,
    };
    PagedModel::with_pools(llama, &[pool], BLOCK, KvDtype::F32).unwrap()
}

fn prompt(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + seed * 11) % 96).collect()
}

#[test]
fn the_model_lists_one_window_group_and_inspect_says_so() {
    let dir = tempfile::tempdir().unwrap();
    mistral(dir.path());
    let m = open(dir.path(), 16);
    assert_eq!(
        m.cache_pools(),
        [ferrox_core::Pool {
            kind: ferrox_plan::CacheKind::Window(WINDOW as u64),
            blocks: 16
        }]
    );
    let info = Source::open(dir.path()).unwrap().info().unwrap();
    let json = serde_json::to_value(&info).unwrap();
    assert_eq!(
        json["slidingWindows"],
        serde_json::json!([{"window": 8, "layers": 2}])
    );
    assert_eq!(
        json["kvGroups"],
        serde_json::json!([{"window": 8, "layers": [0, 1]}])
    );
    assert_eq!(
        info.geometry(ferrox_plan::DeviceKind::Cpu, KvDtype::F16)
            .cache_groups()[0]
            .kind(),
        ferrox_plan::CacheKind::Window(8)
    );
}

#[test]
fn a_layer_sees_only_its_window() {
    let dir = tempfile::tempdir().unwrap();
    mistral(dir.path());
    let mut m = open(dir.path(), 64);
    let pools = Pools::keeping(&m);
    // Two layers of 8 positions each reach back 2 x 7 = 14 positions: the
    // last token of 30 cannot see positions 0..15, and sees position 15.
    let base = prompt(30, 1);
    let last = |m: &mut PagedModel, p: &[u32]| {
        let mut kv = pools.seq(p.len(), 7);
        prefill(m, &mut kv, p, 7)
    };
    let want = last(&mut m, &base);
    let mut far = base.clone();
    for t in &mut far[..15] {
        *t = (*t + 5) % 96;
    }
    assert_eq!(last(&mut m, &far), want, "tokens outside the window count");
    let mut near = base.clone();
    near[15] = (near[15] + 5) % 96;
    assert_ne!(
        last(&mut m, &near),
        want,
        "a token inside the window is ignored"
    );
}

#[test]
fn the_worker_with_window_reclaim_gives_each_requests_own_tokens() {
    let dir = tempfile::tempdir().unwrap();
    mistral(dir.path());
    let prompts: Vec<Vec<u32>> = (0..4).map(|i| prompt(21 + 3 * i, i as u32 + 1)).collect();
    let n = 20;
    // Alone, one chunk, nothing ever given back: the reference.
    let mut alone = open(dir.path(), 64);
    let pool = Pools::keeping(&alone);
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| greedy_alone(&mut alone, &pool, p, n, 64))
        .collect();
    for chunk in [3, 4, 5, 9] {
        // Each row reserves ceil((8 + chunk - 1) / 4) + 1 window blocks,
        // whatever its length: four rows fit in 4 x that.
        let per_row = (WINDOW + chunk - 1).div_ceil(BLOCK) + 1;
        let blocks = 4 * per_row;
        let model = open(dir.path(), blocks);
        let config = EngineConfig {
            max_seqs: 8,
            max_queue: 8,
            prefill_chunk: chunk,
            max_model_len: 128,
            block_size: BLOCK,
            pools: model.cache_pools(),
            decode_log_interval: 0,
            prefix_caching: true,
            cache_salt: "w".into(),
            max_loras: 1,
            speculative: None,
            max_batch_tokens: 16384,
            kv_offload: Vec::new(),
        };
        let metrics = Arc::new(Metrics::new().unwrap());
        let mut now = Instant::now();
        let (mut s, h) = Scheduler::new(model, config, metrics, now).unwrap();
        let mut subs: Vec<_> = prompts
            .iter()
            .map(|p| h.submit(request(p.clone(), n, greedy()), now).unwrap())
            .collect();
        let mut ticks = 0;
        while ticks == 0 || !s.is_idle() {
            now += Duration::from_millis(1);
            s.tick(now);
            let (_, w) = s.pools_stats()[0];
            assert!(w.held <= s.running() * per_row, "chunk {chunk}: {w:?}");
            ticks += 1;
            assert!(ticks < 500);
        }
        for (sub, want) in subs.iter_mut().zip(&want) {
            let mut ids = Vec::new();
            while let Some(e) = sub.try_next() {
                match e {
                    Event::Token { id, .. } => ids.push(id),
                    Event::Error(e) => panic!("chunk {chunk}: {e}"),
                    _ => {}
                }
            }
            assert_eq!(&ids, want, "chunk {chunk}");
        }
        assert_eq!(s.pools_stats()[0].1.reserved, 0);
    }
    // The reference is not trivially constant.
    assert_ne!(want[0], vec![argmax(&[0.0]); n]);
}
