//! Prompt logprobs: every prompt token's logprob after the first, computed
//! whole even when the prompt is cached, in chunks, sent before any token.

use super::*;

/// The fake model predicts `last + 1` with logit 100 and 0 elsewhere.
fn want(prompt: &[u32]) -> Vec<Option<(u32, bool)>> {
    let mut out = vec![None];
    out.extend(prompt.windows(2).map(|w| Some((w[1], w[1] == w[0] + 1))));
    out
}

fn with_prompt_logprobs(prompt: &[u32], k: usize) -> GenerationRequest {
    let mut r = request(prompt, 2);
    r.sampling.prompt_logprobs = Some(k);
    r
}

#[test]
fn every_prompt_token_after_the_first_gets_its_logprob_even_from_a_cached_prompt() {
    // 10 tokens: three chunks of 4, 4 and 2; 9 -> 20 is a surprise.
    let prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 20];
    let mut rig = Rig::new(config());
    let mut warm = rig.submit(request(&prompt, 2));
    rig.run(20);
    assert!(outcome(&mut warm).error.is_none());
    for k in [0, 2] {
        let mut sub = rig.submit(with_prompt_logprobs(&prompt, k));
        let reports = rig.run(20);
        // Cached blocks are not taken: the whole prompt is computed.
        let line = reports[0].prefill_line.as_deref().unwrap();
        assert!(line.contains("#new-token: 10, #cached-token: 0"), "{line}");
        let o = outcome(&mut sub);
        let lp = o.prompt_logprobs.expect("prompt logprobs");
        let got: Vec<Option<(u32, bool)>> = lp
            .iter()
            .map(|e| e.as_ref().map(|t| (t.id, t.logprob > -1e-3)))
            .collect();
        assert_eq!(got, want(&prompt), "k = {k}");
        let surprise = lp[9].as_ref().unwrap();
        assert!(surprise.logprob < -50.0, "{surprise:?}");
        assert_eq!(surprise.top.len(), k);
        if k > 0 {
            assert_eq!(surprise.top[0].0, 10, "the model expected 10");
        }
        assert_eq!(o.ids, vec![21, 22]);
        rig.assert_all_blocks_back();
    }
}

#[test]
fn a_one_token_prompt_gets_one_null_entry_and_a_cancel_frees_the_blocks() {
    let mut rig = Rig::new(config());
    let mut sub = rig.submit(with_prompt_logprobs(&[7], 1));
    rig.run(20);
    let o = outcome(&mut sub);
    assert_eq!(o.prompt_logprobs, Some(vec![None]));
    assert_eq!(o.ids, vec![8, 9]);
    // Cancelled mid-prefill: nothing sent, nothing leaked.
    let long: Vec<u32> = (1..30).collect();
    let sub = rig.submit(with_prompt_logprobs(&long, 1));
    rig.tick();
    drop(sub);
    rig.run(20);
    rig.assert_all_blocks_back();
}
