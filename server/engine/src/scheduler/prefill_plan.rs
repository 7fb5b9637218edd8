//! Which prompts prefill how many tokens this tick: a token budget shared
//! round-robin over the prompts still prefilling. Pure.

use std::collections::VecDeque;

use crate::job::RequestId;

/// Plans this tick's prefill chunks as `(id, tokens)`, in order.
///
/// Takes the front of `order`, gives it `min(left, budget remaining)` tokens
/// (`left(id)`: its prompt tokens not yet in the KV), and moves it to the back
/// if it still has tokens left after that; then the next, until the budget is
/// spent or every prompt in `order` got its one chunk. A prompt with nothing
/// left is dropped from `order`. A budget of 0 counts as 1.
pub(crate) fn plan_prefill(
    order: &mut VecDeque<RequestId>,
    left: impl Fn(RequestId) -> usize,
    budget: usize,
) -> Vec<(RequestId, usize)> {
    let mut budget = budget.max(1);
    let mut chunks = Vec::new();
    for _ in 0..order.len() {
        if budget == 0 {
            break;
        }
        let Some(id) = order.pop_front() else {
            break;
        };
        let left = left(id);
        if left == 0 {
            continue;
        }
        let n = left.min(budget);
        budget -= n;
        chunks.push((id, n));
        if n < left {
            order.push_back(id);
        }
    }
    chunks
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Runs ticks until every prompt is done; returns each tick's chunks.
    fn ticks(prompts: &[(RequestId, usize)], budget: usize) -> Vec<Vec<(RequestId, usize)>> {
        let mut left: HashMap<RequestId, usize> = prompts.iter().copied().collect();
        let mut order: VecDeque<RequestId> = prompts.iter().map(|p| p.0).collect();
        let mut out = Vec::new();
        while !order.is_empty() {
            let chunks = plan_prefill(&mut order, |id| left[&id], budget);
            for (id, n) in &chunks {
                *left.get_mut(id).unwrap() -= n;
            }
            out.push(chunks);
        }
        out
    }

    #[test]
    fn the_budget_is_shared_round_robin_one_chunk_per_prompt_per_tick() {
        // Budget 4, prompts of 6 and 3: a takes the whole first tick and goes
        // to the back; b then finishes and a gets the rest of the budget.
        assert_eq!(
            ticks(&[(0, 6), (1, 3)], 4),
            vec![vec![(0, 4)], vec![(1, 3), (0, 1)], vec![(0, 1)]]
        );
        // A budget that covers every prompt prefills them all in one tick.
        let short: Vec<_> = (0..8).map(|id| (id, 4)).collect();
        assert_eq!(ticks(&short, 32), vec![short.clone()]);
        // A lone long prompt is bounded by the budget every tick.
        assert_eq!(
            ticks(&[(0, 10)], 4),
            vec![vec![(0, 4)], vec![(0, 4)], vec![(0, 2)]]
        );
    }

    #[test]
    fn no_prompt_starves() {
        // Four long prompts and a budget of 3: every window of four ticks
        // serves every prompt still prefilling.
        let out = ticks(&[(0, 9), (1, 9), (2, 9), (3, 9)], 3);
        assert_eq!(out.len(), 12);
        for window in out.windows(4) {
            let mut served: Vec<RequestId> = window.iter().flatten().map(|c| c.0).collect();
            served.sort_unstable();
            served.dedup();
            assert_eq!(served, vec![0, 1, 2, 3]);
        }
    }

    #[test]
    fn done_prompts_leave_the_order_and_a_zero_budget_still_progresses() {
        let mut order = VecDeque::from([5, 6]);
        let chunks = plan_prefill(&mut order, |id| if id == 5 { 0 } else { 2 }, 0);
        assert_eq!(chunks, vec![(6, 1)]);
        assert_eq!(order, VecDeque::from([6]));
    }
}
