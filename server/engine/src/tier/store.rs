//! Where a lower tier keeps its blocks' bytes: host memory, or files
//! ([`super::disk_store::DiskStore`]). A store only keeps and returns bytes;
//! its [`super::index::TierIndex`] decides what it holds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use ferrox_core::BlockHash;

/// One copy found in a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    /// Its block.
    pub hash: BlockHash,
    /// Bytes it takes in the store.
    pub bytes: u64,
    /// When it was written.
    pub modified: std::time::SystemTime,
}

/// Why a block was not read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Miss {
    /// The store has no copy.
    Absent,
    /// Its copy is torn, truncated, of another block or fails its
    /// checksum: never used.
    Corrupt(String),
}

/// One tier's bytes, by block hash. Shared by the writer and reader threads.
pub(crate) trait BlockStore: Send + Sync {
    /// Keeps `bytes` as `hash`'s copy, whole or not at all.
    fn put(&self, hash: &BlockHash, bytes: &[u8]) -> std::io::Result<()>;
    /// `hash`'s copy, checked.
    fn get(&self, hash: &BlockHash) -> Result<Vec<u8>, Miss>;
    /// Drops `hash`'s copy, if any.
    fn delete(&self, hash: &BlockHash);
    /// Bytes a copy of `payload` bytes takes in the store.
    fn stored_bytes(&self, payload: usize) -> u64 {
        payload as u64
    }
    /// The copies the store holds, oldest first, whoever wrote them (a disk
    /// directory other servers share); host memory holds only its own.
    fn scan(&self) -> Vec<Found> {
        Vec::new()
    }
}

/// Blocks in host memory.
#[derive(Debug, Default)]
pub(crate) struct HostStore {
    blocks: Mutex<HashMap<BlockHash, Arc<[u8]>>>,
}

impl HostStore {
    fn blocks(&self) -> std::sync::MutexGuard<'_, HashMap<BlockHash, Arc<[u8]>>> {
        self.blocks.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl BlockStore for HostStore {
    fn put(&self, hash: &BlockHash, bytes: &[u8]) -> std::io::Result<()> {
        self.blocks().insert(*hash, Arc::from(bytes));
        Ok(())
    }

    fn get(&self, hash: &BlockHash) -> Result<Vec<u8>, Miss> {
        let copy = self.blocks().get(hash).cloned();
        copy.map(|b| b.to_vec()).ok_or(Miss::Absent)
    }

    fn delete(&self, hash: &BlockHash) {
        self.blocks().remove(hash);
    }
}
