//! The lower KV tiers as the worker uses them: every full block the prefix
//! cache registers is copied out once and written through to each tier by a
//! writer thread (so the step never waits on a write, and a tier already
//! holds a block when the device pool evicts it, or the process ends); a
//! prompt's blocks past its device-cached run are read back by a reader
//! thread while other rows step, and handed to the worker to copy in.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use ferrox_core::{BlockHash, KvEventsPage};
use ferrox_plan::{KvTier, OffloadTier};

use super::disk_store::DiskStore;
use super::index::TierIndex;
use super::store::{BlockStore, Found, HostStore, Miss};
use crate::EngineError;
use crate::job::RequestId;
use crate::metrics::Metrics;

/// Bytes of copies waiting for the writer past which new ones are dropped
/// (counted as not written): memory stays bounded when a tier is slower
/// than the prefill.
const MAX_QUEUED_BYTES: u64 = 256 << 20;
/// How often the writer lists a store again for copies other servers
/// sharing it wrote (a disk directory on a shared claim).
const RESCAN: Duration = Duration::from_secs(10);

/// One lower tier: its index and its bytes.
pub struct Tier {
    /// Which tier.
    pub kind: KvTier,
    index: Mutex<TierIndex>,
    store: Box<dyn BlockStore>,
    /// Bytes one block takes in the store.
    stored: u64,
}

impl Tier {
    fn index(&self) -> MutexGuard<'_, TierIndex> {
        self.index.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The tier's stored and evicted hashes since `since`, for a router.
    pub fn page(&self, since: u64, epoch: u64) -> KvEventsPage {
        self.index().page(since, epoch)
    }

    /// Blocks held, and the most the tier holds.
    pub fn blocks(&self) -> (usize, usize) {
        let index = self.index();
        let most = index.bytes().1 / self.stored.max(1);
        (index.blocks(), usize::try_from(most).unwrap_or(usize::MAX))
    }

    /// Takes into the index the copies in `found` (oldest first, so the
    /// newest are kept) that it does not hold: an earlier process's, or
    /// another server's sharing the store. A copy of another geometry is
    /// left alone and never read.
    fn adopt(&self, found: &[Found]) {
        let new = found.iter().filter(|f| f.bytes == self.stored);
        for f in new.filter(|f| !self.index().contains(&f.hash)) {
            self.kept(f.hash);
        }
    }

    /// Records that the store kept `hash`; deletes what that evicted.
    fn kept(&self, hash: BlockHash) {
        let evicted = self.index().insert(hash, self.stored);
        for old in evicted {
            self.store.delete(&old);
        }
    }
}

/// A request's blocks read back: the leading run found whole.
pub(crate) struct Loaded {
    pub row: RequestId,
    pub blocks: Vec<Vec<u8>>,
}

/// The tiers, their writer and reader threads.
pub(crate) struct Offload {
    tiers: Arc<[Arc<Tier>]>,
    /// The writer's rescan period, in milliseconds (tests shorten it).
    #[cfg(test)]
    rescan_ms: Arc<AtomicU64>,
    writes: Sender<(BlockHash, Vec<u8>)>,
    queued: Arc<AtomicU64>,
    /// Hashes queued or being written.
    writing: Arc<Mutex<HashSet<BlockHash>>>,
    reads: Sender<(RequestId, Vec<BlockHash>)>,
    loaded: Receiver<Loaded>,
    loading: usize,
}

impl Offload {
    /// The tiers `asked` for, for blocks of `payload` bytes, logging as
    /// pool `epoch`; the disk tier lists what its directory already holds.
    /// A tier that cannot be served is refused with the reason.
    pub fn open(
        asked: &[OffloadTier],
        payload: usize,
        epoch: u64,
        metrics: Arc<Metrics>,
    ) -> Result<Self, EngineError> {
        let mut stores: Vec<(KvTier, Box<dyn BlockStore>, u64)> = Vec::new();
        let mut found = Vec::new();
        for t in asked {
            match t {
                OffloadTier::Host { bytes } => {
                    stores.push((KvTier::Host, Box::new(HostStore::default()), *bytes))
                }
                OffloadTier::Disk { path, bytes } => {
                    let disk = DiskStore::open(std::path::Path::new(path), *bytes)?;
                    disk.clean();
                    found = disk.scan();
                    stores.push((KvTier::Disk, Box::new(disk), *bytes));
                }
            }
        }
        stores.sort_by_key(|(k, ..)| *k);
        let offload = Offload::with_stores(stores, payload, epoch, metrics);
        if let Some(disk) = offload.tiers.iter().find(|t| t.kind == KvTier::Disk) {
            disk.adopt(&found);
            tracing::info!(
                blocks = disk.blocks().0,
                "the disk KV tier holds blocks of an earlier process"
            );
        }
        Ok(offload)
    }

    /// Tiers over `stores` (`(tier, store, bytes)`, highest tier first).
    pub fn with_stores(
        stores: Vec<(KvTier, Box<dyn BlockStore>, u64)>,
        payload: usize,
        epoch: u64,
        metrics: Arc<Metrics>,
    ) -> Self {
        let tiers: Arc<[Arc<Tier>]> = stores
            .into_iter()
            .map(|(kind, store, bytes)| {
                let stored = store.stored_bytes(payload);
                Arc::new(Tier {
                    kind,
                    index: Mutex::new(TierIndex::new(bytes, epoch)),
                    store,
                    stored,
                })
            })
            .collect();
        let (writes, write_rx) = channel();
        let (reads, read_rx) = channel();
        let (loaded_tx, loaded) = channel();
        let queued = Arc::new(AtomicU64::new(0));
        let writing = Arc::new(Mutex::new(HashSet::new()));
        let rescan_ms = Arc::new(AtomicU64::new(RESCAN.as_millis() as u64));
        let writer = Writer {
            tiers: Arc::clone(&tiers),
            rescan_ms: Arc::clone(&rescan_ms),
            queued: Arc::clone(&queued),
            writing: Arc::clone(&writing),
            metrics: Arc::clone(&metrics),
        };
        let reader = Reader {
            tiers: Arc::clone(&tiers),
            payload,
            metrics,
        };
        // Threads end when the worker drops its senders.
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            if let Err(e) = std::thread::Builder::new().name(name.into()).spawn(f) {
                tracing::error!(error = %e, "cannot start the KV tier's {name} thread");
            }
        };
        spawn("ferrox-kv-write", Box::new(move || writer.run(write_rx)));
        spawn(
            "ferrox-kv-read",
            Box::new(move || reader.run(read_rx, loaded_tx)),
        );
        Offload {
            tiers,
            #[cfg(test)]
            rescan_ms,
            writes,
            queued,
            writing,
            reads,
            loaded,
            loading: 0,
        }
    }

    /// Lists the stores again for others' copies every `period` (tests).
    #[cfg(test)]
    pub fn rescan_every(&self, period: Duration) {
        let ms = u64::try_from(period.as_millis()).unwrap_or(u64::MAX).max(1);
        self.rescan_ms.store(ms, Ordering::Relaxed);
    }

    /// Bytes of copies waiting for the writer (a drain waits for 0).
    pub fn queued(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.queued)
    }

    /// The tiers, highest first.
    pub fn tiers(&self) -> Vec<Arc<Tier>> {
        self.tiers.to_vec()
    }

    /// Whether `hash` is held, or being written, in every tier (nothing to
    /// copy out).
    pub fn holds(&self, hash: &BlockHash) -> bool {
        lock(&self.writing).contains(hash) || self.tiers.iter().all(|t| t.index().contains(hash))
    }

    /// Queues `bytes` as `hash`'s copy for every tier; never waits. Dropped
    /// when the writer is too far behind.
    pub fn offer(&self, hash: BlockHash, bytes: Vec<u8>) {
        let len = bytes.len() as u64;
        if self.queued.load(Ordering::Relaxed) + len > MAX_QUEUED_BYTES {
            return;
        }
        if !lock(&self.writing).insert(hash) {
            return;
        }
        self.queued.fetch_add(len, Ordering::Relaxed);
        if self.writes.send((hash, bytes)).is_err() {
            lock(&self.writing).remove(&hash);
        }
    }

    /// How many leading blocks of `hashes` some tier holds.
    pub fn run(&self, hashes: &[BlockHash]) -> usize {
        let held = |h: &BlockHash| self.tiers.iter().any(|t| t.index().contains(h));
        hashes.iter().take_while(|h| held(h)).count()
    }

    /// Counts a lookup that stopped at a block no tier holds: a miss in each.
    pub fn missed(&self, metrics: &Metrics) {
        self.tiers
            .iter()
            .for_each(|t| metrics.tier_miss(t.kind, false));
    }

    /// Reads `hashes` back for row `row`, off the worker's thread.
    pub fn load(&mut self, row: RequestId, hashes: Vec<BlockHash>) {
        if self.reads.send((row, hashes)).is_ok() {
            self.loading += 1;
        }
    }

    /// Reads outstanding.
    pub fn loading(&self) -> usize {
        self.loading
    }

    /// The reads finished; waits up to `wait` for the first when none has.
    pub fn finished(&mut self, wait: Option<Duration>) -> Vec<Loaded> {
        let mut out: Vec<Loaded> = self.loaded.try_iter().collect();
        if out.is_empty()
            && self.loading > 0
            && let Some(l) = wait.and_then(|w| self.loaded.recv_timeout(w).ok())
        {
            out.push(l);
        }
        self.loading -= out.len().min(self.loading);
        out
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The writer thread's state.
struct Writer {
    tiers: Arc<[Arc<Tier>]>,
    /// How often, in milliseconds, the stores are listed again for the
    /// copies of servers sharing them.
    rescan_ms: Arc<AtomicU64>,
    queued: Arc<AtomicU64>,
    writing: Arc<Mutex<HashSet<BlockHash>>>,
    metrics: Arc<Metrics>,
}

impl Writer {
    fn run(self, rx: Receiver<(BlockHash, Vec<u8>)>) {
        self.gauges();
        let mut scanned = Instant::now();
        loop {
            let rescan = Duration::from_millis(self.rescan_ms.load(Ordering::Relaxed));
            // Now and then, what servers sharing a store wrote since.
            if scanned.elapsed() >= rescan {
                for tier in self.tiers.iter() {
                    tier.adopt(&tier.store.scan());
                }
                self.gauges();
                scanned = Instant::now();
            }
            let (hash, bytes) = match rx.recv_timeout(rescan) {
                Ok(copy) => copy,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            self.write(hash, &bytes);
        }
    }

    /// Writes one copy to every tier that lacks it.
    fn write(&self, hash: BlockHash, bytes: &[u8]) {
        for tier in self.tiers.iter() {
            if tier.index().contains(&hash) {
                continue;
            }
            match tier.store.put(&hash, bytes) {
                Ok(()) => {
                    tier.kept(hash);
                    self.metrics.tier_written(tier.kind, tier.stored);
                }
                Err(e) => {
                    tracing::warn!(tier = %tier.kind, error = %e, "a KV block was not written")
                }
            }
        }
        lock(&self.writing).remove(&hash);
        self.queued.fetch_sub(bytes.len() as u64, Ordering::Relaxed);
        self.gauges();
    }

    fn gauges(&self) {
        for t in self.tiers.iter() {
            let (held, most) = t.blocks();
            self.metrics.set_tier_blocks(t.kind, held, most);
        }
    }
}

/// The reader thread's state.
struct Reader {
    tiers: Arc<[Arc<Tier>]>,
    payload: usize,
    metrics: Arc<Metrics>,
}

impl Reader {
    fn run(self, rx: Receiver<(RequestId, Vec<BlockHash>)>, tx: Sender<Loaded>) {
        for (row, hashes) in rx {
            let started = Instant::now();
            let mut blocks = Vec::with_capacity(hashes.len());
            let mut lowest = None;
            for h in &hashes {
                let Some((bytes, tier)) = self.read(h) else {
                    break;
                };
                lowest = lowest.max(Some(tier));
                blocks.push(bytes);
            }
            if let Some(tier) = lowest {
                self.metrics
                    .tier_read_time(tier, started.elapsed().as_secs_f64());
            }
            if tx.send(Loaded { row, blocks }).is_err() {
                return;
            }
        }
    }

    /// `hash`'s bytes from the highest tier with a whole copy; a copy
    /// refused is forgotten and deleted, and the next tier tried.
    fn read(&self, hash: &BlockHash) -> Option<(Vec<u8>, KvTier)> {
        for tier in self.tiers.iter() {
            if !tier.index().contains(hash) {
                continue;
            }
            let got = tier.store.get(hash).and_then(|b| {
                if b.len() == self.payload {
                    Ok(b)
                } else {
                    Err(Miss::Corrupt(format!(
                        "{} bytes, not {}",
                        b.len(),
                        self.payload
                    )))
                }
            });
            match got {
                Ok(bytes) => {
                    tier.index().touch(hash);
                    self.metrics.tier_hits(tier.kind, 1, bytes.len() as u64);
                    return Some((bytes, tier.kind));
                }
                Err(miss) => {
                    if let Miss::Corrupt(why) = &miss {
                        tracing::warn!(tier = %tier.kind, %hash, %why, "a KV block copy was refused; it is recomputed");
                    }
                    tier.index().remove(hash);
                    tier.store.delete(hash);
                    self.metrics
                        .tier_miss(tier.kind, matches!(miss, Miss::Corrupt(_)));
                }
            }
        }
        None
    }
}
