//! Raw engine throughput on a model file: batched decode at several row
//! counts (each row at a 128-token context) and prefill of a 512-token prompt.
//!
//! `RAYON_NUM_THREADS=2 cargo run --release -p ferrox-models --example engine_bench -- MODEL.gguf [ROWS,..] [PREFILL_LEN] [STEPS]`
//! (a prefill length of 0 skips prefill; few steps suit `valgrind --tool=callgrind`).
//! (`KV_DTYPE=f32` for an f32 KV cache; the default is f16, the server's;
//! `CONTEXT=N` starts the decode rows at N tokens instead of 128;
//! `LORA=DIR,DIR,..` gives the rows those adapters in turn and times each
//! row count with and without them, alternating, three times).

use std::time::Instant;

use std::sync::Arc;

use ferrox_core::{AdapterRef, BatchModel, BlockLease, BlockPool, DecodeRow, Table};
use ferrox_models::lora::{self, LoraShapes};
use ferrox_models::{Device, PagedModel, Source};

/// Context each decode row starts at (`CONTEXT=16` keeps callgrind runs short).
const CONTEXT: usize = 128;
const BLOCK: usize = 16;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: engine_bench MODEL [ROWS,...]")?;
    let rows: Vec<usize> = match std::env::args().nth(2) {
        Some(list) => list.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => vec![1, 4, 16, 32, 64],
    };
    let arg = |i: usize, default: usize| -> Result<usize, Box<dyn std::error::Error>> {
        Ok(std::env::args()
            .nth(i)
            .map(|a| a.parse())
            .transpose()?
            .unwrap_or(default))
    };
    let (prefill_len, steps) = (arg(3, 512)?, arg(4, 32)?);
    let context: usize = match std::env::var("CONTEXT") {
        Ok(c) => c.parse()?,
        Err(_) => CONTEXT,
    };
    let decoder = Source::open(path.as_ref())?.decoder(&Device::Cpu)?;
    let vocab = decoder.spec().vocab as u32;
    let shapes = LoraShapes::of(decoder.spec());
    let adapters: Vec<AdapterRef> = std::env::var("LORA")
        .unwrap_or_default()
        .split(',')
        .filter(|d| !d.is_empty())
        .enumerate()
        .map(|(i, dir)| {
            let name = format!("a{i}");
            let a = lora::load(&name, dir.as_ref(), &shapes, 64)?;
            Ok(AdapterRef::new(&name, &a.cache_key(), Arc::new(a)))
        })
        .collect::<Result<_, ferrox_models::Error>>()?;
    let max_rows = *rows.iter().max().unwrap_or(&1);
    let per_seq = (context + steps)
        .div_ceil(BLOCK)
        .max(prefill_len / BLOCK + 1);
    let blocks = per_seq * max_rows;
    let kv: ferrox_plan::KvDtype = std::env::var("KV_DTYPE")
        .unwrap_or_else(|_| "f16".into())
        .parse()?;
    let mut model = PagedModel::new(decoder, blocks, BLOCK, kv)?;
    let pool = BlockPool::new(blocks);
    let prompt = |seed: usize, n: usize| -> Vec<u32> {
        (0..n)
            .map(|i| ((i * 7919 + seed * 104_729) as u32 % (vocab - 1)) + 1)
            .collect()
    };

    // Prefill: one prompt, one chunk.
    if prefill_len > 0 {
        let lease = pool.allocate(prefill_len.div_ceil(BLOCK))?;
        let p = prompt(0, prefill_len);
        model.prefill(&full(&lease), &p[..16.min(prefill_len)], 0, true)?; // warm-up
        let t = Instant::now();
        model.prefill(&full(&lease), &p, 0, true)?;
        let secs = t.elapsed().as_secs_f64();
        println!(
            "prefill {prefill_len} tokens: {:.3} s = {:.1} tok/s",
            secs,
            prefill_len as f64 / secs
        );
    }

    for &n in &rows {
        let leases: Vec<_> = (0..n)
            .map(|_| pool.allocate(per_seq))
            .collect::<Result<_, _>>()?;
        for (i, l) in leases.iter().enumerate() {
            model.prefill(&full(l), &prompt(i + 1, context), 0, true)?;
        }
        let with: Vec<Option<AdapterRef>> = (0..n)
            .map(|i| adapters.get(i % adapters.len().max(1)).cloned())
            .collect();
        let runs: Vec<(&str, &[Option<AdapterRef>])> = if adapters.is_empty() {
            vec![("", &[])]
        } else {
            [("base ", &[][..]), ("lora ", &with[..])].repeat(3)
        };
        for (label, rows_adapters) in runs {
            let mut tokens: Vec<u32> = (0..n as u32).map(|i| i + 2).collect();
            let t = Instant::now();
            for step in 0..steps {
                let tables: Vec<[Table<'_>; 1]> = leases.iter().map(full).collect();
                let batch: Vec<DecodeRow<'_>> = tables
                    .iter()
                    .zip(&tokens)
                    .map(|(tables, &token)| DecodeRow {
                        token,
                        pos: context + step,
                        tables,
                    })
                    .collect();
                let logits = model.step_with_adapters(&[], &batch, rows_adapters)?.decode;
                for (tok, row) in tokens.iter_mut().zip(&logits) {
                    *tok = argmax(row);
                }
            }
            let secs = t.elapsed().as_secs_f64();
            println!(
                "{label}decode rows={n:>3}: {:.1} tok/s aggregate, {:.1} ms/step",
                (n * steps) as f64 / secs,
                secs * 1e3 / steps as f64
            );
        }
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    if let Some(line) = status.lines().find(|l| l.starts_with("VmHWM")) {
        println!("peak RSS: {}", line.trim_start_matches("VmHWM:").trim());
    }
    Ok(())
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// A sequence's one table, in the full-attention pool (the models this
/// bench runs keep no other kind of cache).
fn full(lease: &BlockLease) -> [Table<'_>; 1] {
    [Table {
        kind: ferrox_plan::CacheKind::Full,
        blocks: lease.blocks(),
    }]
}
