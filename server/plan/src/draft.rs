//! A draft model's terms in the plan: its weights as held, and its KV, one
//! draft block beside each block of the full-attention pool (the server
//! gives the draft a pool of as many blocks, so every sequence the target
//! holds can be drafted for).

/// What a draft model adds to the plan on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftPlan {
    /// Bytes of its weights, as held on the device.
    pub weight_bytes: u64,
    /// Bytes of K and V one token takes across its layers, in the KV dtype.
    pub kv_bytes_per_token: u64,
}

impl DraftPlan {
    /// Bytes of one draft block of `block_size` tokens.
    pub fn block_bytes(&self, block_size: u64) -> u64 {
        self.kv_bytes_per_token.saturating_mul(block_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::smollm2_135m;
    use crate::{PlanConfig, PoolSizes, plan, plan_for_pools};

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_draft_s_weights_and_kv_are_counted_beside_the_target_s() {
        let target = smollm2_135m();
        let draft = DraftPlan {
            weight_bytes: 100 << 20,
            kv_bytes_per_token: target.kv_bytes_per_token() / 2,
        };
        let base = PlanConfig {
            memory_bytes: 2 * GIB,
            max_model_len: Some(2048),
            activation_reserve_bytes: Some(256 << 20),
            ..PlanConfig::default()
        };
        let drafted = PlanConfig {
            draft: Some(draft),
            ..base.clone()
        };
        let (without, with) = (
            plan(&target, &base).unwrap(),
            plan(&target, &drafted).unwrap(),
        );
        let blocks = |p: &crate::Plan| p.blocks(crate::CacheKind::Full);
        let draft_kv = blocks(&with) * draft.block_bytes(16);
        assert_eq!(with.draft_bytes, draft.weight_bytes + draft_kv);
        assert_eq!(without.draft_bytes, 0);
        // The draft's weights and its half-size blocks come out of the
        // target's pool: fewer blocks, and the whole still within budget.
        assert!(blocks(&with) < blocks(&without));
        let usable = (2 * GIB) as f64 * 0.9;
        assert!(with.total_bytes() as f64 <= usable, "{with:?}");
        assert!(without.total_bytes() + (16 << 20) > with.total_bytes());
        // Each target block now costs one and a half: the pool the weights
        // leave is split 2:1.
        let left = usable as u64 - with.weight_bytes - draft.weight_bytes;
        let left = left - with.activation_reserve_bytes - with.overhead_bytes;
        let block = with.pools[0].block_bytes;
        assert_eq!(blocks(&with), left / (block + draft.block_bytes(16)));
        // Pools sized by hand: the draft's bytes count against the memory.
        let sizes = PoolSizes {
            kv_blocks: Some(blocks(&without)),
            ..PoolSizes::default()
        };
        let fixed = plan_for_pools(&target, &base, &sizes).unwrap();
        assert_eq!(fixed.draft_bytes, 0);
        let err = plan_for_pools(&target, &drafted, &sizes).unwrap_err();
        assert!(err.to_string().contains("bytes"), "{err}");
    }
}
