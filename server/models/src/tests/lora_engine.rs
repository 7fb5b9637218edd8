//! LoRA through the engine's worker on real numerics: `--max-loras` caps
//! the distinct adapters running while admission stays strictly FIFO, every
//! request completes with the tokens it gets alone, and the prefix cache
//! never shares blocks across adapters.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::Device;
use candle_core::quantized::GgmlDType;
use ferrox_core::{AdapterRef, BatchModel};
use ferrox_engine::{
    EngineConfig, EngineHandle, Event, GenerationRequest, Metrics, SamplingParams, Scheduler,
    TokenText,
};
use ferrox_plan::KvDtype;

use crate::fixtures::{Tiny, random_weights, write_gguf};
use crate::lora::fixtures::{LoraSpec, random_peft, shapes, write_peft};
use crate::{PagedModel, Source, lora};

struct NoText;

impl TokenText for NoText {
    fn push(&mut self, _id: u32) -> String {
        String::new()
    }

    fn fresh(&self) -> Box<dyn TokenText> {
        Box::new(NoText)
    }
}

fn request(id: &str, prompt: &[u32], n: usize, adapter: Option<&AdapterRef>) -> GenerationRequest {
    GenerationRequest {
        prompt: prompt.to_vec(),
        max_tokens: n,
        sampling: SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        stop: Vec::new(),
        include_stop_str: false,
        min_tokens: 0,
        cache_salt: None,
        request_id: Some(id.to_string()),
        stop_token_ids: Vec::new(),
        eos_token_ids: Vec::new(),
        ignore_eos: true,
        text: Box::new(NoText),
        constraint: None,
        adapter: adapter.cloned(),
    }
}

fn engine(path: &Path, max_loras: usize) -> (Scheduler<PagedModel>, EngineHandle, Arc<Metrics>) {
    let llama = Source::open(path).unwrap().decoder(&Device::Cpu).unwrap();
    let model = PagedModel::new(llama, 64, 4, KvDtype::F32).unwrap();
    let config = EngineConfig {
        max_seqs: 8,
        max_queue: 16,
        prefill_chunk: 64,
        max_model_len: 128,
        block_size: 4,
        pools: model.cache_pools(),
        decode_log_interval: 0,
        prefix_caching: true,
        cache_salt: "lora".into(),
        max_loras,
        speculative: None,
        max_batch_tokens: 16384,
        kv_offload: Vec::new(),
    };
    let metrics = Arc::new(Metrics::new().unwrap());
    metrics.enable_lora(max_loras);
    let (s, h) = Scheduler::new(model, config, Arc::clone(&metrics), Instant::now()).unwrap();
    (s, h, metrics)
}

/// The running adapters `vllm:lora_requests_info` names now.
fn running_adapters(m: &Metrics) -> usize {
    let text = m.render("m");
    let line = text
        .lines()
        .find(|l| l.starts_with("vllm:lora_requests_info{"))
        .unwrap();
    let label = line.split("running_lora_adapters=\"").nth(1).unwrap();
    let names = &label[..label.find('"').unwrap()];
    names.split(',').filter(|n| !n.is_empty()).count()
}

/// What one run saw.
struct Run {
    /// Each tick's admissions (request ids), ticks that admitted nothing left out.
    admitted: Vec<Vec<String>>,
    /// The prompt tokens the cache supplied at each of those ticks.
    cached: Vec<usize>,
    tokens: Vec<Vec<u32>>,
}

fn run(path: &Path, max_loras: usize, reqs: Vec<GenerationRequest>) -> Run {
    let (mut s, h, metrics) = engine(path, max_loras);
    let mut now = Instant::now();
    let mut subs: Vec<_> = reqs
        .into_iter()
        .map(|r| h.submit(r, now).unwrap())
        .collect();
    let (mut admitted, mut cached) = (Vec::new(), Vec::new());
    // The jobs reach the worker's line on its first tick.
    for tick in 0.. {
        if tick > 0 && s.is_idle() {
            break;
        }
        now += Duration::from_millis(1);
        let report = s.tick(now);
        if report.admitted.new_seqs > 0 {
            admitted.push(report.admitted.ids.clone());
            cached.push(report.admitted.cached_tokens);
        }
        assert!(
            running_adapters(&metrics) <= max_loras,
            "more than --max-loras ran"
        );
    }
    let tokens = subs
        .iter_mut()
        .map(|sub| {
            let mut ids = Vec::new();
            while let Some(e) = sub.try_next() {
                match e {
                    Event::Token { id, .. } => ids.push(id),
                    Event::Error(e) => panic!("{e}"),
                    _ => {}
                }
            }
            ids
        })
        .collect();
    Run {
        admitted,
        cached,
        tokens,
    }
}

#[test]
fn max_loras_two_with_three_adapters_queued_admits_in_fifo_order_and_completes_all() {
    let t = Tiny::default();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q8.gguf");
    write_gguf(&path, &t, &random_weights(&t, 12), GgmlDType::Q8_0);
    let ads: Vec<AdapterRef> = ["a", "b", "c"]
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let spec = LoraSpec::all(4, 40 + i as u64);
            let p = dir.path().join(name);
            write_peft(&p, &spec, &random_peft(&t, &spec));
            let a = lora::load(name, &p, &shapes(&t), 16).unwrap();
            AdapterRef::new(name, &a.cache_key(), Arc::new(a))
        })
        .collect();
    let prompt: Vec<u32> = (0..13).map(|i| (i * 7 + 3) % 96).collect();
    // (id, adapter, max_tokens): a ends first, b runs on.
    let asks: [(&str, Option<&AdapterRef>, usize); 5] = [
        ("r0-a", Some(&ads[0]), 2),
        ("r1-b", Some(&ads[1]), 12),
        ("r2-c", Some(&ads[2]), 4),
        ("r3-base", None, 4),
        ("r4-a", Some(&ads[0]), 4),
    ];
    let reqs = asks
        .iter()
        .map(|(id, a, n)| request(id, &prompt, *n, *a))
        .collect();
    let together = run(&path, 2, reqs);
    let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // a and b run; c waits, and the base request and a behind it too.
    // When a ends, c and the base request go in; the second a waits for
    // a slot (b and c run) until b ends.
    assert_eq!(
        together.admitted,
        [
            ids(&["r0-a", "r1-b"]),
            ids(&["r2-c", "r3-base"]),
            ids(&["r4-a"])
        ]
    );
    // The same prompt through c or the base shares none of a's blocks;
    // the second a takes a's cached ones.
    assert_eq!(together.cached[1], 0);
    assert!(together.cached[2] >= 8, "{:?}", together.cached);
    for (i, (id, a, n)) in asks.iter().enumerate() {
        let alone = run(&path, 2, vec![request(id, &prompt, *n, *a)]);
        assert_eq!(together.tokens[i], alone.tokens[0], "{id}");
        assert_eq!(together.tokens[i].len(), *n);
    }
    assert_ne!(
        together.tokens[2],
        together.tokens[3][..4],
        "c changed nothing"
    );
}
