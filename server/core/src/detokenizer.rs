//! Incremental detokenization for streaming.
//!
//! Decoding token by token is wrong for byte-level and byte-fallback
//! vocabularies: one character may span several tokens, and SentencePiece
//! drops a leading space only at the start of text. So we decode a short
//! window twice (without and with the new tokens) and emit the difference,
//! holding it back while it ends in an incomplete character (U+FFFD).

use crate::error::Error;
use crate::tokenizer::Tokenizer;

/// Turns a stream of token ids into a stream of text pieces.
#[derive(Debug, Clone, Default)]
pub struct Detokenizer {
    ids: Vec<u32>,
    /// Start of the window that gives context to the pending tokens.
    prefix: usize,
    /// End of the text already emitted.
    read: usize,
    skip_special_tokens: bool,
}

impl Detokenizer {
    /// A detokenizer; `skip_special_tokens` leaves control tokens out of the text.
    pub fn new(skip_special_tokens: bool) -> Self {
        Self {
            skip_special_tokens,
            ..Self::default()
        }
    }

    /// Adds one token; returns the text it completes (maybe empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String, Error> {
        self.ids.push(id);
        let skip = self.skip_special_tokens;
        let decoded = tokenizer
            .decode(&self.ids[self.prefix..self.read], skip)
            .and_then(|before| Ok((before, tokenizer.decode(&self.ids[self.prefix..], skip)?)));
        let (before, after) = match decoded {
            Ok(texts) => texts,
            Err(e) => {
                // A bad id must not poison the stream for the ids after it.
                self.ids.pop();
                return Err(e);
            }
        };
        if after.len() <= before.len() || after.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        // The window's text only grows at the end; if a decoder ever rewrote
        // earlier text, wait and let `finish` settle it rather than emit garbage.
        let Some(delta) = after.strip_prefix(before.as_str()) else {
            return Ok(String::new());
        };
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(delta.to_string())
    }

    /// Emits whatever is still held back (e.g. bytes that never formed a character).
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<String, Error> {
        let skip = self.skip_special_tokens;
        let before = tokenizer.decode(&self.ids[self.prefix..self.read], skip)?;
        let after = tokenizer.decode(&self.ids[self.prefix..], skip)?;
        let released = match after.strip_prefix(before.as_str()) {
            Some(delta) => delta.to_string(),
            // The held tokens rewrote the window's earlier text (bytes that
            // never formed a character spoil a whole byte run): release
            // them on their own rather than drop them.
            None => tokenizer.decode(&self.ids[self.read..], skip)?,
        };
        // Keep the window's start so that later pushes still have context.
        self.read = self.ids.len();
        Ok(released)
    }

    /// All token ids pushed so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::tests::{tiny_gpt2, tiny_llama};

    fn stream(tok: &Tokenizer, ids: &[u32]) -> Vec<String> {
        let mut d = Detokenizer::new(false);
        let mut out: Vec<String> = ids.iter().map(|&id| d.push(tok, id).unwrap()).collect();
        out.push(d.finish(tok).unwrap());
        out
    }

    #[test]
    fn byte_fallback_holds_split_characters() {
        let tok = Tokenizer::from_gguf(&tiny_llama()).unwrap();
        let id = |t: &str| tok.token_to_id(t).unwrap();
        // "hi 🚀 the": the rocket is four byte-fallback tokens.
        let ids = [
            id("▁hi"),
            id("▁"),
            id("<0xF0>"),
            id("<0x9F>"),
            id("<0x9A>"),
            id("<0x80>"),
            id("▁the"),
        ];
        let pieces = stream(&tok, &ids);
        assert_eq!(pieces, ["hi", " ", "", "", "", "🚀", " the", ""]);
        assert_eq!(pieces.concat(), tok.decode(&ids, false).unwrap());
    }

    #[test]
    fn leading_space_is_stripped_once() {
        let tok = Tokenizer::from_gguf(&tiny_llama()).unwrap();
        let ids = tok.encode("hi the hi", false).unwrap();
        let pieces = stream(&tok, &ids);
        assert_eq!(pieces.concat(), "hi the hi");
        assert_eq!(pieces[0], "hi");
    }

    #[test]
    fn byte_level_text_streams_whole_tokens() {
        let tok = Tokenizer::from_gguf(&tiny_gpt2()).unwrap();
        let pieces = stream(&tok, &[16, 11, 15]);
        assert_eq!(pieces, ["<|im_start|>", "hello", " world", ""]);
        let mut skipping = Detokenizer::new(true);
        assert_eq!(skipping.push(&tok, 16).unwrap(), "");
        assert_eq!(skipping.push(&tok, 11).unwrap(), "hello");
        assert_eq!(skipping.ids(), &[16, 11]);
    }

    #[test]
    fn bytes_that_spoil_a_run_still_come_out_at_finish() {
        let tok = Tokenizer::from_gguf(&tiny_llama()).unwrap();
        let id = |t: &str| tok.token_to_id(t).unwrap();
        // "!" and NUL are whole characters, sent at once; a lone 0x80 then
        // makes the whole run decode as replacements, and must still be
        // released rather than dropped.
        let ids = [id("<0x21>"), id("<0x00>"), id("<0x80>")];
        assert_eq!(stream(&tok, &ids), ["!", "\0", "", "\u{FFFD}"]);
    }

    #[test]
    fn unfinished_bytes_come_out_at_finish() {
        let tok = Tokenizer::from_gguf(&tiny_llama()).unwrap();
        let id = |t: &str| tok.token_to_id(t).unwrap();
        let mut d = Detokenizer::new(false);
        assert_eq!(d.push(&tok, id("▁hi")).unwrap(), "hi");
        assert_eq!(d.push(&tok, id("<0xF0>")).unwrap(), "");
        assert!(d.push(&tok, 9999).is_err());
        assert_eq!(d.ids().len(), 2);
        assert_eq!(d.finish(&tok).unwrap(), "\u{FFFD}");
        assert_eq!(d.push(&tok, id("▁hi")).unwrap(), " hi");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 500,
            failure_persistence: None,
            ..Default::default()
        })]

        /// Over any stream of ids, in or out of the vocabulary: an id outside
        /// it is refused and changes nothing, and the pieces plus what
        /// `finish` releases are exactly the decode of the accepted ids.
        #[test]
        fn pieces_add_up_to_the_decode_of_the_stream(
            llama in proptest::bool::ANY,
            skip in proptest::bool::ANY,
            picks in proptest::collection::vec(0u32..300, 0..40),
        ) {
            let tok = if llama {
                Tokenizer::from_gguf(&tiny_llama()).unwrap()
            } else {
                Tokenizer::from_gguf(&tiny_gpt2()).unwrap()
            };
            let size = tok.vocab_size() as u32;
            let mut d = Detokenizer::new(skip);
            let (mut text, mut accepted) = (String::new(), Vec::new());
            for id in picks {
                // Mostly ids in the vocabulary, a few just past it.
                let id = if id < 290 { id % size } else { size + id - 290 };
                match d.push(&tok, id) {
                    Ok(piece) => {
                        accepted.push(id);
                        // Never half a character held back as a replacement.
                        proptest::prop_assert!(!piece.ends_with(char::REPLACEMENT_CHARACTER), "{piece:?}");
                        text.push_str(&piece);
                    }
                    Err(_) => proptest::prop_assert!(id >= size),
                }
            }
            text.push_str(&d.finish(&tok).unwrap());
            proptest::prop_assert_eq!(d.ids(), &accepted[..]);
            let whole = tok.decode(&accepted, skip).unwrap();
            // Text once sent is never taken back, so where bytes never formed
            // a character (the whole decode then rewrites their run) the two
            // may differ; otherwise they are the same text.
            if !whole.contains(char::REPLACEMENT_CHARACTER) {
                proptest::prop_assert_eq!(&text, &whole);
            }
            // Nothing is lost: every token that has text alone shows up.
            proptest::prop_assert_eq!(text.is_empty(), whole.is_empty());
        }
    }
}
