//! Admission decisions: whether a request could ever fit (checked at the door)
//! and whether the head of the line fits now (checked each tick). Pure.

use crate::{EngineConfig, EngineError};

/// KV blocks a request reserves for its whole life: prompt plus everything it
/// may generate. Saturating: a sum past `usize::MAX` asks for every block.
pub fn blocks_needed(prompt_tokens: usize, max_tokens: usize, block_size: usize) -> usize {
    prompt_tokens
        .saturating_add(max_tokens)
        .div_ceil(block_size.max(1))
}

/// Refuses, at submission, a request an empty server could not hold; returns
/// the blocks it will reserve.
pub fn check_fits(
    prompt_tokens: usize,
    max_tokens: usize,
    config: &EngineConfig,
) -> Result<usize, EngineError> {
    if prompt_tokens == 0 {
        return Err(EngineError::invalid("prompt", "the prompt is empty"));
    }
    if max_tokens == 0 {
        return Err(EngineError::invalid(
            "max_tokens",
            "max_tokens must be at least 1",
        ));
    }
    // Client numbers: saturating, so no sum can wrap below the limit.
    let needed = prompt_tokens.saturating_add(max_tokens);
    let pool_tokens = config.kv_blocks.saturating_mul(config.block_size);
    let limit = config.max_model_len.min(pool_tokens);
    if needed > limit {
        return Err(EngineError::TooLong {
            prompt_tokens,
            max_tokens,
            needed_tokens: needed,
            limit_tokens: limit,
        });
    }
    Ok(blocks_needed(prompt_tokens, max_tokens, config.block_size))
}

/// Whether the head of the line can be admitted now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Both caps allow it.
    Yes,
    /// `max_seqs` rows are already running.
    SeqCap,
    /// Not enough free blocks.
    BlockCap,
}

/// The two caps: rows (prefilling and decoding alike) and free blocks.
pub fn admit_head(running: usize, max_seqs: usize, needed: usize, free: usize) -> Admit {
    if running >= max_seqs {
        Admit::SeqCap
    } else if needed > free {
        Admit::BlockCap
    } else {
        Admit::Yes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> EngineConfig {
        EngineConfig {
            max_model_len: 100,
            block_size: 4,
            kv_blocks: 20,
            ..EngineConfig::default()
        }
    }

    #[test]
    fn refusal_at_the_door_names_the_numbers() {
        // (prompt, max_tokens, expected)
        let cases: Vec<(usize, usize, Result<usize, &str>)> = vec![
            (10, 6, Ok(4)),
            (10, 7, Ok(5)),
            (0, 5, Err("prompt")),
            (5, 0, Err("max_tokens")),
            // The pool holds 80 tokens, less than max_model_len.
            (70, 10, Ok(20)),
            (70, 11, Err("81 tokens")),
            // Sums past usize::MAX saturate rather than wrap to a small count.
            (5, usize::MAX, Err("max_tokens")),
            (usize::MAX, usize::MAX, Err("TooLong")),
            (1, usize::MAX - 1, Err("TooLong")),
        ];
        for (prompt, max, want) in cases {
            let got = check_fits(prompt, max, &config());
            match (got, want) {
                (Ok(b), Ok(w)) => assert_eq!(b, w),
                (Err(e), Err(w)) => {
                    let text = format!("{e} {e:?}");
                    assert!(text.contains(w), "{text}");
                }
                (g, w) => panic!("{prompt}+{max}: {g:?} vs {w:?}"),
            }
        }
        let err = check_fits(70, 11, &config()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "this request needs 81 tokens (70 prompt + 11 max_tokens), more than the \
             server's limit of 80 tokens"
        );
    }

    #[test]
    fn both_caps() {
        let cases = [
            (0, 2, 5, 5, Admit::Yes),
            (2, 2, 1, 5, Admit::SeqCap),
            (1, 2, 6, 5, Admit::BlockCap),
        ];
        for (running, max, needed, free, want) in cases {
            assert_eq!(admit_head(running, max, needed, free), want);
        }
    }
}
