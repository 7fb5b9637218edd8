//! The plan of a pooling model (an embedder): its layers keep nothing
//! between steps, so it has no pool; the plan is its weights, the
//! activations of one batch of `max_batch_tokens` tokens, the runtime and
//! nothing else, checked against the memory as every plan is.

use crate::{ModelGeometry, Plan, PlanConfig, PlanError, check_inputs, resolve_max_model_len};

/// Peak activation bytes of one pooling batch of `tokens` tokens whose
/// longest sequence has `longest` tokens: the layers' intermediates (as a
/// decoder step's, with no logit row), one sequence's attention scores and
/// their softmax at a time, in f32, and the pooled rows.
pub fn pooling_activation_bytes(
    geometry: &ModelGeometry,
    tokens: u64,
    longest: u64,
    elem_bytes: u64,
) -> u64 {
    let scores = 2u64
        .saturating_mul(geometry.heads)
        .saturating_mul(longest.saturating_mul(longest))
        .saturating_mul(4);
    let pooled = tokens
        .saturating_mul(geometry.hidden_size)
        .saturating_mul(4);
    geometry
        .activation_bytes(tokens, 0, elem_bytes)
        .saturating_add(scores)
        .saturating_add(pooled)
}

/// Plans a pooling model that runs batches of at most `max_batch_tokens`
/// tokens: no pool, `max_seqs` the cap on sequences a batch; with
/// `config.memory_bytes` given, the whole plan must fit in `memory *
/// utilization`.
pub fn plan_pooling(
    geometry: &ModelGeometry,
    config: &PlanConfig,
    max_batch_tokens: u64,
) -> Result<Plan, PlanError> {
    check_inputs(geometry, config)?;
    if max_batch_tokens == 0 {
        return Err(PlanError::Invalid(
            "maxBatchTokens must be at least 1".into(),
        ));
    }
    let max_model_len = resolve_max_model_len(geometry, config.max_model_len)?;
    let activation = config.activation_reserve_bytes.unwrap_or_else(|| {
        let longest = max_model_len.min(max_batch_tokens);
        let elem = config.activation_elem_bytes;
        pooling_activation_bytes(geometry, max_batch_tokens, longest, elem)
    });
    let plan = Plan {
        pools: Vec::new(),
        block_size: config.block_size,
        max_seqs: config.max_seqs_cap(),
        weight_bytes: geometry.weight_bytes,
        kv_budget_bytes: 0,
        activation_reserve_bytes: activation,
        overhead_bytes: config.overhead(geometry),
        adapter_bytes: config.adapter_bytes,
        draft_bytes: 0,
        max_model_len,
        params: geometry.params,
        active_params: geometry.active_params,
    };
    let usable = (config.memory_bytes as f64 * config.utilization).floor() as u64;
    if config.memory_bytes != 0 && plan.total_bytes() > usable {
        return Err(PlanError::OverMemory {
            total_bytes: plan.total_bytes(),
            weight_bytes: plan.weight_bytes,
            kv_bytes: 0,
            reserve_bytes: (plan.activation_reserve_bytes + plan.overhead_bytes)
                .saturating_add(plan.adapter_bytes),
            memory_bytes: usable,
        });
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KvDtype;

    fn bert() -> ModelGeometry {
        ModelGeometry {
            layers: 12,
            kv_heads: 12,
            head_dim: 64,
            kv_dtype: KvDtype::F32,
            weight_bytes: 440_000_000,
            context_length: 512,
            heads: 12,
            hidden_size: 768,
            intermediate_size: 3072,
            vocab_size: 30522,
            ..ModelGeometry::default()
        }
    }

    #[test]
    fn a_pooling_plan_has_no_pool_and_counts_weights_and_one_batch() {
        let config = PlanConfig::default();
        let plan = plan_pooling(&bert(), &config, 8192).unwrap();
        assert!(plan.pools.is_empty());
        assert_eq!(plan.kv_budget_bytes, 0);
        let want = pooling_activation_bytes(&bert(), 8192, 512, 4);
        assert_eq!(plan.activation_reserve_bytes, want);
        // The 512-token scores of 12 heads, twice, in f32.
        assert!(want > 2 * 12 * 512 * 512 * 4);
        assert_eq!(
            plan.total_bytes(),
            440_000_000 + want + config.overhead(&bert())
        );
        // A bigger batch costs more.
        let bigger = plan_pooling(&bert(), &config, 16384).unwrap();
        assert!(bigger.activation_reserve_bytes > plan.activation_reserve_bytes);
    }

    #[test]
    fn a_pooling_plan_is_refused_where_it_cannot_fit() {
        type Case = (u64, u64, Option<&'static str>);
        // (memory, max_batch_tokens, error)
        let cases: [Case; 4] = [
            (0, 8192, None),
            (8_000_000_000, 8192, None),
            (500_000_000, 8192, Some("more than the")),
            (8_000_000_000, 0, Some("maxBatchTokens")),
        ];
        for (memory, tokens, want) in cases {
            let config = PlanConfig {
                memory_bytes: memory,
                ..PlanConfig::default()
            };
            match (plan_pooling(&bert(), &config, tokens), want) {
                (Ok(_), None) => {}
                (Err(e), Some(w)) => assert!(e.to_string().contains(w), "{e}"),
                (got, w) => panic!("{memory} {tokens}: {got:?} vs {w:?}"),
            }
        }
    }
}
