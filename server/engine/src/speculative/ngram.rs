//! The n-gram proposer (prompt lookup): the tokens that followed the last
//! time the sequence's tail occurred earlier in the prompt or the output.
//! Pure, and one pass over the history: a step's proposals cost a
//! fraction of a millisecond however many rows propose.

/// The prompt lookup's bounds: suffixes of `min..=max` tokens are matched,
/// and at most `k` tokens proposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lookup {
    /// Shortest suffix that counts as a match.
    pub min: usize,
    /// Longest suffix matched.
    pub max: usize,
    /// Most tokens proposed.
    pub k: usize,
}

/// Up to `lookup.k` draft tokens for the sequence `prompt` then `output`
/// (whose last token is the one about to be fed), and the end of the
/// occurrence they were read from: the tokens after the earlier occurrence
/// of its longest suffix of `min..=max` tokens. Among equally long ones,
/// the occurrence ending at `follow` (the one the last draft was read
/// from, moved on by the tokens fed since: a copy goes on where it was,
/// not at a later repeat of the same few tokens), else the most recent.
/// `None` when no suffix of `min` tokens occurs earlier. Never runs past
/// the end of the history.
pub fn propose_following(
    prompt: &[u32],
    output: &[u32],
    lookup: Lookup,
    follow: Option<usize>,
) -> Option<(Vec<u32>, usize)> {
    let len = prompt.len() + output.len();
    let at = |i: usize| match i.checked_sub(prompt.len()) {
        None => prompt[i],
        Some(j) => output[j],
    };
    let (min, max) = (lookup.min.max(1), lookup.max.max(lookup.min.max(1)));
    if lookup.k == 0 || len < min + 1 {
        return None;
    }
    // How long a suffix the occurrence ending at `end` matches.
    let matched = |end: usize| {
        (0..max.min(end + 1))
            .take_while(|&j| at(end - j) == at(len - 1 - j))
            .count()
    };
    // (end of the occurrence, its length), longest first; the followed
    // one, then the latest, among equals.
    let mut best = follow
        .filter(|&end| end < len - 1)
        .map(|end| (end, matched(end)))
        .filter(|&(_, n)| n >= min);
    for end in (0..len - 1).rev() {
        if best.is_some_and(|(_, n)| n == max) {
            break;
        }
        let n = matched(end);
        if n >= min && best.is_none_or(|(_, b)| n > b) {
            best = Some((end, n));
        }
    }
    let (end, _) = best?;
    let from = end + 1;
    let to = from.saturating_add(lookup.k).min(len);
    Some(((from..to).map(at).collect(), end))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The draft alone, following no earlier one.
    fn propose(prompt: &[u32], output: &[u32], lookup: Lookup) -> Vec<u32> {
        propose_following(prompt, output, lookup, None).map_or_else(Vec::new, |(d, _)| d)
    }

    fn lookup(min: usize, max: usize, k: usize) -> Lookup {
        Lookup { min, max, k }
    }

    #[test]
    fn proposals_on_fixed_histories() {
        // (history, lookup, expected draft)
        type Case = (&'static [u32], Lookup, &'static [u32]);
        let cases: [Case; 13] = [
            // The tail [2, 3] occurred at the start: what followed it.
            (&[1, 2, 3, 4, 5, 9, 2, 3], lookup(2, 4, 3), &[4, 5, 9]),
            // k bounds the draft.
            (&[1, 2, 3, 4, 5, 9, 2, 3], lookup(2, 4, 1), &[4]),
            // ... and so does the end of the history.
            (&[7, 8, 6, 7, 8], lookup(2, 4, 5), &[6, 7, 8]),
            // The longest suffix wins over a later, shorter one: [1, 2, 3]
            // occurred once, [2, 3] later too.
            (&[1, 2, 3, 7, 0, 2, 3, 8, 1, 2, 3], lookup(1, 3, 2), &[7, 0]),
            // Among equally long ones, the latest.
            (&[5, 6, 1, 5, 6, 2, 5, 6], lookup(2, 2, 1), &[2]),
            // max caps the match: with max 2, [2, 3] ties and the latest wins.
            (&[1, 2, 3, 7, 0, 2, 3, 8, 1, 2, 3], lookup(1, 2, 2), &[8, 1]),
            // Nothing as long as min occurred before: no draft.
            (&[1, 2, 3, 4, 3], lookup(2, 3, 4), &[]),
            // ... but a single token does with min 1.
            (&[1, 2, 3, 4, 3], lookup(1, 3, 4), &[4, 3]),
            // A run of one token: its latest earlier copy is one short.
            (&[4, 4, 4, 4], lookup(1, 2, 5), &[4]),
            // Too short a history, or k 0: nothing.
            (&[3, 3], lookup(2, 2, 4), &[]),
            (&[1, 2, 1, 2], lookup(1, 2, 0), &[]),
            (&[9], lookup(1, 1, 3), &[]),
            (&[], lookup(1, 1, 3), &[]),
        ];
        for (history, l, want) in cases {
            assert_eq!(propose(history, &[], l), want, "{history:?} {l:?}");
            // Wherever the prompt ends, the history is the same.
            for split in 0..=history.len() {
                let (p, o) = history.split_at(split);
                assert_eq!(propose(p, o, l), want, "{p:?} + {o:?} {l:?}");
            }
        }
    }

    #[test]
    fn a_copy_goes_on_where_it_was() {
        // The source [1 2 3 4 | 1 2 3 5 ...] and a copy under way that has
        // reached [1 2 3]: the latest [1 2 3] is followed by 5, but the
        // copy was reading the first (ending at index 2).
        let h: &[u32] = &[1, 2, 3, 4, 9, 1, 2, 3, 5, 8, 1, 2, 3];
        let l = lookup(2, 3, 2);
        // (follow, expected draft, expected end)
        let cases: [(Option<usize>, &[u32], usize); 4] = [
            (None, &[5, 8], 7),
            (Some(2), &[4, 9], 2),
            // A followed occurrence that no longer matches: the longest.
            (Some(3), &[5, 8], 7),
            // Past the history: ignored.
            (Some(40), &[5, 8], 7),
        ];
        for (follow, want, end) in cases {
            let got = propose_following(h, &[], l, follow);
            assert_eq!(got, Some((want.to_vec(), end)), "{follow:?}");
        }
        // A longer match elsewhere still wins over the followed one.
        let h: &[u32] = &[7, 2, 3, 6, 1, 2, 3, 5, 1, 2, 3];
        assert_eq!(
            propose_following(h, &[], lookup(2, 3, 1), Some(2)),
            Some((vec![5], 6))
        );
    }

    #[test]
    fn a_draft_is_always_a_continuation_seen_before_and_bounded() {
        // Every draft is found in the history right after an earlier copy of
        // at least `min` tokens of its tail, and is at most k long.
        let history: Vec<u32> = (0..300u32).map(|i| (i * 7 + i / 13) % 11).collect();
        for end in 1..history.len() {
            let h = &history[..end];
            for l in [lookup(1, 1, 3), lookup(2, 4, 5), lookup(3, 3, 8)] {
                let draft = propose(h, &[], l);
                assert!(draft.len() <= l.k);
                if draft.is_empty() {
                    continue;
                }
                let tail = &h[h.len() - l.min..];
                let seen = (0..h.len() - l.min)
                    .any(|s| h[s..s + l.min] == *tail && h[s + l.min..].starts_with(&draft));
                assert!(seen, "{h:?} {l:?} -> {draft:?}");
            }
        }
    }
}
