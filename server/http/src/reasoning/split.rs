//! One answer's reasoning splitter: the family's reader, fed token by
//! token, and the count of reasoning tokens.

use super::choice::ReasoningFamily;
use super::harmony::Harmony;
use super::piece::{Found, Piece};
use super::think::Think;

#[derive(Debug)]
enum Reader {
    Think(Think),
    Harmony(Harmony),
}

/// Splits one answer into reasoning and the rest.
#[derive(Debug)]
pub struct Splitter {
    reader: Reader,
    /// Tokens whose text is all held back: counted with what it turns out
    /// to be.
    pending: usize,
    reasoning_tokens: usize,
}

impl Splitter {
    /// A splitter for `family`; `open`: the prompt opened its block.
    pub fn new(family: ReasoningFamily, open: bool) -> Self {
        let reader = match family {
            ReasoningFamily::Think { open: always, tags } => {
                Reader::Think(Think::new(always || open, tags))
            }
            ReasoningFamily::Harmony => Reader::Harmony(Harmony::default()),
        };
        Splitter {
            reader,
            pending: 0,
            reasoning_tokens: 0,
        }
    }

    /// The text of `tokens` more generated tokens (0 for text that is no
    /// token's, such as the detokenizer's last flush).
    pub fn push(&mut self, text: &str, tokens: usize) -> Vec<Piece> {
        let mut found = Found::default();
        match &mut self.reader {
            Reader::Think(r) => r.push(text, &mut found),
            Reader::Harmony(r) => r.push(text, &mut found),
        }
        self.count(tokens, &found);
        found.pieces
    }

    /// The output ended: what was held back.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut found = Found::default();
        match &mut self.reader {
            Reader::Think(r) => r.finish(&mut found),
            Reader::Harmony(r) => r.finish(&mut found),
        }
        self.count(0, &found);
        found.pieces
    }

    /// Generated tokens that were reasoning (its text or its markup).
    pub fn reasoning_tokens(&self) -> usize {
        self.reasoning_tokens
    }

    /// A token is reasoning's when some of its bytes were; one whose bytes
    /// were all held back is counted once they are placed.
    fn count(&mut self, tokens: usize, found: &Found) {
        self.pending += tokens;
        if found.reasoning {
            self.reasoning_tokens += self.pending;
            self.pending = 0;
        } else if !found.pieces.is_empty() {
            self.pending = 0;
        }
    }
}
