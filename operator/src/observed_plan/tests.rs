//! The observed-plan comparison, table by table.

use super::*;
use crate::fixtures::{self, cpu_spec};
use crate::plan::{plan_offline, to_status};

fn planned() -> PlanStatus {
    to_status(&plan_offline(&cpu_spec("2Gi"), &fixtures::smollm2_135m()).unwrap())
}

fn report(plan: &PlanStatus) -> ServerPlan {
    ServerPlan {
        kv_blocks: plan.kv_blocks as u64,
        block_size: plan.block_size as u64,
        kv_dtype: "f32".into(),
        max_seqs: Some(plan.max_seqs as u64),
        weight_bytes: Some(plan.weight_bytes as u64),
        kv_block_bytes: None,
        max_model_len: Some(plan.max_model_len as u64),
        memory_bytes: Some(2 << 30),
        memory_source: Some("cgroup-v2".into()),
        pools: plan
            .pools
            .iter()
            .map(|p| (p.pool.parse().unwrap(), p.blocks as u64))
            .collect(),
        spec_tokens: None,
    }
}

#[test]
fn differences_beyond_the_tolerance_only() {
    let plan = planned();
    let expected = Expected {
        plan: &plan,
        kv_dtype: "f32",
    };
    let same = report(&plan);
    let blocks = |b: i64| ServerPlan {
        kv_blocks: b as u64,
        ..same.clone()
    };
    let cases = [
        ("as planned", same.clone(), vec![]),
        ("1% fewer blocks", blocks(plan.kv_blocks * 99 / 100), vec![]),
        (
            "half the blocks",
            blocks(plan.kv_blocks / 2),
            vec![format!(
                "{} KV blocks, planned {}",
                plan.kv_blocks / 2,
                plan.kv_blocks
            )],
        ),
        (
            "f16 KV",
            ServerPlan {
                kv_dtype: "f16".into(),
                ..same.clone()
            },
            vec!["KV dtype f16, planned f32".to_string()],
        ),
        (
            "another block size and cap",
            ServerPlan {
                block_size: 32,
                max_seqs: Some(3),
                ..same.clone()
            },
            vec![
                "block size 32, planned 16".to_string(),
                format!("max seqs 3, planned {}", plan.max_seqs),
            ],
        ),
        (
            "twice the weights",
            ServerPlan {
                weight_bytes: Some(plan.weight_bytes as u64 * 2),
                ..same.clone()
            },
            vec![format!(
                "weights {} bytes, planned {}",
                plan.weight_bytes * 2,
                plan.weight_bytes
            )],
        ),
        (
            "gauges it does not export are not differences",
            ServerPlan {
                max_seqs: None,
                weight_bytes: None,
                ..same.clone()
            },
            vec![],
        ),
    ];
    for (name, r, want) in cases {
        assert_eq!(differences(&r, &expected), want, "{name}");
    }
}

#[test]
fn the_observed_plan_and_its_verdict() {
    let plan = planned();
    let expected = Expected {
        plan: &plan,
        kv_dtype: "f32",
    };
    let good = report(&plan);
    let bad = ServerPlan {
        kv_blocks: 100,
        ..good.clone()
    };
    assert_eq!(observe(&[], &expected), None);
    assert_eq!(verdict(None, &expected).1, "NoServerReports");

    let agree = observe(&[good.clone(), good.clone()], &expected).unwrap();
    assert_eq!((agree.pods, agree.disagreeing_pods), (2, 0));
    assert_eq!(agree.spec_acceptance_percent, None);
    // Speculating servers: accepted over verified draft tokens, all pods.
    let spec = |d, a| ServerPlan {
        spec_tokens: Some((d, a)),
        ..good.clone()
    };
    let both = observe(&[spec(300, 100), spec(100, 150), good.clone()], &expected).unwrap();
    assert_eq!(
        both.spec_acceptance_percent,
        Some(50),
        "accepted capped at verified"
    );
    assert_eq!(acceptance_percent(&[spec(0, 0)]), None);
    assert_eq!(agree.memory_source.as_deref(), Some("cgroup-v2"));
    let (status, reason, message) = verdict(Some(&agree), &expected);
    assert_eq!((status, reason), ("True", "ServersAgree"));
    assert!(
        message.contains(&format!("{} KV blocks", plan.kv_blocks)),
        "{message}"
    );

    // One pod of three disagrees: it is the one shown, with the numbers.
    let mixed = observe(&[good.clone(), bad, good], &expected).unwrap();
    assert_eq!(
        (mixed.pods, mixed.disagreeing_pods, mixed.kv_blocks),
        (3, 1, 100)
    );
    let (status, reason, message) = verdict(Some(&mixed), &expected);
    assert_eq!((status, reason), ("False", "ServersDisagree"));
    assert!(
        message.starts_with(&format!(
            "1 of 3 ready servers differ from the plan: 100 KV blocks, planned {}",
            plan.kv_blocks
        )),
        "{message}"
    );
    assert!(
        message.contains("planned from 2147483648 bytes (cgroup-v2)"),
        "{message}"
    );
}
