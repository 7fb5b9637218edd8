//! The state slots of a model with recurrent layers, with the arithmetic.

use crate::fixtures::Pools;
use crate::{KvDtype, ModelGeometry, PlanConfig, PlanError};

fn config() -> PlanConfig {
    PlanConfig {
        block_size: 16,
        prefill_chunk: 512,
        max_model_len: Some(4096),
        max_seqs_cap: Some(64),
        typical_seq_len: Some(4096),
        ..PlanConfig::default()
    }
}

#[test]
fn a_model_of_recurrent_layers_only_plans_state_slots_and_no_kv() {
    // Mamba-2 2.7B-shaped: 64 layers, 1 MiB of state a sequence; no heads.
    let g = ModelGeometry {
        layers: 64,
        recurrent_layers: 64,
        state_bytes_per_seq: 1 << 20,
        kv_dtype: KvDtype::Bf16,
        context_length: 1 << 18,
        ..ModelGeometry::default()
    };
    // 40.5 MiB: 40 slots; 1 GiB: 1024, capped at 64.
    for (budget, slots) in [((81 << 20) / 2, 40), (1 << 30, 64)] {
        let p = crate::plan_for_kv_bytes(&g, &config(), budget).unwrap();
        let got = (
            p.kv_blocks(),
            p.windows().len(),
            p.state_slots(),
            p.max_seqs,
        );
        assert_eq!(got, (0, 0, slots, slots), "{budget}");
        assert_eq!(p.state_bytes_per_seq(), 1 << 20);
        assert_eq!(p.kv_budget_bytes, slots << 20);
    }
    // Its plan serialises its one pool, the slots, by kind.
    let p = crate::plan_for_kv_bytes(&g, &config(), 1 << 30).unwrap();
    let json = serde_json::to_value(&p).unwrap();
    let pool = &json["pools"][0];
    assert_eq!(
        (&pool["kind"], &pool["blocks"], &pool["blockBytes"]),
        (
            &serde_json::json!("state"),
            &serde_json::json!(64),
            &serde_json::json!(1 << 20)
        )
    );
    assert_eq!(json["pools"].as_array().map(Vec::len), Some(1));
}

#[test]
fn recurrent_layers_and_their_state_come_together() {
    let base = ModelGeometry {
        layers: 4,
        kv_heads: 2,
        head_dim: 8,
        context_length: 4096,
        ..ModelGeometry::default()
    };
    for bad in [
        ModelGeometry {
            recurrent_layers: 2,
            ..base.clone()
        },
        ModelGeometry {
            state_bytes_per_seq: 10,
            ..base.clone()
        },
        ModelGeometry {
            recurrent_layers: 5,
            state_bytes_per_seq: 10,
            ..base.clone()
        },
    ] {
        let err = crate::plan_for_kv_bytes(&bad, &config(), 1 << 30).unwrap_err();
        assert!(matches!(err, PlanError::Invalid(_)), "{err}");
    }
    // Only the attention layers count KV: 2 of 4 here.
    let hybrid = ModelGeometry {
        recurrent_layers: 2,
        state_bytes_per_seq: 10,
        ..base
    };
    assert_eq!(hybrid.kv_bytes_per_token(), 2 * 2 * 2 * 8 * 2);
}
