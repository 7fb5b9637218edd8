//! Corrupt GGUF files: any byte mutation of a header (metadata, tensor
//! infos, counts, dimensions, offsets) gives a model or a clean error from
//! the loader, never a panic or an allocation the file cannot back.

use std::path::Path;

use candle_core::Device;
use candle_core::quantized::GgmlDType;
use candle_core::quantized::gguf_file::Content;
use ferrox_core::batch_model::check_input;
use ferrox_core::{BatchModel, DecodeRow};
use proptest::prelude::*;

use crate::fixtures::{Tiny, default_model, random_weights, write_gguf};
use crate::{PagedModel, Source};

/// A change to a header: a byte, or a little-endian number laid over a spot
/// (where counts, lengths, dimensions and offsets live).
#[derive(Debug, Clone)]
enum Mutation {
    Byte(usize, u8),
    U32(usize, u32),
    U64(usize, u64),
}

fn number() -> impl Strategy<Value = u64> {
    prop_oneof![
        any::<u64>(),
        prop::sample::select(vec![
            0,
            1,
            2,
            3,
            u64::from(u32::MAX),
            u64::MAX,
            1 << 31,
            1 << 32,
            1 << 40,
            1 << 62,
        ]),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Byte(i, b)),
        1 => (any::<usize>(), number()).prop_map(|(i, v)| Mutation::U32(i, v as u32)),
        1 => (any::<usize>(), number()).prop_map(|(i, v)| Mutation::U64(i, v)),
    ]
}

/// Applies `m` within the first `header` bytes.
fn apply(bytes: &mut [u8], header: usize, m: &Mutation) {
    let mut put = |at: usize, v: &[u8]| {
        let at = at % header.saturating_sub(v.len()).max(1);
        bytes[at..at + v.len()].copy_from_slice(v);
    };
    match *m {
        Mutation::Byte(i, b) => put(i, &[b]),
        Mutation::U32(i, v) => put(i, &v.to_le_bytes()),
        Mutation::U64(i, v) => put(i, &v.to_le_bytes()),
    }
}

/// Bytes before the tensor data.
fn header_len(path: &Path) -> usize {
    let mut f = std::fs::File::open(path).unwrap();
    let content = Content::read(&mut f).unwrap();
    content.tensor_data_offset as usize
}

/// Everything the server does with a model file; each step may fail, none
/// may panic.
fn load(path: &Path) {
    let Ok(mut source) = Source::open(path) else {
        return;
    };
    let _ = source.info();
    let _ = source.text();
    let Ok(llama) = source.decoder(&Device::Cpu) else {
        return;
    };
    let Ok(mut model) = PagedModel::new(llama, 4, 4, ferrox_plan::KvDtype::F16) else {
        return;
    };
    let (vocab, bs) = (model.vocab_size(), model.block_size());
    let tables = [ferrox_core::Table {
        kind: ferrox_plan::CacheKind::Full,
        blocks: &[0],
    }];
    let row = DecodeRow {
        token: 1,
        pos: 0,
        tables: &tables,
    };
    let pools = model.cache_pools();
    if check_input(vocab, bs, &pools, row.tables, &[row.token], row.pos).is_ok() {
        let _ = model.decode(&[row]);
    }
}

/// A tiny model file of each weight type the loader packs or dequantizes.
fn tiny_files(dir: &Path) -> Vec<(std::path::PathBuf, Vec<u8>, usize)> {
    let t = Tiny::default();
    let w = random_weights(&t, 3);
    [GgmlDType::F32, GgmlDType::Q4_0, GgmlDType::Q8_0]
        .into_iter()
        .map(|ty| {
            let path = dir.join(format!("tiny-{ty:?}.gguf"));
            write_gguf(&path, &t, &w, ty);
            let bytes = std::fs::read(&path).unwrap();
            let header = header_len(&path);
            (path, bytes, header)
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 300,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_mutated_tiny_gguf_loads_or_fails_cleanly(
        which in 0usize..3,
        mutations in prop::collection::vec(mutation(), 1..5),
    ) {
        thread_local! {
            static FILES: (tempfile::TempDir, Vec<(std::path::PathBuf, Vec<u8>, usize)>) = {
                let dir = tempfile::tempdir().unwrap();
                let files = tiny_files(dir.path());
                (dir, files)
            };
        }
        FILES.with(|(dir, files)| {
            let (_, original, header) = &files[which];
            let mut bytes = original.clone();
            for m in &mutations {
                apply(&mut bytes, *header, m);
            }
            let path = dir.path().join("mutated.gguf");
            std::fs::write(&path, &bytes).unwrap();
            load(&path);
        });
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 40,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// The real model's header (its whole vocabulary and chat template),
    /// mutated and cut off where the tensor data begins.
    #[test]
    fn a_mutated_real_gguf_header_loads_or_fails_cleanly(
        mutations in prop::collection::vec(mutation(), 1..5),
    ) {
        thread_local! {
            static HEADER: Option<(tempfile::TempDir, Vec<u8>)> = default_model().map(|p| {
                let n = header_len(&p);
                let mut bytes = std::fs::read(&p).unwrap();
                bytes.truncate(n);
                (tempfile::tempdir().unwrap(), bytes)
            });
        }
        HEADER.with(|h| {
            let Some((dir, original)) = h else {
                return;
            };
            let mut bytes = original.clone();
            let header = bytes.len();
            for m in &mutations {
                apply(&mut bytes, header, m);
            }
            let path = dir.path().join("mutated.gguf");
            std::fs::write(&path, &bytes).unwrap();
            load(&path);
        });
    }
}
