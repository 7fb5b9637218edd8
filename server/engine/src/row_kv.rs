//! A row's KV: one lease per pool, and the window reclaim. Blocks leave a row
//! only through its leases' one release: their drop, or a window giving back
//! the blocks it has left.

use ferrox_core::{BlockHash, BlockLease, Error};

/// One block table per pool, in the pools' order, then the row's state
/// slot (a model with recurrent layers), a one-block lease of the slots'
/// pool: it goes back with the blocks, in the leases' one release.
pub(crate) struct RowKv {
    /// Each pool's window (`None`: full attention) and the row's lease there.
    leases: Vec<(Option<usize>, BlockLease)>,
    state: Option<BlockLease>,
    block_size: usize,
}

impl RowKv {
    /// The row's `leases`, one per pool of `windows`, and its state slot.
    pub fn new(
        windows: &[Option<usize>],
        (leases, state): (Vec<BlockLease>, Option<BlockLease>),
        block_size: usize,
    ) -> Self {
        RowKv {
            leases: windows.iter().copied().zip(leases).collect(),
            state,
            block_size: block_size.max(1),
        }
    }

    /// The block tables, one per pool, then the state slot's one-entry
    /// table where the model has recurrent layers.
    pub fn tables(&self) -> Vec<&[u32]> {
        let state = self.state.as_ref().map(BlockLease::blocks);
        self.leases
            .iter()
            .map(|(_, l)| l.blocks())
            .chain(state)
            .collect()
    }

    /// Leading blocks the prefix cache held at admission (the full-attention
    /// pool's; the cache runs only on models without windows).
    pub fn cached_blocks(&self) -> usize {
        self.leases
            .iter()
            .find(|(w, _)| w.is_none())
            .map_or(0, |(_, l)| l.cached_blocks())
    }

    /// Records that the first `written` blocks hold tokens, and offers the
    /// full blocks of `full` to the cache (full-attention pools only).
    pub fn commit(&mut self, written: usize, full: &[BlockHash]) {
        for (window, lease) in &mut self.leases {
            let hashes = if window.is_none() { full } else { &[] };
            lease.commit(written, hashes);
        }
    }

    /// Draws, in the full-attention pools, the blocks of a sequence of
    /// `tokens` tokens.
    pub fn grow(&mut self, tokens: usize) -> Result<(), Error> {
        let room = tokens.div_ceil(self.block_size);
        for (_, lease) in self.leases.iter_mut().filter(|(w, _)| w.is_none()) {
            lease.grow(room)?;
        }
        Ok(())
    }

    /// Before a step computes `n` tokens at `pos`: each window pool gives
    /// back the blocks wholly below `pos - window` (the window reclaim) and
    /// draws those up to `pos + n`. Reclaim first, so a row never holds more
    /// than its reservation.
    pub fn prepare(&mut self, pos: usize, n: usize) -> Result<(), Error> {
        let bs = self.block_size;
        for (window, lease) in &mut self.leases {
            let Some(w) = *window else { continue };
            lease.release_before(pos.saturating_sub(w) / bs);
            lease.grow(pos.saturating_add(n).div_ceil(bs))?;
        }
        Ok(())
    }
}
