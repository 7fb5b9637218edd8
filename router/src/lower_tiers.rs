//! What one endpoint holds below its device pool: a [`Holdings`] per lower
//! KV tier (`host`, `disk`) read from `GET /kv_events?tier=..`, the tiers
//! its server refused to page (an older server answers 400), and the
//! weighted run of a prompt's blocks over every tier.

use std::collections::BTreeMap;

use ferrox_core::{BlockHash, KvEventsPage};
use ferrox_plan::{KvTier, TierWeights};

use crate::holdings::Holdings;

/// One endpoint's lower tiers. `D` is the clock of the device holdings.
#[derive(Debug, Clone)]
pub struct LowerTiers<D> {
    held: BTreeMap<KvTier, Holdings<D>>,
    /// Tiers the server refused, with the device pool's epoch then: asked
    /// again once that epoch changes (a restart, maybe a newer server).
    refused: BTreeMap<KvTier, u64>,
    device_epoch: u64,
}

impl<D: Ord + Copy> Default for LowerTiers<D> {
    fn default() -> Self {
        Self::new()
    }
}

impl<D: Ord + Copy> LowerTiers<D> {
    /// Nothing known.
    pub fn new() -> Self {
        LowerTiers {
            held: BTreeMap::new(),
            refused: BTreeMap::new(),
            device_epoch: 0,
        }
    }

    /// The device pool's epoch as last read: a new one forgets refusals.
    pub fn device_epoch(&mut self, epoch: u64) {
        if epoch != self.device_epoch {
            self.refused.clear();
            self.device_epoch = epoch;
        }
    }

    /// The lower tiers worth asking the server for now.
    pub fn to_ask(&self) -> Vec<KvTier> {
        let asked = KvTier::LOWER.into_iter();
        asked.filter(|t| !self.refused.contains_key(t)).collect()
    }

    /// The server has no way to page `tier` (it answered 400): stop asking
    /// until its device epoch changes, and forget what it held there.
    pub fn refuse(&mut self, tier: KvTier) {
        self.refused.insert(tier, self.device_epoch);
        self.held.remove(&tier);
    }

    /// Where to read `tier`'s log on from: (cursor, epoch).
    pub fn cursor(&self, tier: KvTier) -> (u64, u64) {
        self.held.get(&tier).map_or((0, 0), Holdings::cursor)
    }

    /// Applies one page of `tier`'s log (a device page is not one of them).
    pub fn apply(&mut self, tier: KvTier, page: &KvEventsPage) {
        if tier != KvTier::Device {
            self.held
                .entry(tier)
                .or_insert_with(Holdings::new)
                .apply(page);
        }
    }

    /// Blocks reported held in `tier`.
    pub fn len(&self, tier: KvTier) -> usize {
        self.held.get(&tier).map_or(0, Holdings::len)
    }

    /// True when no lower tier reports a block.
    pub fn is_empty(&self) -> bool {
        self.held.values().all(Holdings::is_empty)
    }

    /// The leading run of `chain` where each block is held in some tier
    /// (`device`'s, or a lower one), and its score: each block counts the
    /// weight of the best tier holding it.
    pub fn weighted_run(
        &self,
        device: &Holdings<D>,
        chain: &[BlockHash],
        now: D,
        weights: &TierWeights,
    ) -> (usize, f64) {
        let best = self.best_tiers(device, chain, now, weights);
        best.fold((0, 0.0), |(run, score), t| (run + 1, score + weights.of(t)))
    }

    /// Of the same run, how many blocks each tier (device, host, disk) is
    /// the best holder of.
    pub fn run_by_tier(
        &self,
        device: &Holdings<D>,
        chain: &[BlockHash],
        now: D,
        weights: &TierWeights,
    ) -> [usize; 3] {
        let mut counts = [0; 3];
        for t in self.best_tiers(device, chain, now, weights) {
            counts[t as usize] += 1;
        }
        counts
    }

    /// The best tier holding each block of the leading run of `chain` held
    /// somewhere (a tie goes to the higher tier).
    fn best_tiers<'a>(
        &'a self,
        device: &'a Holdings<D>,
        chain: &'a [BlockHash],
        now: D,
        weights: &'a TierWeights,
    ) -> impl Iterator<Item = KvTier> + 'a {
        chain.iter().map_while(move |h| {
            let lower = self.held.iter().filter(|(_, held)| held.holds(h, now));
            let device = device.holds(h, now).then_some(KvTier::Device);
            let mut tiers = device.into_iter().chain(lower.map(|(t, _)| *t));
            let first = tiers.next()?;
            Some(tiers.fold(first, |best, t| {
                if weights.of(t) > weights.of(best) {
                    t
                } else {
                    best
                }
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrox_core::BlockHasher;

    fn page(epoch: u64, stored: &[BlockHash]) -> KvEventsPage {
        KvEventsPage {
            epoch,
            cursor: stored.len() as u64,
            reset: true,
            stored: stored.to_vec(),
            evicted: Vec::new(),
        }
    }

    #[test]
    fn each_block_counts_its_best_tier_and_a_gap_in_every_tier_ends_the_run() {
        let c = BlockHasher::new("m", 2).chain(&(1..=14).collect::<Vec<u32>>());
        let w = TierWeights::default();
        let mut device: Holdings<u64> = Holdings::new();
        device.apply(&page(1, &c[..2]));
        let mut lower: LowerTiers<u64> = LowerTiers::new();
        assert_eq!(lower.weighted_run(&device, &c, 0, &w), (2, 2.0));
        // Host holds blocks 1..3 (block 1 on the device too), disk 3..4.
        lower.apply(KvTier::Host, &page(7, &c[1..3]));
        lower.apply(KvTier::Disk, &page(8, &c[3..4]));
        let (run, score) = lower.weighted_run(&device, &c, 0, &w);
        assert_eq!(run, 4);
        assert!((score - (1.0 + 1.0 + 0.8 + 0.5)).abs() < 1e-9, "{score}");
        let by_tier = lower.run_by_tier(&device, &c, 0, &w);
        assert_eq!(by_tier, [2, 1, 1]);
        // Block 5 is nowhere: the disk's later blocks do not count.
        lower.apply(KvTier::Disk, &page(8, &[c[3], c[5], c[6]]));
        assert_eq!(lower.weighted_run(&device, &c, 0, &w).0, 4);
        assert_eq!(
            (lower.len(KvTier::Disk), lower.cursor(KvTier::Disk)),
            (3, (3, 8))
        );
        // A device page is the device holdings', not a lower tier's.
        lower.apply(KvTier::Device, &page(1, &c));
        assert_eq!(lower.len(KvTier::Device), 0);
    }

    #[test]
    fn a_refused_tier_is_not_asked_again_until_the_device_epoch_moves() {
        let c = BlockHasher::new("m", 2).chain(&[1, 2]);
        let mut lower: LowerTiers<u64> = LowerTiers::new();
        lower.device_epoch(5);
        assert_eq!(lower.to_ask(), [KvTier::Host, KvTier::Disk]);
        lower.apply(KvTier::Host, &page(3, &c));
        lower.refuse(KvTier::Host);
        assert_eq!(lower.to_ask(), [KvTier::Disk]);
        assert!(lower.is_empty(), "what it said before is forgotten");
        lower.device_epoch(5);
        assert_eq!(lower.to_ask(), [KvTier::Disk], "same server: still refused");
        lower.device_epoch(6);
        assert_eq!(lower.to_ask(), [KvTier::Host, KvTier::Disk]);
    }
}
