//! BERT's WordPiece tokenizer from GGUF metadata (`tokenizer.ggml.model`
//! `bert`). llama.cpp's converter writes the vocabulary with a phantom
//! space: a word-initial piece as `▁piece`, a continuation (`##piece` in
//! the Hugging Face file) bare, control tokens as they are; this turns it
//! back. Text is lowercased and split as BERT's tokenizer does (llama.cpp's
//! WPM tokenizer lowercases too); `[CLS]` and `[SEP]` are the file's BOS and
//! EOS, added by the caller as for every GGUF vocabulary.

use tokenizers::decoders::wordpiece::WordPiece as WordPieceDecoder;
use tokenizers::models::wordpiece::WordPiece;
use tokenizers::normalizers::bert::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;

use crate::error::Error;
use crate::gguf_vocab::{GgufVocab, TOKEN_TYPE_CONTROL};

/// The phantom space llama.cpp puts before a word-initial piece.
const PHANTOM: char = '\u{2581}';

/// The Hugging Face spelling of GGUF token `text` of type `ty`.
fn hf_piece(text: &str, ty: i32) -> String {
    match text.strip_prefix(PHANTOM) {
        _ if ty == TOKEN_TYPE_CONTROL => text.to_string(),
        Some(word) => word.to_string(),
        None => format!("##{text}"),
    }
}

/// A tokenizer over `vocab`'s WordPiece vocabulary.
pub(crate) fn tokenizer(vocab: &GgufVocab) -> Result<tokenizers::Tokenizer, Error> {
    let pieces = vocab.tokens.iter().enumerate().map(|(i, t)| {
        let ty = vocab.token_types.as_ref().and_then(|t| t.get(i)).copied();
        (hf_piece(t, ty.unwrap_or(1)), i as u32)
    });
    let unk = vocab.token(vocab.unk_id).unwrap_or("[UNK]").to_string();
    let model = WordPiece::builder()
        .vocab(pieces.collect::<tokenizers::models::bpe::Vocab>())
        .unk_token(unk)
        .build()
        .map_err(|e| Error::InvalidVocab(format!("a WordPiece vocabulary: {e}")))?;
    let mut t = tokenizers::Tokenizer::new(model);
    t.with_normalizer(Some(BertNormalizer::new(true, true, None, true)))
        .map_err(|e| Error::Tokenizer(e.to_string()))?;
    t.with_pre_tokenizer(Some(BertPreTokenizer));
    t.with_decoder(Some(WordPieceDecoder::default()));
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phantom_spaced_pieces_read_back_as_wordpiece() {
        for (text, ty, want) in [
            ("\u{2581}paris", 1, "paris"),
            ("is", 1, "##is"),
            ("[CLS]", TOKEN_TYPE_CONTROL, "[CLS]"),
        ] {
            assert_eq!(hf_piece(text, ty), want);
        }
    }
}
