//! SentencePiece's Unigram tokenizer from GGUF metadata (`tokenizer.ggml.model`
//! `t5`: XLM-RoBERTa's bge-m3 and multilingual-e5, T5). llama.cpp's
//! converter writes the pieces with their scores and the model's
//! normalization as SentencePiece compiled it (`precompiled_charsmap`:
//! NFKC and the rest as one table), whether a space is put before the text
//! (`add_space_prefix`) and whether runs of spaces are merged and the ends
//! stripped (`remove_extra_whitespaces`). This is the same pipeline as the
//! `tokenizer.json` transformers makes of a SentencePiece model: the
//! charsmap, the whitespace rule, then `▁` for every space and the pieces of
//! the most likely split of each word.

use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::unigram::Unigram;
use tokenizers::normalizers::precompiled::Precompiled;
use tokenizers::normalizers::replace::{Replace, ReplacePattern};
use tokenizers::normalizers::{NormalizerWrapper, Sequence, Strip};
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};

use crate::error::Error;
use crate::gguf_vocab::GgufVocab;

/// A tokenizer over `vocab`'s Unigram pieces and normalization.
pub(crate) fn tokenizer(vocab: &GgufVocab) -> Result<tokenizers::Tokenizer, Error> {
    let scores = vocab
        .scores
        .as_ref()
        .ok_or_else(|| Error::InvalidVocab("a Unigram vocabulary without scores".into()))?;
    let pieces = vocab
        .tokens
        .iter()
        .zip(scores)
        .map(|(t, &s)| (t.clone(), f64::from(s)))
        .collect();
    let unk = vocab.unk_id.map(|u| u as usize);
    let model = Unigram::from(pieces, unk, false)
        .map_err(|e| Error::InvalidVocab(format!("a Unigram vocabulary: {e}")))?;
    let mut t = tokenizers::Tokenizer::new(model);
    t.with_normalizer(Some(normalizer(vocab)?))
        .map_err(|e| Error::Tokenizer(e.to_string()))?;
    // SentencePiece's default, as llama.cpp reads a file that says nothing.
    let prefix = match vocab.add_space_prefix.unwrap_or(true) {
        true => PrependScheme::Always,
        false => PrependScheme::Never,
    };
    let metaspace = Metaspace::new('\u{2581}', prefix, true);
    t.with_pre_tokenizer(Some(metaspace.clone()));
    t.with_decoder(Some(DecoderWrapper::Metaspace(metaspace)));
    Ok(t)
}

/// The charsmap (where the file has one), then SentencePiece's whitespace
/// rule: the ends stripped and each run of spaces made one.
fn normalizer(vocab: &GgufVocab) -> Result<NormalizerWrapper, Error> {
    let mut steps: Vec<NormalizerWrapper> = Vec::new();
    if let Some(map) = vocab.precompiled_charsmap.as_deref() {
        let map = Precompiled::from(map).map_err(|e| {
            Error::InvalidVocab(format!("tokenizer.ggml.precompiled_charsmap: {e}"))
        })?;
        steps.push(map.into());
    }
    if vocab.remove_extra_whitespaces.unwrap_or(true) {
        let runs = Replace::new(ReplacePattern::Regex(" {2,}".into()), " ")
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        steps.push(Strip::new(true, true).into());
        steps.push(runs.into());
    }
    Ok(Sequence::new(steps).into())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::Tokenizer;
    use crate::gguf_vocab::TOKEN_TYPE_CONTROL;

    /// A vocabulary as llama.cpp's converter writes XLM-RoBERTa's: the
    /// fairseq specials first, pieces with log-probabilities, `</s>` the
    /// separator of a pair.
    pub(crate) fn tiny_unigram() -> GgufVocab {
        let pieces = [
            ("<s>", 0.0),
            ("<pad>", 0.0),
            ("</s>", 0.0),
            ("<unk>", 0.0),
            ("\u{2581}", -2.0),
            ("\u{2581}he", -3.0),
            ("llo", -3.0),
            ("\u{2581}hello", -4.0),
            ("h", -5.0),
            ("e", -5.0),
            ("l", -5.0),
            ("o", -5.0),
            ("\u{2581}fi", -3.0),
            ("ne", -3.0),
            ("f", -5.0),
            ("i", -5.0),
            ("n", -5.0),
            ("A", -5.0),
        ];
        let mut types = vec![1; pieces.len()];
        types[..3].fill(TOKEN_TYPE_CONTROL);
        types[3] = 2;
        GgufVocab {
            model: "t5".into(),
            tokens: pieces.iter().map(|p| p.0.to_string()).collect(),
            scores: Some(pieces.iter().map(|p| p.1).collect()),
            token_types: Some(types),
            bos_id: Some(0),
            eos_id: Some(2),
            unk_id: Some(3),
            add_bos: Some(true),
            add_eos: Some(true),
            sep_id: Some(2),
            add_sep: Some(true),
            ..GgufVocab::default()
        }
    }

    #[test]
    fn the_most_likely_split_of_each_word_with_the_specials_around() {
        let tok = Tokenizer::from_gguf(&tiny_unigram()).unwrap();
        // `▁hello` (-4) beats `▁he` `llo` (-6); an unknown letter is <unk>.
        for (text, want) in [
            ("hello", vec![0, 7, 2]),
            ("hello hello", vec![0, 7, 7, 2]),
            ("  hello   hello ", vec![0, 7, 7, 2]),
            ("hellz", vec![0, 5, 10, 10, 3, 2]),
        ] {
            assert_eq!(tok.encode(text, true).unwrap(), want, "{text:?}");
        }
        assert_eq!(tok.decode(&[7, 7], true).unwrap(), "hello hello");
        // llama.cpp's pair: BOS a EOS SEP b EOS, all of type 0.
        let (ids, types) = tok.encode_pair("hello", "fine").unwrap();
        assert_eq!(ids, vec![0, 7, 2, 2, 12, 13, 2]);
        assert_eq!(types, vec![0; 7]);
        let mut v = tiny_unigram();
        v.add_sep = Some(false);
        let tok = Tokenizer::from_gguf(&v).unwrap();
        assert_eq!(
            tok.encode_pair("hello", "fine").unwrap().0,
            [0, 7, 2, 12, 13, 2]
        );
    }

    #[test]
    fn whitespace_is_kept_where_the_file_says_so() {
        let mut v = tiny_unigram();
        v.remove_extra_whitespaces = Some(false);
        v.add_space_prefix = Some(false);
        let tok = Tokenizer::from_gguf(&v).unwrap();
        // No space put before the text: `h` `e` `llo`, not `▁hello`; the
        // two spaces stay two `▁`.
        assert_eq!(tok.encode("hello", false).unwrap(), vec![8, 9, 6]);
        assert_eq!(tok.encode("A  hello", false).unwrap(), vec![17, 4, 7]);
    }

    #[test]
    fn a_charsmap_that_does_not_parse_is_an_error_naming_the_key() {
        let mut v = tiny_unigram();
        v.precompiled_charsmap = Some(vec![1, 2, 3]);
        let err = Tokenizer::from_gguf(&v).unwrap_err().to_string();
        assert!(err.contains("precompiled_charsmap"), "{err}");
        v.precompiled_charsmap = None;
        v.scores = None;
        let err = Tokenizer::from_gguf(&v).unwrap_err().to_string();
        assert!(err.contains("without scores"), "{err}");
    }
}
