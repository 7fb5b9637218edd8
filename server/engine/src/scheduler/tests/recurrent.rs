//! The recurrent memory model through the worker: a state slot a running
//! row, taken at admission and given back in the one release in every way a
//! row ends, the slots a third cap beside sequences and blocks; over a fake
//! model that refuses a row whose slot does not hold the tokens before it.

use super::*;
use crate::fixtures::ConfigPools;

/// The small engine with `slots` state slots and room for 4 rows.
fn recurrent(slots: usize) -> EngineConfig {
    let mut cfg = EngineConfig {
        max_seqs: 4,
        ..config()
    };
    cfg.set_pool(CacheKind::State, slots);
    cfg
}

fn rig(cfg: &EngineConfig) -> Rig {
    let mut model = FakeModel::new(cfg.block_size);
    model.pools = cfg.pools.clone();
    Rig::with_model(model, cfg.clone())
}

fn slots_held(rig: &Rig) -> usize {
    rig.s
        .stats_of(CacheKind::State)
        .map_or(usize::MAX, |s| s.reserved)
}

#[test]
fn the_slots_cap_admission_and_every_row_holds_one() {
    let cfg = recurrent(2);
    let mut rig = rig(&cfg);
    let mut subs: Vec<_> = (1..=5).map(|t| rig.submit(request(&[t; 6], 5))).collect();
    let mut most = 0;
    rig.tick();
    while !rig.s.is_idle() {
        assert_eq!(slots_held(&rig), rig.s.running());
        most = most.max(rig.s.running());
        rig.tick();
    }
    assert_eq!(most, 2, "two slots, two rows, though max_seqs is 4");
    for s in &mut subs {
        let o = outcome(s);
        assert!(o.error.is_none() && o.ids.len() == 5, "{o:?}");
    }
    assert_eq!(slots_held(&rig), 0);
    rig.assert_all_blocks_back();
    let text = rig.h.metrics().render("m");
    assert!(
        text.contains("ferrox_pool_blocks_capacity{pool=\"state\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("ferrox_pool_blocks_used{pool=\"state\"} 0"),
        "{text}"
    );
}

#[test]
fn cancel_in_each_state_gives_the_slot_back_and_the_next_row_takes_it() {
    // One slot: the target runs, the next waits for its slot. Prompts of 12
    // in chunks of 4: prefilling on ticks 1-3, decoding from tick 4.
    for (ticks, prefilling) in [(0, None), (2, Some(true)), (5, Some(false))] {
        let mut rig = rig(&recurrent(1));
        let target = rig.submit(request(&[2; 12], 40));
        let mut next = rig.submit(request(&[3; 5], 4));
        for _ in 0..ticks {
            rig.tick();
        }
        let state = rig.s.rows.get(&target.id()).map(|r| r.is_prefilling());
        assert_eq!(state, prefilling, "ticks {ticks}");
        drop(target);
        rig.run(40);
        // The next row ran in the slot the target gave back, from position 0.
        let o = outcome(&mut next);
        assert!(
            o.error.is_none() && o.ids.len() == 4,
            "ticks {ticks}: {o:?}"
        );
        assert_eq!(slots_held(&rig), 0, "ticks {ticks}");
        rig.assert_all_blocks_back();
    }
}

#[test]
fn a_failed_or_panicking_step_leaks_no_slot() {
    type Spoil = fn(&mut FakeModel);
    let cases: [Spoil; 3] = [
        |m| m.panic_next = 1,
        |m| m.fail_next = 2,
        |m| m.fail_decode = true,
    ];
    for spoil in cases {
        let cfg = recurrent(2);
        let mut model = FakeModel::new(cfg.block_size);
        model.pools = cfg.pools.clone();
        spoil(&mut model);
        let mut rig = Rig::with_model(model, cfg);
        let _a = rig.submit(request(&[1, 2], 4));
        let _b = rig.submit(request(&[7; 6], 4));
        rig.run(40);
        assert_eq!(slots_held(&rig), 0);
        rig.assert_all_blocks_back();
    }
}

#[test]
fn a_server_without_a_slot_refuses_at_the_door() {
    let rig = rig(&recurrent(0));
    let Err(err) = rig.h.submit(request(&[1, 2], 4), rig.now) else {
        panic!("a request no slot can hold was accepted");
    };
    assert!(err.to_string().contains("no state slot"), "{err}");
    // A model whose slots the config does not state is refused at start.
    let mut model = FakeModel::new(4);
    model.pools = recurrent(2).pools;
    let metrics = Arc::new(Metrics::new().unwrap());
    assert!(Scheduler::new(model, config(), metrics, Instant::now()).is_err());
}

/// Requests of 2048 + 2048 tokens the engine admits at once in a KV budget
/// of 16 GiB planned for `geometry`, and the plan's `max_seqs`.
fn admitted_in_16_gib(geometry: &ferrox_plan::ModelGeometry) -> (usize, u64) {
    let plan_config = ferrox_plan::PlanConfig {
        block_size: 16,
        prefill_chunk: 512,
        max_model_len: Some(4096),
        max_seqs_cap: Some(512),
        typical_seq_len: Some(4096),
        ..ferrox_plan::PlanConfig::default()
    };
    let plan = ferrox_plan::plan_for_kv_bytes(geometry, &plan_config, 16 << 30).unwrap();
    let cfg = EngineConfig {
        max_seqs: plan.max_seqs as usize,
        max_queue: 1024,
        prefill_chunk: 512,
        max_model_len: 4096,
        block_size: 16,
        pools: EngineConfig::plan_pools(&plan).unwrap(),
        prefix_caching: false,
        ..config()
    };
    let mut rig = rig(&cfg);
    let subs: Vec<_> = (0..600u32)
        .map(|i| {
            let mut prompt = vec![i % 31 + 1; 2048];
            prompt[0] = i % 29 + 1;
            rig.submit(request(&prompt, 2048))
        })
        .collect();
    let first = rig.tick();
    drop(subs);
    (first.admitted.new_seqs, plan.max_seqs)
}

#[test]
fn a_hybrid_admits_three_times_the_sequences_of_a_dense_model_in_the_same_memory() {
    // Granite-4.0-H-Micro's shape: 40 layers, KV of 8 heads of 128 in bf16:
    // 2 * 40 * 8 * 128 * 2 = 163,840 bytes a token, 671 MB a 4096-token
    // sequence: 16 GiB holds 25.
    let dense = ferrox_plan::ModelGeometry {
        layers: 40,
        kv_heads: 8,
        head_dim: 128,
        kv_dtype: ferrox_plan::KvDtype::Bf16,
        context_length: 4096,
        ..ferrox_plan::ModelGeometry::default()
    };
    // Its hybrid: 36 of the 40 layers Mamba-2 (64 heads of 64, a state of
    // 128, one group, a conv of 4), f32 states: 36 * 4 * (3 * (4096 + 256)
    // + 64 * 64 * 128) = 77,380,608 bytes a sequence, beside 4 layers' KV
    // (16,384 bytes a token, 67 MB a sequence): 144 MB, 118 in 16 GiB.
    let hybrid = ferrox_plan::ModelGeometry {
        recurrent_layers: 36,
        state_bytes_per_seq: 36 * 4 * (3 * (4096 + 256) + 64 * 64 * 128),
        ..dense.clone()
    };
    let (d, d_plan) = admitted_in_16_gib(&dense);
    let (h, h_plan) = admitted_in_16_gib(&hybrid);
    assert_eq!(
        (d as u64, h as u64),
        (d_plan, h_plan),
        "the plan's counts admitted"
    );
    assert_eq!((d, h), (25, 118));
    assert!(h >= 3 * d, "hybrid {h}, dense {d}");
}
