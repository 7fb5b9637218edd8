//! The tiers' stores and their threads: bit-exact round trips, damage found
//! on read, a directory reused by a later process, and a writer that never
//! holds up the worker.

use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferrox_core::{BlockHash, BlockHasher};
use ferrox_plan::{KvTier, OffloadTier};

use super::disk_store::DiskStore;
use super::*;
use crate::fixtures::eventually;
use crate::metrics::Metrics;

fn hashes(n: usize) -> Vec<BlockHash> {
    let tokens: Vec<u32> = (0..n as u32 * 4).collect();
    BlockHasher::new("tier", 4).chain(&tokens)
}

fn payload(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 31 + j * 7) as u8).collect()
}

fn block_file(dir: &std::path::Path, h: &BlockHash) -> std::path::PathBuf {
    let name = h.to_string();
    dir.join(&name[..2]).join(format!("{name}.kvb"))
}

#[test]
fn disk_copies_read_back_whole_and_any_damage_is_a_miss() {
    let dir = tempfile::tempdir().unwrap();
    let store = DiskStore::open(dir.path(), 1 << 20).unwrap();
    let hs = hashes(6);
    for (i, h) in hs.iter().enumerate() {
        store.put(h, &payload(i, 1000)).unwrap();
        assert_eq!(store.get(h).unwrap(), payload(i, 1000));
    }
    type Damage = fn(&std::path::Path, &std::path::Path);
    let damages: [(&str, Damage); 5] = [
        ("truncated", |f, _| {
            let len = std::fs::metadata(f).unwrap().len();
            std::fs::OpenOptions::new()
                .write(true)
                .open(f)
                .unwrap()
                .set_len(len - 10)
                .unwrap();
        }),
        ("a byte flipped", |f, _| {
            let mut d = std::fs::read(f).unwrap();
            d[700] ^= 0x40;
            std::fs::write(f, d).unwrap();
        }),
        ("deleted", |f, _| std::fs::remove_file(f).unwrap()),
        ("another block's file", |f, other| {
            std::fs::copy(other, f).unwrap();
        }),
        ("torn before its header", |f, _| {
            std::fs::write(f, b"FXKV").unwrap()
        }),
    ];
    for (i, (what, damage)) in damages.into_iter().enumerate() {
        damage(
            &block_file(dir.path(), &hs[i]),
            &block_file(dir.path(), &hs[5]),
        );
        assert!(
            matches!(store.get(&hs[i]), Err(store::Miss::Corrupt(_))),
            "{what}"
        );
    }
    assert_eq!(store.get(&hs[5]).unwrap(), payload(5, 1000));
    // A later process lists what is left (the deleted one is gone).
    let again = DiskStore::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(again.scan().len(), 5);
    // Refused at start, with the reason.
    let err = DiskStore::open(dir.path(), u64::MAX).unwrap_err();
    assert!(
        err.to_string().contains("larger than its file system"),
        "{err}"
    );
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let err = DiskStore::open(&file.join("kv"), 1 << 20).unwrap_err();
    assert!(err.to_string().contains("cannot create it"), "{err}");
}

fn offload(tiers: &[OffloadTier], len: usize) -> (Offload, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new().unwrap());
    let o = Offload::open(tiers, len, 7, Arc::clone(&metrics)).unwrap();
    (o, metrics)
}

fn load_all(o: &mut Offload, hs: &[BlockHash]) -> Vec<Vec<u8>> {
    o.load(1, hs.to_vec());
    let done = o.finished(Some(Duration::from_secs(10)));
    assert_eq!(done.len(), 1);
    done.into_iter().next().unwrap().blocks
}

#[test]
fn blocks_go_through_each_tier_and_back_bit_exact_while_others_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let disk = OffloadTier::Disk {
        path: dir.path().display().to_string(),
        bytes: 1 << 20,
    };
    let host = OffloadTier::Host { bytes: 1 << 20 };
    for tiers in [vec![host.clone()], vec![disk.clone()], vec![host, disk]] {
        let (mut o, _) = offload(&tiers, 4096);
        let hs = hashes(40);
        for (i, h) in hs.iter().enumerate().take(20) {
            o.offer(*h, payload(i, 4096));
        }
        eventually("written", || o.run(&hs[..20]) == 20);
        // Reads of the first 20 while the next 20 are written.
        for (i, h) in hs.iter().enumerate().skip(20) {
            o.offer(*h, payload(i, 4096));
        }
        let back = load_all(&mut o, &hs[..20]);
        assert_eq!(
            back,
            (0..20).map(|i| payload(i, 4096)).collect::<Vec<_>>(),
            "{tiers:?}"
        );
        eventually("written", || o.run(&hs) == 40);
        assert_eq!(load_all(&mut o, &hs[20..]).len(), 20);
    }
}

#[test]
fn a_tier_evicts_least_recently_used_and_its_router_log_says_so() {
    let (o, _) = offload(&[OffloadTier::Host { bytes: 3 * 100 }], 100);
    let hs = hashes(4);
    for (i, h) in hs.iter().enumerate() {
        o.offer(*h, payload(i, 100));
        eventually("written", || o.run(&hs[i..=i]) == 1);
    }
    assert_eq!(o.run(&hs), 0, "the first block went first");
    assert_eq!(o.run(&hs[1..]), 3);
    let page = o.tiers()[0].page(0, 7);
    assert_eq!(page.stored.len(), 3);
    assert_eq!(page.evicted, [hs[0]]);
    assert_eq!(o.tiers()[0].blocks(), (3, 3));
}

#[test]
fn a_damaged_copy_is_a_miss_counted_and_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let disk = OffloadTier::Disk {
        path: dir.path().display().to_string(),
        bytes: 1 << 20,
    };
    let (mut o, metrics) = offload(&[disk], 256);
    let hs = hashes(3);
    for (i, h) in hs.iter().enumerate() {
        o.offer(*h, payload(i, 256));
    }
    eventually("written", || o.run(&hs) == 3);
    let f = block_file(dir.path(), &hs[1]);
    let mut d = std::fs::read(&f).unwrap();
    d[100] ^= 1;
    std::fs::write(&f, d).unwrap();
    // The run stops before the damaged block: one whole block back.
    assert_eq!(load_all(&mut o, &hs), [payload(0, 256)]);
    assert_eq!(o.run(&hs), 1);
    let text = metrics.render("m");
    assert!(
        text.contains("ferrox_kv_tier_corrupt_total{tier=\"disk\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("ferrox_kv_tier_hits_total{tier=\"disk\"} 1"),
        "{text}"
    );
    // A later process on the same directory serves the whole ones.
    drop(o);
    let (o, _) = offload(
        &[OffloadTier::Disk {
            path: dir.path().display().to_string(),
            bytes: 1 << 20,
        }],
        256,
    );
    assert_eq!(o.run(&hs[..1]), 1);
    assert_eq!(o.run(&hs[2..]), 1);
    // One of another geometry is never indexed.
    let (o, _) = offload(
        &[OffloadTier::Disk {
            path: dir.path().display().to_string(),
            bytes: 1 << 20,
        }],
        512,
    );
    assert_eq!(o.run(&hs), 0);
}

/// A store whose writes wait for a gate.
struct Gated {
    gate: Mutex<Receiver<()>>,
    inner: HostStore,
}

impl BlockStore for Gated {
    fn put(&self, hash: &BlockHash, bytes: &[u8]) -> std::io::Result<()> {
        let _ = self
            .gate
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(30));
        self.inner.put(hash, bytes)
    }
    fn get(&self, hash: &BlockHash) -> Result<Vec<u8>, Miss> {
        self.inner.get(hash)
    }
    fn delete(&self, hash: &BlockHash) {
        self.inner.delete(hash)
    }
}

#[test]
fn offers_never_wait_for_a_slow_tier() {
    let (open, gate) = channel();
    let store = Gated {
        gate: Mutex::new(gate),
        inner: HostStore::default(),
    };
    let metrics = Arc::new(Metrics::new().unwrap());
    let o = Offload::with_stores(
        vec![(KvTier::Host, Box::new(store), 1 << 20)],
        64,
        1,
        metrics,
    );
    let hs = hashes(50);
    // Every offer returns while the tier has written nothing.
    for (i, h) in hs.iter().enumerate() {
        o.offer(*h, payload(i, 64));
    }
    assert_eq!(o.run(&hs), 0);
    assert!(hs.iter().all(|h| o.holds(h)), "queued copies count as held");
    for _ in &hs {
        open.send(()).unwrap();
    }
    eventually("written once the tier catches up", || o.run(&hs) == 50);
}

#[test]
fn reads_under_eviction_give_whole_blocks_or_stop() {
    // A tier of 8 blocks, written 200 while runs of the newest are read:
    // every block read back is its own bytes; a run stops at one evicted.
    let dir = tempfile::tempdir().unwrap();
    let tiers = [
        OffloadTier::Host { bytes: 8 * 512 },
        OffloadTier::Disk {
            path: dir.path().display().to_string(),
            bytes: 8 * (512 + 52),
        },
    ];
    let (mut o, _) = offload(&tiers, 512);
    let hs = hashes(200);
    let index: std::collections::HashMap<BlockHash, usize> =
        hs.iter().enumerate().map(|(i, h)| (*h, i)).collect();
    let mut read = 0;
    for (i, h) in hs.iter().enumerate() {
        o.offer(*h, payload(i, 512));
        if i % 10 == 9 {
            let from = i - 5;
            // Its first block written; the writer goes on with the rest.
            eventually("written", || o.run(&hs[from..=from]) == 1);
            let wanted = &hs[from..=i];
            o.load(1, wanted.to_vec());
            let done = o.finished(Some(Duration::from_secs(10)));
            for (k, bytes) in done[0].blocks.iter().enumerate() {
                assert_eq!(
                    *bytes,
                    payload(index[&wanted[k]], 512),
                    "block {}",
                    from + k
                );
            }
            read += done[0].blocks.len();
        }
    }
    assert!(read >= 20, "each read found its first block: {read}");
    eventually("the newest written", || o.run(&hs[199..]) == 1);
    for t in o.tiers() {
        assert!(t.blocks().0 <= 8, "{:?} holds {:?}", t.kind, t.blocks());
    }
}

#[test]
fn servers_sharing_a_disk_tier_take_each_other_s_new_copies() {
    let dir = tempfile::tempdir().unwrap();
    let disk = [OffloadTier::Disk {
        path: dir.path().display().to_string(),
        bytes: 1 << 20,
    }];
    // Two servers on one directory, both started before any copy.
    let (a, _) = offload(&disk, 4096);
    let (mut b, _) = offload(&disk, 4096);
    b.rescan_every(Duration::from_millis(20));
    let hs = hashes(3);
    for (i, h) in hs.iter().enumerate() {
        a.offer(*h, payload(i, 4096));
    }
    eventually("written by a", || a.run(&hs) == 3);
    // b lists the directory again and reads a's copies as its own.
    eventually("taken by b", || b.run(&hs) == 3);
    assert_eq!(
        load_all(&mut b, &hs),
        (0..3).map(|i| payload(i, 4096)).collect::<Vec<_>>()
    );
    // A temporary file a live writer may still be renaming is left alone.
    let tmp = dir.path().join("tmp").join("in-flight");
    std::fs::write(&tmp, b"partial").unwrap();
    let old = dir.path().join("tmp").join("abandoned");
    let file = std::fs::File::create(&old).unwrap();
    let long_ago = std::time::SystemTime::now() - Duration::from_secs(120);
    file.set_modified(long_ago).unwrap();
    let (_c, _) = offload(&disk, 4096);
    assert!(tmp.exists());
    assert!(!old.exists(), "a dead writer's file is removed");
}
