//! The scheduler's side of the lower KV tiers: a row admitted with blocks
//! past its device-cached run that a tier holds waits, out of the prefill
//! order, while the reader thread fetches them and other rows step; its
//! blocks are copied into its own lease's blocks, then it prefills the
//! rest. Every full block registered is copied out once and offered to the
//! writer. A read that comes back short (a torn file) leaves the rest to
//! the prefill: a miss, never wrong KV.

use std::sync::Arc;
use std::time::Duration;

use ferrox_core::BatchModel;
use ferrox_plan::CacheKind;

use super::Scheduler;
use crate::metrics::Metrics;
use crate::row::Row;
use crate::tier::Offload;
use crate::{EngineConfig, EngineError};

/// The lower tiers `config` asks for, when the prefix cache runs (they hold
/// its blocks); a tier that cannot be served is refused with the reason.
pub(super) fn open<M: BatchModel>(
    model: &M,
    config: &EngineConfig,
    epoch: u64,
    metrics: &Arc<Metrics>,
) -> Result<Option<Offload>, EngineError> {
    if config.kv_offload.is_empty() {
        return Ok(None);
    }
    let off = config
        .prefix_cache_off_reason()
        .or((!config.prefix_caching).then_some("the prefix cache is off"));
    if let Some(why) = off {
        tracing::warn!("the lower KV tiers are off: {why}");
        return Ok(None);
    }
    let payload = model.read_block(CacheKind::Full, 0).map_err(|e| {
        EngineError::Config(format!(
            "the lower KV tiers need the model's blocks copied out: {e}"
        ))
    })?;
    Offload::open(
        &config.kv_offload,
        payload.len(),
        epoch,
        Arc::clone(metrics),
    )
    .map(Some)
}

impl<M: BatchModel> Scheduler<M> {
    /// For a row just admitted: starts reading back the blocks past its
    /// device-cached run that a lower tier holds. True when it must wait.
    pub(super) fn start_load(&mut self, row: &mut Row) -> bool {
        let Some(offload) = &mut self.offload else {
            return false;
        };
        let bs = self.shared.config.block_size;
        let from = row.cursor / bs;
        let upto = row.cacheable_blocks().min(row.hashes().len());
        if upto <= from {
            return false;
        }
        let wanted = &row.hashes()[from..upto];
        let found = offload.run(wanted);
        if found < wanted.len() {
            offload.missed(&self.metrics);
        }
        self.metrics.add_external_prefix(wanted.len() * bs, 0);
        if found == 0 {
            return false;
        }
        offload.load(row.id, wanted[..found].to_vec());
        row.loading = true;
        true
    }

    /// Copies the blocks of every read finished (waiting up to `wait` for
    /// one when none has) into their rows, which then prefill the rest.
    pub(super) fn finish_loads(&mut self, wait: Option<Duration>) {
        let Some(offload) = &mut self.offload else {
            return;
        };
        if offload.loading() == 0 {
            return;
        }
        let bs = self.shared.config.block_size;
        for loaded in offload.finished(wait) {
            // A row cancelled meanwhile is gone, its blocks back in the pool.
            let Some(row) = self.rows.get_mut(&loaded.row) else {
                continue;
            };
            row.loading = false;
            let from = row.cursor / bs;
            let mut took = 0;
            for (i, bytes) in loaded.blocks.iter().enumerate() {
                let Some(&block) = row.kv.full_table().get(from + i) else {
                    break;
                };
                if let Err(e) = self.model.write_block(CacheKind::Full, block, bytes) {
                    tracing::warn!(error = %e, "a block read back was not copied in; it is recomputed");
                    break;
                }
                took += 1;
            }
            row.took_loaded(took);
            self.metrics.add_external_prefix(0, took * bs);
            self.prefill_order.push_back(row.id);
        }
    }

    /// Offers every full block registered since the last offer, copied out
    /// of the model, to the lower tiers (each block once).
    pub(super) fn offer_blocks(&mut self) {
        let Some(offload) = &self.offload else {
            return;
        };
        for row in self.rows.values_mut() {
            let full = row.full_blocks();
            for i in row.offered..full {
                let (hash, block) = (row.hashes()[i], row.kv.full_table().get(i).copied());
                let Some(block) = block.filter(|_| !offload.holds(&hash)) else {
                    continue;
                };
                match self.model.read_block(CacheKind::Full, block) {
                    Ok(bytes) => offload.offer(hash, bytes),
                    Err(e) => tracing::warn!(error = %e, "a block was not copied out"),
                }
            }
            row.offered = row.offered.max(full);
        }
    }
}
