//! Rows with a constraint sample only what it allows, end when it is
//! complete, fail cleanly when it breaks, and leave other rows alone.

use super::*;
use crate::TokenConstraint;
use crate::fixtures::{AllowSteps, Outcome};

fn constrained(prompt: &[u32], max_tokens: usize, c: AllowSteps, seed: u64) -> GenerationRequest {
    let mut r = request(prompt, max_tokens);
    r.sampling.temperature = 1.0;
    r.sampling.seed = seed;
    r.constraint = Some(Box::new(c));
    r
}

#[test]
fn a_masked_row_samples_only_allowed_tokens_and_stops_when_complete() {
    // The fake model's favourite next token (last + 1) is never allowed.
    let steps = vec![vec![3, 9], vec![12], vec![20, 21, 22, 23], vec![30, 31]];
    let mut rig = Rig::new(config());
    for seed in 0..8 {
        let mut sub = rig.submit(constrained(&[1], 10, AllowSteps::new(steps.clone()), seed));
        let mut free = rig.submit(request(&[5], 3));
        rig.run(20);
        let got = outcome(&mut sub);
        assert_eq!(got.ids.len(), steps.len(), "seed {seed}: {got:?}");
        for (id, allowed) in got.ids.iter().zip(&steps) {
            assert!(allowed.contains(id), "seed {seed}: {id} not in {allowed:?}");
        }
        assert_eq!(got.end, Some((FinishReason::Stop, usage(1, 4))));
        // The unconstrained row in the same batch follows the model.
        assert_eq!(outcome(&mut free).ids, vec![6, 7, 8]);
        rig.assert_all_blocks_back();
    }
}

#[test]
fn max_tokens_cuts_a_constrained_row_with_length() {
    let steps = vec![vec![3], vec![4], vec![5]];
    let mut rig = Rig::new(config());
    let mut sub = rig.submit(constrained(&[1], 2, AllowSteps::new(steps), 0));
    rig.run(20);
    let got = outcome(&mut sub);
    assert_eq!(got.ids, vec![3, 4]);
    assert_eq!(got.end, Some((FinishReason::Length, usage(1, 2))));
    rig.assert_all_blocks_back();
}

#[test]
fn a_constraint_that_breaks_fails_its_row_only_and_returns_the_blocks() {
    // (what breaks, steps before it)
    let cases = [
        (AllowSteps::failing_mask_at(1), 1),
        (AllowSteps::failing_advance_at(2), 2),
    ];
    for (c, before) in cases {
        let mut rig = Rig::new(config());
        let mut sub = rig.submit(constrained(&[1], 10, c, 0));
        let mut free = rig.submit(request(&[5], 3));
        rig.run(20);
        let got: Outcome = outcome(&mut sub);
        assert_eq!(got.ids.len(), before, "{got:?}");
        let err = got.error.expect("the row fails");
        assert!(err.contains("structured output"), "{err}");
        assert_eq!(outcome(&mut free).ids, vec![6, 7, 8]);
        rig.assert_all_blocks_back();
    }
}

#[test]
fn a_fork_is_independent_of_its_original() {
    let mut a = AllowSteps::new(vec![vec![1], vec![2]]);
    let mut logits = vec![0.0; VOCAB];
    a.mask(&mut logits).unwrap();
    a.advance(1).unwrap();
    let mut b = a.fork();
    b.mask(&mut logits).unwrap();
    b.advance(2).unwrap();
    assert!(b.is_finished() && !a.is_finished());
}
