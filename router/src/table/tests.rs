use super::*;
use crate::choice::Reason;
use ferrox_core::BlockHasher;

fn wanted(entries: &[(&str, &[(&str, bool)])]) -> BTreeMap<String, Vec<(String, bool)>> {
    entries
        .iter()
        .map(|(m, eps)| {
            let eps = eps.iter().map(|(n, r)| (n.to_string(), *r)).collect();
            (m.to_string(), eps)
        })
        .collect()
}

fn base(m: &str) -> Target {
    Target {
        model: m.into(),
        adapter: None,
    }
}

fn settings(until: u64) -> RouteSettings<u64> {
    RouteSettings {
        bounds: Bounds::default(),
        load_factor: 1.25,
        expect_until: until,
    }
}

#[test]
fn sync_reports_what_came_and_went_and_keeps_models_without_endpoints() {
    let mut t: Table<u64> = Table::new();
    let c = t.sync(&wanted(&[
        ("m", &[("a", true), ("b", false)]),
        ("zero", &[]),
    ]));
    assert_eq!(c.added.len(), 2);
    assert!(t.knows("zero") && !t.has_ready("zero"));
    assert!(!t.has_ready("m"), "not reachable until polled");
    t.apply_events("m", "a", &KvEventsPage::default());
    assert!(t.has_ready("m"));
    let c = t.sync(&wanted(&[("m", &[("b", true)])]));
    assert_eq!(c.removed, vec![("m".into(), "a".into())]);
    assert!(c.added.is_empty());
    assert!(!t.knows("zero"));
    assert_eq!(t.models().collect::<Vec<_>>(), vec!["m"]);
}

#[test]
fn a_routed_chain_goes_back_to_the_same_endpoint_and_in_flight_is_counted() {
    let mut t: Table<u64> = Table::new();
    t.sync(&wanted(&[("m", &[("a", true), ("b", true)])]));
    for n in ["a", "b"] {
        t.apply_events("m", n, &KvEventsPage::default());
    }
    let chain = BlockHasher::new("x", 2).chain(&[1, 2, 3, 4]);
    let (first, d) = t
        .route(&base("m"), Some(&chain), "", 0, &settings(10))
        .unwrap();
    assert_eq!(d.reason, Reason::NewPrefix);
    let other = if first == "a" { "b" } else { "a" };
    // The other is less loaded now, but the first is expected to hold it.
    let (second, d) = t
        .route(&base("m"), Some(&chain), "", 1, &settings(10))
        .unwrap();
    assert_eq!(
        (second.as_str(), d.reason, d.predicted_hit_blocks),
        (first.as_str(), Reason::PrefixHit, 2)
    );
    assert_eq!(t.in_flight("m", &first), 2);
    assert_eq!(t.finish("m", &first), 1);
    // The expectation lapsed and the server never reported it; a short
    // prompt (no block) goes to the least loaded.
    let (third, d) = t
        .route(&base("m"), Some(&[][..]), "", 11, &settings(20))
        .unwrap();
    assert_eq!((third.as_str(), d.reason), (other, Reason::LeastLoad));
    // No chain: the hash fallback.
    let (_, d) = t
        .route(&base("m"), None, "some text", 12, &settings(20))
        .unwrap();
    assert_eq!(d.reason, Reason::HashFallback);
    assert!(t.route(&base("other"), None, "", 0, &settings(1)).is_none());
    // One refusing connections is passed over until polled again.
    t.mark_unreachable("m", &first);
    for _ in 0..3 {
        let (name, _) = t
            .route(&base("m"), Some(&chain), "", 12, &settings(20))
            .unwrap();
        assert_eq!(name, other);
    }
    assert_eq!(t.finish("m", "gone"), 0);
}

#[test]
fn adapters_resolve_to_their_model_and_go_where_they_are_loaded() {
    let mut t: Table<u64> = Table::new();
    t.sync(&wanted(&[
        ("m", &[("a", true), ("b", true)]),
        ("zero", &[]),
    ]));
    t.declare_adapters([("sql".to_string(), "zero".to_string())].into());
    for n in ["a", "b"] {
        t.apply_events("m", n, &KvEventsPage::default());
    }
    let e = t.endpoint_mut("m", "b").unwrap();
    e.adapters.insert("chat".into(), Some("chat@1".into()));
    e.adapters.insert("cold".into(), None);
    let chat = t.resolve("chat").unwrap();
    assert_eq!(
        (chat.model.as_str(), chat.adapter.as_deref()),
        ("m", Some("chat"))
    );
    assert_eq!(t.resolve("m").unwrap(), base("m"));
    // Declared on a model at zero replicas: known, so it waits for one.
    assert_eq!(t.resolve("sql").unwrap().model, "zero");
    assert!(t.resolve("nope").is_none());
    assert_eq!(t.adapter_key("m", "chat").as_deref(), Some("chat@1"));
    assert_eq!(t.adapter_key("m", "cold"), None);
    let names: Vec<String> = t.adapters().into_keys().collect();
    assert_eq!(names, ["chat", "cold", "sql"]);
    // Only b has it: every request for it goes there, whatever the load.
    for i in 0..4 {
        let (name, _) = t
            .route(&chat, None, &format!("p{i}"), 0, &settings(1))
            .unwrap();
        assert_eq!(name, "b");
    }
    // An adapter no ready endpoint lists: any endpoint (the server says).
    let unlisted = Target {
        adapter: Some("new".into()),
        ..base("m")
    };
    assert!(t.route(&unlisted, None, "x", 0, &settings(1)).is_some());
    t.declare_adapters(BTreeMap::new());
    assert!(t.resolve("sql").is_none());
}

/// Two ready endpoints of `m` with one chain of `blocks` blocks.
fn two_endpoints(weights: TierWeights, blocks: u32) -> (Table<u64>, Vec<BlockHash>) {
    let mut t: Table<u64> = Table::with_weights(weights);
    t.sync(&wanted(&[("m", &[("a", true), ("b", true)])]));
    for n in ["a", "b"] {
        t.apply_events("m", n, &KvEventsPage::default());
    }
    let tokens: Vec<u32> = (0..blocks * 2).collect();
    (t, BlockHasher::new("x", 2).chain(&tokens))
}

fn held(epoch: u64, stored: &[BlockHash]) -> KvEventsPage {
    KvEventsPage {
        epoch,
        cursor: 1,
        reset: true,
        stored: stored.to_vec(),
        evicted: Vec::new(),
    }
}

fn routed(t: &mut Table<u64>, chain: &[BlockHash]) -> (String, Reason, usize) {
    let (name, d) = t
        .route(&base("m"), Some(chain), "", 0, &settings(0))
        .unwrap();
    t.finish("m", &name);
    (name, d.reason, d.predicted_hit_blocks)
}

#[test]
fn a_lower_tier_hit_outranks_none_and_yields_to_a_device_hit_as_long() {
    let (mut t, chain) = two_endpoints(TierWeights::default(), 4);
    // b's host memory holds the first two blocks; a holds nothing.
    t.apply_tier_events("m", "b", KvTier::Host, &held(3, &chain[..2]));
    assert_eq!(routed(&mut t, &chain), ("b".into(), Reason::PrefixHit, 2));
    // a's device pool holds as many: a device hit wins.
    t.apply_events("m", "a", &held(1, &chain[..2]));
    assert_eq!(routed(&mut t, &chain), ("a".into(), Reason::PrefixHit, 2));
    // A block in the device pool and on disk counts as the device's.
    t.apply_tier_events("m", "a", KvTier::Disk, &held(4, &chain[..2]));
    assert_eq!(routed(&mut t, &chain), ("a".into(), Reason::PrefixHit, 2));
}

#[test]
fn a_decision_counts_its_blocks_by_tier_before_it_expects_them() {
    let (mut t, chain) = two_endpoints(TierWeights::default(), 4);
    t.apply_tier_events("m", "b", KvTier::Host, &held(3, &chain[..2]));
    let (name, d) = t
        .route(&base("m"), Some(&chain), "", 0, &settings(5))
        .unwrap();
    assert_eq!((name.as_str(), d.predicted_by_tier), ("b", [0, 2, 0]));
    // Now expected in b's device pool: the next decision says so.
    let (_, d) = t
        .route(&base("m"), Some(&chain), "", 1, &settings(5))
        .unwrap();
    assert_eq!(d.predicted_by_tier, [4, 0, 0]);
}

#[test]
fn a_longer_disk_run_wins_or_loses_by_the_weights() {
    // a: 2 blocks in its device pool (2.0); b: 3 on disk, then its
    // device pool holds the 4th (a run of 4 across tiers).
    let setup = |w: TierWeights| {
        let (mut t, chain) = two_endpoints(w, 6);
        t.apply_events("m", "a", &held(1, &chain[..2]));
        t.apply_tier_events("m", "b", KvTier::Disk, &held(2, &chain[..3]));
        t.apply_events("m", "b", &held(1, &chain[3..4]));
        (t, chain)
    };
    // 0.5 * 3 + 1 = 2.5 > 2.0.
    let (mut t, chain) = setup(TierWeights::default());
    assert_eq!(routed(&mut t, &chain), ("b".into(), Reason::PrefixHit, 4));
    // 0.2 * 3 + 1 = 1.6 < 2.0.
    let (mut t, chain) = setup(TierWeights::parse("disk=0.2").unwrap());
    assert_eq!(routed(&mut t, &chain), ("a".into(), Reason::PrefixHit, 2));
}

#[test]
fn a_new_device_epoch_asks_a_refusing_endpoint_for_its_tiers_again() {
    let (mut t, _) = two_endpoints(TierWeights::default(), 1);
    t.apply_events("m", "a", &held(5, &[]));
    t.endpoint_mut("m", "a").unwrap().lower.refuse(KvTier::Disk);
    let ask = |t: &mut Table<u64>| t.endpoint_mut("m", "a").unwrap().lower.to_ask();
    assert_eq!(ask(&mut t), [KvTier::Host]);
    t.apply_events("m", "a", &held(5, &[]));
    assert_eq!(ask(&mut t), [KvTier::Host]);
    // Restarted (maybe upgraded): a new device epoch.
    t.apply_events("m", "a", &held(6, &[]));
    assert_eq!(ask(&mut t), [KvTier::Host, KvTier::Disk]);
}
