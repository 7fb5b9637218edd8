//! The bytes each token stands for in the output text, which a grammar engine
//! matches against: byte-level BPE (GPT-2's byte-to-character map undone) or
//! SentencePiece (`▁` for space, `<0xNN>` byte pieces). Control tokens are
//! listed apart: they never spell text.

use std::collections::HashMap;

use tokenizers::DecoderWrapper;

use crate::tokenizer::Tokenizer;

/// Every token's bytes, by id, and which ids are control tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenBytes {
    /// The bytes of token `id` at index `id`; empty where a token spells
    /// nothing (control tokens, holes in the vocabulary).
    pub tokens: Vec<Vec<u8>>,
    /// Control (special) tokens and their text, by id.
    pub special: Vec<(u32, String)>,
}

impl Tokenizer {
    /// The bytes each token adds to the output, and the control tokens.
    pub fn token_bytes(&self) -> TokenBytes {
        let inner = self.hf();
        let byte_level = inner.get_decoder().is_some_and(is_byte_level);
        let map = byte_level.then(gpt2_char_to_byte);
        let added = inner.get_added_tokens_decoder();
        let mut special: Vec<(u32, String)> = added
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(&id, t)| (id, t.content.clone()))
            .collect();
        special.sort_unstable();
        let tokens = (0..self.vocab_size() as u32)
            .map(|id| match (added.get(&id), inner.id_to_token(id)) {
                (Some(t), _) if t.special => Vec::new(),
                // Added tokens are written as plain text.
                (Some(t), _) => t.content.clone().into_bytes(),
                (None, Some(piece)) => match &map {
                    Some(map) => byte_level_bytes(&piece, map),
                    None => sentencepiece_bytes(&piece),
                },
                (None, None) => Vec::new(),
            })
            .collect();
        TokenBytes { tokens, special }
    }
}

fn is_byte_level(d: &DecoderWrapper) -> bool {
    match d {
        DecoderWrapper::ByteLevel(_) => true,
        DecoderWrapper::Sequence(s) => s.get_decoders().iter().any(is_byte_level),
        _ => false,
    }
}

/// GPT-2's map from the printable character standing for each byte back to
/// the byte: printable Latin-1 stands for itself, the rest from U+0100 on.
fn gpt2_char_to_byte() -> HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 0x100u32;
    let mut map = HashMap::with_capacity(256);
    for b in 0..=255u8 {
        let c = if printable(b) {
            char::from(b)
        } else {
            next += 1;
            char::from_u32(next - 1).unwrap_or('\u{FFFD}')
        };
        map.insert(c, b);
    }
    map
}

/// A piece that holds a character outside the map spells nothing.
fn byte_level_bytes(piece: &str, map: &HashMap<char, u8>) -> Vec<u8> {
    piece
        .chars()
        .map(|c| map.get(&c).copied())
        .collect::<Option<Vec<u8>>>()
        .unwrap_or_default()
}

fn sentencepiece_bytes(piece: &str) -> Vec<u8> {
    let hex = piece
        .strip_prefix("<0x")
        .and_then(|h| h.strip_suffix('>'))
        .filter(|h| h.len() == 2)
        .and_then(|h| u8::from_str_radix(h, 16).ok());
    match hex {
        Some(b) => vec![b],
        None => piece.replace('\u{2581}', " ").into_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_become_the_bytes_they_spell() {
        let map = gpt2_char_to_byte();
        assert_eq!(map.len(), 256);
        // (byte-level piece, bytes)
        let cases: [(&str, &[u8]); 4] = [
            ("\u{0120}the", b" the"),
            ("\u{010A}", b"\n"),
            ("{\"", b"{\""),
            ("\u{00C3}\u{00A9}", "é".as_bytes()),
        ];
        for (piece, want) in cases {
            assert_eq!(byte_level_bytes(piece, &map), want, "{piece:?}");
        }
        assert!(byte_level_bytes("\u{4E00}", &map).is_empty());
        // (SentencePiece piece, bytes)
        let cases: [(&str, &[u8]); 4] = [
            ("\u{2581}the", b" the"),
            ("<0x0A>", b"\n"),
            ("<0xZZ>", b"<0xZZ>"),
            ("ab", b"ab"),
        ];
        for (piece, want) in cases {
            assert_eq!(sentencepiece_bytes(piece), want, "{piece:?}");
        }
    }
}
