//! Which inputs the next pooling batch runs: strictly FIFO, input by
//! input from the head of the line, until the next input would pass the
//! token budget or the sequence cap (a head that does not fit stops the
//! line; one never runs ahead of another).

/// One input of a batch: the job's place in the line, and the input's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot {
    /// Index of the job in the line.
    pub job: usize,
    /// Index of the input in the job.
    pub input: usize,
}

/// The batch over `line`, each job given as `(next input, every input's
/// length)`: at most `max_tokens` tokens and `max_seqs` inputs.
pub(crate) fn plan_batch(
    line: &[(usize, &[usize])],
    max_tokens: usize,
    max_seqs: usize,
) -> Vec<Slot> {
    let mut out = Vec::new();
    let mut tokens = 0usize;
    for (job, &(next, lens)) in line.iter().enumerate() {
        for (input, &n) in lens.iter().enumerate().skip(next) {
            let total = tokens.saturating_add(n);
            if total > max_tokens || out.len() >= max_seqs {
                return out;
            }
            tokens = total;
            out.push(Slot { job, input });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_takes_inputs_in_line_order_until_the_next_does_not_fit() {
        let slot = |job, input| Slot { job, input };
        // (line: (next, lens) per job, max tokens, max seqs, batch)
        type Case<'a> = (Vec<(usize, &'a [usize])>, usize, usize, Vec<Slot>);
        let cases: Vec<Case> = vec![
            (vec![], 10, 4, vec![]),
            (
                vec![(0, &[3, 3]), (0, &[4])],
                10,
                8,
                vec![slot(0, 0), slot(0, 1), slot(1, 0)],
            ),
            // The head's second input does not fit: nothing behind it runs,
            // though the next job's would.
            (vec![(0, &[6, 5]), (0, &[1])], 10, 8, vec![slot(0, 0)]),
            // A job part done goes on where it stopped.
            (
                vec![(1, &[6, 5]), (0, &[4])],
                10,
                8,
                vec![slot(0, 1), slot(1, 0)],
            ),
            // The sequence cap.
            (vec![(0, &[1, 1, 1])], 10, 2, vec![slot(0, 0), slot(0, 1)]),
            // Exactly the budget.
            (vec![(0, &[5, 5])], 10, 8, vec![slot(0, 0), slot(0, 1)]),
        ];
        for (line, tokens, seqs, want) in cases {
            assert_eq!(plan_batch(&line, tokens, seqs), want, "{line:?}");
        }
    }
}
