//! A draft model proposing through the worker: a draft identical to the
//! target has every draft accepted, output is exactly the events without
//! speculation, a draft pool too small or a failing draft only costs the
//! drafts, and every draft block goes back when the rows end.

use super::*;

/// A fake draft (the target's own rule: next is last + 1) of `blocks`
/// blocks of 2 tokens (another geometry than the target's blocks of 4).
fn fake_draft(blocks: usize) -> FakeModel {
    let mut draft = FakeModel::new(2);
    draft.pools = pools(&[(CacheKind::Full, blocks)]);
    draft
}

/// Every request of `makers` together under `cfg`, drafted by `draft`;
/// each one's events, the verifications, and the rig.
fn run_drafted(
    cfg: EngineConfig,
    draft: FakeModel,
    makers: &[fn() -> GenerationRequest],
) -> (Vec<Vec<Event>>, Vec<Verified>, Rig) {
    let mut rig = Rig::new(cfg);
    rig.s
        .set_draft(Box::new(draft))
        .expect("a draft the target takes");
    let mut subs: Vec<Submission> = makers.iter().map(|m| rig.submit(m())).collect();
    let reports = rig.run(400);
    let verified = reports.into_iter().flat_map(|r| r.verified).collect();
    (subs.iter_mut().map(events).collect(), verified, rig)
}

#[test]
fn a_draft_identical_to_the_target_has_every_draft_accepted() {
    // Rows with nothing to end them early or mask the model's choice.
    let makers: Vec<fn() -> GenerationRequest> = vec![
        || past_eos(&[5, 6, 7], 44),
        || past_eos(&COPY, 12),
        || past_eos(&[1, 2, 3, 4, 5, 6, 7, 8, 1, 2], 4),
        || past_eos(&[17, 3, 25, 9, 11, 2, 30, 8, 1, 6, 14, 22, 19], 30),
    ];
    let (want, _, _) = run_all(plain(), &makers);
    let (got, verified, rig) = run_drafted(speculating(5), fake_draft(64), &makers);
    assert_eq!(uncached(got), uncached(want));
    let drafted: usize = verified.iter().map(|v| v.drafted).sum();
    let accepted: usize = verified.iter().map(|v| v.accepted).sum();
    // Unlike n-gram lookup, a draft model proposes for a prompt with
    // nothing to copy too.
    assert!(drafted > 40, "{drafted} drafted");
    assert_eq!(accepted, drafted, "{verified:?}");
    rig.assert_all_blocks_back();
    let draft = rig.s.draft_stats().unwrap();
    assert_eq!((draft.reserved, draft.held, draft.free), (0, 0, 64));
}

#[test]
fn every_request_gets_exactly_the_events_it_gets_without_speculation() {
    let makers = requests();
    let (want, _, _) = run_all(plain(), &makers);
    let want = uncached(want);
    // Roomy, cramped (a row or two at a time holds a draft lease; the
    // others decode without drafts), and failing every other step.
    let mut failing = fake_draft(64);
    failing.fail_next = 7;
    for (name, draft) in [
        ("roomy", fake_draft(64)),
        ("cramped", fake_draft(12)),
        ("failing", failing),
    ] {
        let (got, verified, rig) = run_drafted(speculating(4), draft, &makers);
        assert_eq!(uncached(got), want, "{name}");
        let accepted: usize = verified.iter().map(|v| v.accepted).sum();
        assert!(accepted > 10, "{name}: {accepted} accepted");
        rig.assert_all_blocks_back();
        let stats = rig.s.draft_stats().unwrap();
        assert_eq!(stats.reserved, 0, "{name}: draft blocks kept");
        assert_eq!(stats.free, stats.total, "{name}");
    }
}

#[test]
fn draft_blocks_go_back_when_rows_end_or_are_cancelled() {
    let mut rig = Rig::new(speculating(4));
    rig.s.set_draft(Box::new(fake_draft(128))).unwrap();
    let before = rig.s.draft_stats().unwrap().free;
    let mut subs: Vec<Submission> = (0..4u32)
        .map(|i| rig.submit(past_eos(&[i + 1, i + 2, i + 3, i + 9, i + 4], 40)))
        .collect();
    for _ in 0..6 {
        rig.tick();
    }
    // Drafting: each row holds a lease (reserved for its whole life).
    let during = rig.s.draft_stats().unwrap();
    assert_eq!(during.reserved, 4 * (5 + 40usize).div_ceil(2));
    assert!(during.held > 0);
    // Two cancelled mid-run, two run to the end.
    rig.h.cancel(subs[0].id());
    drop(subs.remove(1));
    rig.run(400);
    let after = rig.s.draft_stats().unwrap();
    assert_eq!((after.free, after.reserved), (before, 0));
    rig.assert_all_blocks_back();
}

#[test]
fn a_draft_the_target_cannot_verify_is_refused_with_the_reason() {
    let mut windowed = FakeModel::new(2);
    windowed.pools = pools(&[(CacheKind::Full, 8), (CacheKind::Window(4), 8)]);
    let mut rig = Rig::new(speculating(4));
    let err = rig.s.set_draft(Box::new(windowed)).unwrap_err().to_string();
    assert!(err.contains("not full attention alone"), "{err}");
    // Speculation off: a draft has nothing to do.
    let mut off = Rig::new(plain());
    let err = off
        .s
        .set_draft(Box::new(fake_draft(8)))
        .unwrap_err()
        .to_string();
    assert!(err.contains("speculative decoding is off"), "{err}");
}
