//! A row's cache: one lease per pool, by kind, and the window reclaim.
//! Blocks leave a row only through its leases' one release: their drop, or
//! a window giving back the blocks it has left.

use ferrox_core::{BlockHash, BlockLease, Error, Table};
use ferrox_plan::CacheKind;

use crate::kv_pools::Leases;

/// A row's block tables, one lease per pool of the model, by kind (a state
/// pool's lease is the row's one slot: it goes back with the blocks, in the
/// leases' one release).
pub(crate) struct RowKv {
    leases: Leases,
    block_size: usize,
}

impl RowKv {
    /// The row's `leases`, one per pool.
    pub fn new(leases: Leases, block_size: usize) -> Self {
        RowKv {
            leases,
            block_size: block_size.max(1),
        }
    }

    /// The block tables, one per pool, named by kind.
    pub fn tables(&self) -> Vec<Table<'_>> {
        let leases = self.leases.iter();
        leases
            .map(|(kind, lease)| Table {
                kind: *kind,
                blocks: lease.blocks(),
            })
            .collect()
    }

    /// Leading blocks the prefix cache held at admission (the full-attention
    /// pool's; the cache runs only on models whose every pool is one).
    pub fn cached_blocks(&self) -> usize {
        self.full().map_or(0, BlockLease::cached_blocks)
    }

    /// The full-attention pool's table (empty for a model without).
    pub fn full_table(&self) -> &[u32] {
        self.full().map_or(&[], BlockLease::blocks)
    }

    fn full(&self) -> Option<&BlockLease> {
        let full = self.leases.iter().find(|(k, _)| *k == CacheKind::Full);
        full.map(|(_, l)| l)
    }

    /// Records that the first `written` blocks hold tokens, and offers the
    /// full blocks of `full` to the cache (the full-attention pool only).
    pub fn commit(&mut self, written: usize, full: &[BlockHash]) {
        for (kind, lease) in &mut self.leases {
            match kind {
                CacheKind::Full => lease.commit(written, full),
                CacheKind::Window(_) => lease.commit(written, &[]),
                // A slot holds the state, not tokens by block.
                CacheKind::State => {}
            }
        }
    }

    /// Draws, in the full-attention pool, the blocks of a sequence of
    /// `tokens` tokens.
    pub fn grow(&mut self, tokens: usize) -> Result<(), Error> {
        let room = tokens.div_ceil(self.block_size);
        let full = self
            .leases
            .iter_mut()
            .filter(|(k, _)| *k == CacheKind::Full);
        for (_, lease) in full {
            lease.grow(room)?;
        }
        Ok(())
    }

    /// Gives back, in the full-attention pool, the blocks drawn past those
    /// of a sequence of `tokens` tokens (a verification's rejected draft
    /// tokens'), through the leases' one release; they stay reserved to
    /// the row. Speculation runs only on models whose every pool is full
    /// attention, so no other pool ever drew for a draft.
    pub fn truncate(&mut self, tokens: usize) {
        let keep = tokens.div_ceil(self.block_size);
        let full = self
            .leases
            .iter_mut()
            .filter(|(k, _)| *k == CacheKind::Full);
        for (_, lease) in full {
            lease.truncate(keep);
        }
    }

    /// Before a step computes `n` tokens at `pos`: each window pool gives
    /// back the blocks wholly below `pos - window` (the window reclaim) and
    /// draws those up to `pos + n`. Reclaim first, so a row never holds more
    /// than its reservation.
    pub fn prepare(&mut self, pos: usize, n: usize) -> Result<(), Error> {
        let bs = self.block_size;
        for (kind, lease) in &mut self.leases {
            let Some(w) = kind.window() else { continue };
            let w = usize::try_from(w).unwrap_or(usize::MAX);
            lease.release_before(pos.saturating_sub(w) / bs);
            lease.grow(pos.saturating_add(n).div_ceil(bs))?;
        }
        Ok(())
    }
}
