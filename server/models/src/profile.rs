//! The profile run: one worst-case step on the device before the KV pool is
//! sized, so the activation reserve is what the step really takes there
//! (vLLM's `profile_run`) rather than an estimate. Only devices whose
//! allocator reports a high-water mark can be profiled (CUDA's memory pool);
//! the CPU keeps the estimate.

use candle_core::Device;
use ferrox_core::batch_model::PrefillChunk;
use ferrox_core::{BatchModel, DecodeRow, Table};
use ferrox_plan::{CacheKind, KvDtype};

use crate::decoder::Decoder;
use crate::device::{Gpus, PoolReading};
use crate::error::Result;
use crate::paged::PagedModel;

/// The largest step the engine will run: a full prefill chunk beside a
/// decode row for every sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfileShape {
    /// Prompt tokens in the chunk (the server's `--prefill-chunk`).
    pub prefill_chunk: usize,
    /// Decode rows (the server's `--max-seqs`).
    pub max_seqs: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Speculating: draft tokens, which share the chunk's budget, each want
    /// their logits, so the chunk wants every token's (at least as many).
    pub speculative: bool,
}

impl ProfileShape {
    /// Blocks of the chunk's sequence (the first), then one per decode row.
    fn tables(&self) -> Vec<Vec<u32>> {
        let bs = self.block_size.max(1);
        let chunk_blocks = self.prefill_chunk.max(1).div_ceil(bs);
        let mut next = 0u32;
        let mut take = |n: usize| {
            let t: Vec<u32> = (next..next + n as u32).collect();
            next += n as u32;
            t
        };
        let mut tables = vec![take(chunk_blocks)];
        tables.extend((0..self.max_seqs).map(|_| take(1)));
        tables
    }

    /// Blocks the profile's temporary pool needs.
    pub fn blocks(&self) -> usize {
        self.tables().iter().map(Vec::len).sum()
    }
}

/// Runs the worst-case step of `shape` once on `model`: token 0 everywhere
/// (the values do not change what is allocated), logits wanted everywhere
/// they can be.
pub fn worst_step(model: &mut dyn BatchModel, shape: &ProfileShape) -> Result<()> {
    let tables = shape.tables();
    let prompt = vec![0u32; shape.prefill_chunk.max(1)];
    // Every attention pool holds the profile's blocks: each gets the same
    // tables; a state pool gives each row a slot of its own.
    let pools = model.cache_pools();
    let slots: Vec<[u32; 1]> = (0..tables.len() as u32).map(|i| [i]).collect();
    let per_row: Vec<Vec<Table<'_>>> = tables
        .iter()
        .zip(&slots)
        .map(|(t, slot)| {
            let table = |kind: CacheKind| Table {
                kind,
                blocks: if kind.holds_tokens() { t } else { slot },
            };
            pools.iter().map(|p| table(p.kind)).collect()
        })
        .collect();
    let chunk = PrefillChunk {
        tables: &per_row[0],
        tokens: &prompt,
        pos: 0,
        want_logits: true,
        all_logits: shape.speculative,
    };
    let rows: Vec<DecodeRow<'_>> = per_row[1..]
        .iter()
        .map(|tables| DecodeRow {
            token: 0,
            pos: 0,
            tables,
        })
        .collect();
    model.step(&[chunk], &rows)?;
    Ok(())
}

/// The activation bytes a step took between two readings: the pool's peak
/// above what was in use before, plus what grew outside the pool (cuBLAS
/// workspaces, made at the first matmul and kept).
pub fn activation_bytes(before: &PoolReading, after: &PoolReading) -> u64 {
    let pool_peak = after.pool_used_high.saturating_sub(before.pool_used);
    let device_growth = before.free_bytes.saturating_sub(after.free_bytes);
    let pool_growth = after.pool_reserved.saturating_sub(before.pool_reserved);
    pool_peak.saturating_add(device_growth.saturating_sub(pool_growth))
}

/// Profiles `decoder` on `device`: a temporary pool of the blocks `shape`
/// needs for each KV group, one worst-case step, and the activation bytes it
/// took; returns the decoder (the pools are gone) and that figure.
pub fn profile(
    decoder: Decoder,
    shape: &ProfileShape,
    kv_dtype: KvDtype,
    gpus: &dyn Gpus,
    device: &Device,
) -> Result<(Decoder, u64)> {
    let mut model = PagedModel::new(decoder, shape.blocks(), shape.block_size, kv_dtype)?;
    // One state slot for the prefill chunk and each decode row.
    model.set_state_slots(shape.max_seqs + 1)?;
    gpus.reset_peak(device)?;
    let before = gpus.reading(device)?;
    worst_step(&mut model, shape)?;
    let after = gpus.reading(device)?;
    Ok((model.into_decoder(), activation_bytes(&before, &after)))
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::device::GpuInfo;
    use crate::fixtures::{Tiny, random_weights, write_gguf};
    use crate::load::Source;
    use candle_core::quantized::GgmlDType;

    fn reading(free: u64, used: u64, high: u64, reserved: u64) -> PoolReading {
        PoolReading {
            free_bytes: free,
            pool_used: used,
            pool_used_high: high,
            pool_reserved: reserved,
        }
    }

    #[test]
    fn the_reserve_is_the_peak_plus_what_grew_outside_the_pool() {
        let before = reading(1000, 300, 300, 400);
        let cases = [
            // Nothing happened.
            (reading(1000, 300, 300, 400), 0),
            // 200 bytes peaked in the pool, which kept them reserved.
            (reading(800, 300, 500, 600), 200),
            // The same, the pool gave them back; 50 more outside it.
            (reading(950, 300, 500, 400), 250),
            // Readings that go backwards never wrap.
            (reading(2000, 100, 0, 0), 0),
        ];
        for (after, want) in cases {
            assert_eq!(activation_bytes(&before, &after), want, "{after:?}");
        }
    }

    #[test]
    fn the_shape_gives_each_row_its_own_blocks() {
        let s = ProfileShape {
            prefill_chunk: 33,
            max_seqs: 3,
            block_size: 16,
            speculative: false,
        };
        let t = s.tables();
        assert_eq!(t, vec![vec![0, 1, 2], vec![3], vec![4], vec![5]]);
        assert_eq!(s.blocks(), 6);
    }

    /// A device whose pool peaks by `grow` bytes during the step, counting
    /// how it was asked.
    struct Meter {
        grow: u64,
        calls: RefCell<Vec<&'static str>>,
    }

    impl Gpus for Meter {
        fn count(&self) -> std::result::Result<usize, String> {
            Ok(1)
        }
        fn open(&self, _: usize) -> Result<Device> {
            Ok(Device::Cpu)
        }
        fn info(&self, _: &Device) -> Result<GpuInfo> {
            unreachable!("the profile reads the pool, not the info")
        }
        fn reading(&self, _: &Device) -> Result<PoolReading> {
            let mut calls = self.calls.borrow_mut();
            calls.push("reading");
            let high = if calls.len() > 2 {
                100 + self.grow
            } else {
                100
            };
            Ok(reading(1 << 30, 100, high, 200))
        }
        fn reset_peak(&self, _: &Device) -> Result<()> {
            self.calls.borrow_mut().push("reset");
            Ok(())
        }
    }

    #[test]
    fn a_profile_runs_the_worst_step_and_hands_the_decoder_back() {
        let dir = tempfile::tempdir().unwrap();
        let t = Tiny::default();
        let path = dir.path().join("tiny.gguf");
        write_gguf(&path, &t, &random_weights(&t, 3), GgmlDType::F32);
        let llama = Source::open(&path).unwrap().decoder(&Device::Cpu).unwrap();
        let meter = Meter {
            grow: 4096,
            calls: RefCell::default(),
        };
        let shape = ProfileShape {
            prefill_chunk: 40,
            max_seqs: 5,
            block_size: 16,
            speculative: false,
        };
        let (llama, bytes) = profile(llama, &shape, KvDtype::F16, &meter, &Device::Cpu).unwrap();
        assert_eq!(bytes, 4096);
        assert_eq!(*meter.calls.borrow(), ["reset", "reading", "reading"]);
        // The decoder still serves: the real pool is made after the profile.
        let mut model = PagedModel::new(llama, 4, 16, KvDtype::F16).unwrap();
        let logits = model
            .prefill(
                &[Table {
                    kind: CacheKind::Full,
                    blocks: &[0],
                }],
                &[1, 2, 3],
                0,
                true,
            )
            .unwrap()
            .unwrap();
        assert_eq!(logits.len(), t.vocab);
    }
}
