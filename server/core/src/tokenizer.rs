//! The tokenizer: a Hugging Face `tokenizer.json`, or one built from GGUF metadata.

use std::path::Path;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::gguf_vocab::{self, GgufVocab};

/// Text to token ids and back.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// BOS/EOS added by us (GGUF) rather than by the tokenizer's post-processor.
    specials: Option<GgufSpecials>,
    bos: Option<String>,
    eos: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct GgufSpecials {
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    /// Put between a pair's texts after the first's EOS (XLM-RoBERTa's
    /// second `</s>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sep: Option<u32>,
}

fn tk_err(e: impl std::fmt::Display) -> Error {
    Error::Tokenizer(e.to_string())
}

impl Tokenizer {
    /// Loads a Hugging Face `tokenizer.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        // tokenizers 0.23 panics on some malformed files (a corrupt
        // `decoder` section) instead of returning its error.
        let loaded = std::panic::catch_unwind(|| tokenizers::Tokenizer::from_file(path));
        let inner = match loaded {
            Ok(result) => {
                result.map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?
            }
            Err(_) => {
                return Err(Error::Tokenizer(format!(
                    "{}: not a valid tokenizer file",
                    path.display()
                )));
            }
        };
        Ok(Self {
            inner,
            specials: None,
            bos: None,
            eos: None,
        })
    }

    /// Builds the tokenizer that a GGUF file's metadata describes.
    pub fn from_gguf(vocab: &GgufVocab) -> Result<Self, Error> {
        vocab.validate()?;
        let mut inner = match vocab.model.as_str() {
            "gpt2" => {
                let mut t = tokenizers::Tokenizer::new(vocab.gpt2_model()?);
                t.with_pre_tokenizer(Some(gguf_vocab::gpt2_pre_tokenizer(vocab.pre.as_deref())?));
                t.with_decoder(Some(ByteLevelDecoder::default()));
                t
            }
            "llama" => {
                let mut t = tokenizers::Tokenizer::new(vocab.llama_model()?);
                t.with_normalizer(Some(gguf_vocab::llama_normalizer()?))
                    .map_err(|e| Error::Tokenizer(e.to_string()))?;
                t.with_decoder(Some(gguf_vocab::llama_decoder()?));
                t
            }
            "bert" => crate::gguf_wordpiece::tokenizer(vocab)?,
            "t5" => crate::gguf_unigram::tokenizer(vocab)?,
            other => return Err(Error::UnsupportedVocab(other.to_string())),
        };
        inner
            .add_special_tokens(vocab.added_tokens())
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(Self {
            inner,
            specials: Some(GgufSpecials {
                bos: vocab.bos_id,
                eos: vocab.eos_id,
                add_bos: vocab.adds_bos(),
                add_eos: vocab.add_eos.unwrap_or(false),
                sep: vocab.sep_id.filter(|_| vocab.add_sep == Some(true)),
            }),
            bos: vocab.token(vocab.bos_id).map(str::to_string),
            eos: vocab.token(vocab.eos_id).map(str::to_string),
        })
    }

    /// Sets the BOS/EOS token strings (e.g. from `tokenizer_config.json`).
    pub fn with_special_token_strings(mut self, bos: Option<String>, eos: Option<String>) -> Self {
        self.bos = bos;
        self.eos = eos;
        self
    }

    /// Token ids of `text`; `add_special_tokens` adds BOS/EOS where the vocabulary says so.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, Error> {
        let manual = self.specials.filter(|_| add_special_tokens);
        let hf_specials = add_special_tokens && self.specials.is_none();
        let enc = self.inner.encode(text, hf_specials).map_err(tk_err)?;
        let mut ids = Vec::with_capacity(enc.get_ids().len() + 2);
        if let Some(GgufSpecials {
            bos: Some(bos),
            add_bos: true,
            ..
        }) = manual
        {
            ids.push(bos);
        }
        ids.extend_from_slice(enc.get_ids());
        if let Some(GgufSpecials {
            eos: Some(eos),
            add_eos: true,
            ..
        }) = manual
        {
            ids.push(eos);
        }
        Ok(ids)
    }

    /// `text`'s ids with the special tokens a single sequence gets, its
    /// content cut from the end so that the whole is at most `max` ids (an
    /// embedding request's `truncate_prompt_tokens`): the specials stay. A
    /// `max` below the specials alone is an error naming both.
    pub fn encode_truncated(&self, text: &str, max: usize) -> Result<Vec<u32>, Error> {
        let ids = self.encode(text, true)?;
        if ids.len() <= max {
            return Ok(ids);
        }
        let added = self.encode("", true)?.len();
        let keep = max.checked_sub(added).ok_or_else(|| {
            Error::Tokenizer(format!(
                "{max} tokens cannot hold the model's {added} special tokens"
            ))
        })?;
        if self.specials.is_some() {
            // GGUF: BOS and EOS are ours, around the content.
            let content = self.encode(text, false)?;
            let bos = self.encode("", true)?;
            let (head, tail) = bos.split_at(usize::from(
                self.specials.is_some_and(|s| s.add_bos && s.bos.is_some()),
            ));
            let mut out = head.to_vec();
            out.extend_from_slice(&content[..keep.min(content.len())]);
            out.extend_from_slice(tail);
            return Ok(out);
        }
        let mut enc = self.inner.encode(text, false).map_err(tk_err)?;
        enc.truncate(keep, 0, tokenizers::TruncationDirection::Right);
        let enc = self.inner.post_process(enc, None, true).map_err(tk_err)?;
        Ok(enc.get_ids().to_vec())
    }

    /// A pair of texts as one sequence (a cross-encoder's query and
    /// document) by the tokenizer's pair template (BERT's `[CLS] a [SEP] b
    /// [SEP]`), with each id's token type (the second text's are 1). A GGUF
    /// vocabulary's pair is llama.cpp's: BOS, a, EOS, the separator where
    /// the file adds one, b, EOS, every token of type 0 (XLM-RoBERTa's
    /// `<s> a </s></s> b </s>`). A tokenizer with neither is refused.
    pub fn encode_pair(&self, a: &str, b: &str) -> Result<(Vec<u32>, Vec<u32>), Error> {
        if let Some(s) = self.specials {
            let eos = s.eos.filter(|_| s.add_eos);
            let mut ids: Vec<u32> = s.bos.filter(|_| s.add_bos).into_iter().collect();
            ids.extend(self.encode(a, false)?);
            ids.extend(eos.into_iter().chain(s.sep));
            ids.extend(self.encode(b, false)?);
            ids.extend(eos);
            let types = vec![0; ids.len()];
            return Ok((ids, types));
        }
        if self.inner.get_post_processor().is_none() {
            return Err(Error::Tokenizer(
                "the tokenizer has no template for a pair of texts".into(),
            ));
        }
        let enc = self.inner.encode((a, b), true).map_err(tk_err)?;
        Ok((enc.get_ids().to_vec(), enc.get_type_ids().to_vec()))
    }

    /// Text of `ids`; `skip_special_tokens` leaves control tokens out.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, Error> {
        let size = self.vocab_size();
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= size) {
            return Err(Error::Tokenizer(format!(
                "token id {bad} out of range (vocab {size})"
            )));
        }
        self.inner.decode(ids, skip_special_tokens).map_err(tk_err)
    }

    /// The id of a token given by its vocabulary text.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary text of a token.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The BOS token's text, where known.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos.as_deref()
    }

    /// The EOS token's text, where known.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos.as_deref()
    }

    /// The Hugging Face tokenizer underneath.
    pub(crate) fn hf(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

mod spec;
pub use spec::TokenizerSpec;

#[cfg(test)]
mod fuzz;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::gguf_vocab::TOKEN_TYPE_USER_DEFINED;

    /// A tiny byte-level vocabulary: "hello world" and a ChatML marker.
    pub(crate) fn tiny_gpt2() -> GgufVocab {
        let tokens = [
            "h",
            "e",
            "l",
            "o",
            "Ġ",
            "w",
            "r",
            "d",
            "he",
            "ll",
            "hell",
            "hello",
            "Ġw",
            "or",
            "Ġwor",
            "Ġworld",
            "<|im_start|>",
            "<|endoftext|>",
            "1",
            "2",
            "ld",
        ];
        let merges = [
            "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld",
        ];
        let mut types = vec![1; tokens.len()];
        types[16] = 3;
        types[17] = 3;
        GgufVocab {
            model: "gpt2".into(),
            pre: Some("smollm".into()),
            tokens: tokens.iter().map(|s| s.to_string()).collect(),
            token_types: Some(types),
            merges: Some(merges.iter().map(|s| s.to_string()).collect()),
            bos_id: Some(17),
            eos_id: Some(17),
            add_bos: Some(false),
            ..GgufVocab::default()
        }
    }

    /// A tiny SentencePiece-style vocabulary with byte fallback.
    pub(crate) fn tiny_llama() -> GgufVocab {
        let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>"].map(String::from).to_vec();
        let mut types = vec![2, 3, 3];
        let mut scores = vec![0.0, 0.0, 0.0];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(6);
            scores.push(0.0);
        }
        let pieces = [
            ("▁", -1.0),
            ("h", -2.0),
            ("i", -3.0),
            ("t", -4.0),
            ("e", -5.0),
            ("r", -6.0),
            ("hi", -1.5),
            ("▁hi", -1.2),
            ("er", -7.0),
            ("th", -8.0),
            ("▁th", -9.0),
            ("▁the", -2.5),
            ("the", -9.5),
            ("é", -10.0),
        ];
        for (p, s) in pieces {
            tokens.push(p.to_string());
            types.push(1);
            scores.push(s);
        }
        GgufVocab {
            model: "llama".into(),
            tokens,
            scores: Some(scores),
            token_types: Some(types),
            bos_id: Some(1),
            eos_id: Some(2),
            unk_id: Some(0),
            ..GgufVocab::default()
        }
    }

    #[test]
    fn tiny_gpt2_encodes_merges_specials_and_digits() {
        let tok = Tokenizer::from_gguf(&tiny_gpt2()).unwrap();
        let cases: &[(&str, &[u32])] = &[
            ("hello world", &[11, 15]),
            ("<|im_start|>hello", &[16, 11]),
            ("12", &[18, 19]),
            ("hello<|endoftext|> world", &[11, 17, 15]),
        ];
        for (text, want) in cases {
            assert_eq!(&tok.encode(text, true).unwrap(), want, "{text:?}");
            assert_eq!(tok.decode(want, false).unwrap(), *text);
        }
        assert_eq!(tok.decode(&[16, 11, 17], true).unwrap(), "hello");
        assert_eq!(tok.bos_token(), Some("<|endoftext|>"));
        assert_eq!(tok.token_to_id("Ġworld"), Some(15));
        assert_eq!(tok.id_to_token(11).as_deref(), Some("hello"));
        assert_eq!(tok.vocab_size(), 21);
    }

    #[test]
    fn tiny_llama_encodes_like_sentencepiece() {
        let tok = Tokenizer::from_gguf(&tiny_llama()).unwrap();
        // Reference ids from transformers 5.24's GGUF llama conversion
        // (`convert_gguf_tokenizer("llama", ...)`) of this same vocabulary.
        // "ü" is not in the vocabulary and falls back to its UTF-8 bytes.
        let cases: &[(&str, &[u32])] = &[
            ("hi the ü", &[266, 270, 259, 198, 191]),
            ("hi 🚀 the", &[266, 259, 243, 162, 157, 131, 270]),
            ("the hi  é", &[270, 266, 259, 259, 272]),
            ("there", &[269, 267, 263]),
            // Where transformers' Metaspace(prepend_scheme=first) differs we
            // follow llama.cpp: a space is prefixed to every text fragment,
            // even after a special token or before an existing space.
            ("<s>hi", &[1, 266]),
            (" hi", &[259, 266]),
        ];
        for (text, want) in cases {
            assert_eq!(&tok.encode(text, false).unwrap(), want, "{text:?}");
        }
        for text in ["hi the ü", "hi 🚀 the", "the hi  é", "there"] {
            let ids = tok.encode(text, false).unwrap();
            assert_eq!(tok.decode(&ids, false).unwrap(), text);
        }
        // BOS is added by default for llama vocabularies, and skipped on decode.
        let ids = tok.encode("hi", true).unwrap();
        assert_eq!(ids, vec![1, 266]);
        assert_eq!(tok.decode(&ids, true).unwrap(), "hi");
        assert_eq!(tok.eos_token(), Some("</s>"));
    }

    #[test]
    fn user_defined_tokens_match_whole_but_are_not_special() {
        let mut vocab = tiny_gpt2();
        vocab.tokens.push("<think>".into());
        vocab
            .token_types
            .as_mut()
            .unwrap()
            .push(TOKEN_TYPE_USER_DEFINED);
        let tok = Tokenizer::from_gguf(&vocab).unwrap();
        assert_eq!(tok.encode("hello<think>", false).unwrap(), vec![11, 21]);
        // Skipping special tokens drops control tokens only.
        assert_eq!(tok.decode(&[16, 11, 21], true).unwrap(), "hello<think>");
    }

    #[test]
    fn bad_vocabularies_are_clear_errors() {
        let mut unknown_pre = tiny_gpt2();
        unknown_pre.pre = Some("klingon".into());
        let mut unknown_model = tiny_gpt2();
        unknown_model.model = "rwkv".into();
        let mut bad_id = tiny_gpt2();
        bad_id.eos_id = Some(999);
        let mut no_merges = tiny_gpt2();
        no_merges.merges = None;
        let cases = [
            (unknown_pre, "klingon"),
            (unknown_model, "rwkv"),
            (bad_id, "999"),
            (no_merges, "merges"),
        ];
        for (vocab, needle) in cases {
            let err = Tokenizer::from_gguf(&vocab).unwrap_err().to_string();
            assert!(err.contains(needle), "{err}");
        }
        let tok = Tokenizer::from_gguf(&tiny_gpt2()).unwrap();
        assert!(tok.decode(&[5000], false).is_err());
    }

    #[test]
    fn pre_tokenizers_known_by_name() {
        for pre in [
            None,
            Some("gpt2"),
            Some("smollm"),
            Some("llama-bpe"),
            Some("llama3"),
            Some("qwen2"),
            Some("gpt-2"),
            Some("gpt-4o"),
        ] {
            assert!(gguf_vocab::gpt2_pre_tokenizer(pre).is_ok(), "{pre:?}");
        }
    }

    #[test]
    fn gpt_4o_splits_cased_words_and_digits_in_threes() {
        use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
        let pre = gguf_vocab::gpt2_pre_tokenizer(Some("gpt-4o")).unwrap();
        let mut s = PreTokenizedString::from("HelloWORLD's 12345");
        pre.pre_tokenize(&mut s).unwrap();
        let pieces: Vec<String> = s
            .get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(p, _, _)| p.to_string())
            .collect();
        assert_eq!(pieces, ["Hello", "WORLD's", "Ġ", "123", "45"]);
    }

    #[test]
    fn from_file_reads_tokenizer_json_and_reports_missing() {
        let dir = std::env::temp_dir().join(format!("ferrox-tok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokenizer.json");
        let tok = Tokenizer::from_gguf(&tiny_gpt2()).unwrap();
        tok.inner.save(&path, false).unwrap();
        let loaded = Tokenizer::from_file(&path).unwrap();
        assert_eq!(loaded.encode("hello world", false).unwrap(), vec![11, 15]);
        let err = Tokenizer::from_file(dir.join("missing.json")).unwrap_err();
        assert!(err.to_string().contains("missing.json"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[cfg(test)]
mod truncation {
    use super::*;

    /// The tiny BERT fixture's WordPiece tokenizer: `[CLS] ... [SEP]`.
    fn bert() -> Tokenizer {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../models/testdata/embeddings/bert"
        );
        Tokenizer::from_file(format!("{dir}/tokenizer.json")).unwrap()
    }

    #[test]
    fn truncation_cuts_the_content_and_keeps_the_special_tokens() {
        let t = bert();
        let text = "the capital of france is paris";
        let whole = t.encode(text, true).unwrap();
        let (cls, sep) = (whole[0], whole[whole.len() - 1]);
        // (max, expected length, or an error)
        for (max, want) in [
            (100, Ok(whole.len())),
            (5, Ok(5)),
            (2, Ok(2)),
            (1, Err("special")),
        ] {
            match (t.encode_truncated(text, max), want) {
                (Ok(ids), Ok(n)) => {
                    assert_eq!(ids.len(), n, "{max}");
                    assert_eq!((ids[0], ids[n - 1]), (cls, sep), "{max}");
                    assert_eq!(ids[1..n - 1], whole[1..n - 1], "{max}");
                }
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{e}"),
                (got, w) => panic!("{max}: {got:?} vs {w:?}"),
            }
        }
    }
}
