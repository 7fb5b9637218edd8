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
            "gemma4" => {
                let mut t = tokenizers::Tokenizer::new(vocab.gemma4_model()?);
                t.with_normalizer(Some(gguf_vocab::gemma4_normalizer()?))
                    .map_err(|e| Error::Tokenizer(e.to_string()))?;
                t.with_pre_tokenizer(Some(gguf_vocab::gemma4_pre_tokenizer()?));
                t.with_decoder(Some(gguf_vocab::gemma4_decoder()?));
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
pub(crate) mod tests;

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
