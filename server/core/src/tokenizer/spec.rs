//! A tokenizer as data: what another process (a router) needs to rebuild
//! exactly this tokenizer, the GGUF-built pipeline included.

use serde::{Deserialize, Serialize};

use super::{GgufSpecials, Tokenizer};
use crate::error::Error;

/// Everything a [`Tokenizer`] is, serialisable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenizerSpec {
    /// The Hugging Face pipeline, in `tokenizer.json`'s form.
    pipeline: serde_json::Value,
    /// BOS/EOS that we add (GGUF), not the pipeline's post-processor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    specials: Option<GgufSpecials>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    bos: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    eos: Option<String>,
}

impl Tokenizer {
    /// This tokenizer as data.
    pub fn to_spec(&self) -> Result<TokenizerSpec, Error> {
        let text = self.inner.to_string(false).map_err(super::tk_err)?;
        let pipeline = serde_json::from_str(&text).map_err(super::tk_err)?;
        Ok(TokenizerSpec {
            pipeline,
            specials: self.specials,
            bos: self.bos.clone(),
            eos: self.eos.clone(),
        })
    }

    /// The tokenizer `spec` describes.
    pub fn from_spec(spec: &TokenizerSpec) -> Result<Self, Error> {
        let text = spec.pipeline.to_string();
        // As for files: a malformed pipeline can panic inside tokenizers.
        let parsed = std::panic::catch_unwind(|| text.parse::<tokenizers::Tokenizer>());
        let inner = match parsed {
            Ok(r) => r.map_err(super::tk_err)?,
            Err(_) => return Err(Error::Tokenizer("not a valid tokenizer pipeline".into())),
        };
        Ok(Tokenizer {
            inner,
            specials: spec.specials,
            bos: spec.bos.clone(),
            eos: spec.eos.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::tests::tiny_gpt2;

    #[test]
    fn a_rebuilt_tokenizer_encodes_alike() {
        let t = Tokenizer::from_gguf(&tiny_gpt2())
            .unwrap()
            .with_special_token_strings(Some("<|im_start|>".into()), None);
        let spec = t.to_spec().unwrap();
        let json = serde_json::to_string(&spec).unwrap();
        let back = Tokenizer::from_spec(&serde_json::from_str(&json).unwrap()).unwrap();
        for (text, special) in [
            ("hello world", true),
            ("<|im_start|>hello", false),
            ("", true),
        ] {
            assert_eq!(
                back.encode(text, special).unwrap(),
                t.encode(text, special).unwrap(),
                "{text}"
            );
        }
        assert_eq!(back.bos_token(), Some("<|im_start|>"));
        assert_eq!(back.vocab_size(), t.vocab_size());
        // A Unigram vocabulary's pipeline and its pair's separator.
        let t = Tokenizer::from_gguf(&crate::gguf_unigram::tests::tiny_unigram()).unwrap();
        let json = serde_json::to_string(&t.to_spec().unwrap()).unwrap();
        let back = Tokenizer::from_spec(&serde_json::from_str(&json).unwrap()).unwrap();
        for text in ["  hello   hellz ", "fine"] {
            assert_eq!(
                back.encode(text, true).unwrap(),
                t.encode(text, true).unwrap()
            );
            let pair = |t: &Tokenizer| t.encode_pair(text, "hello").unwrap();
            assert_eq!(pair(&back), pair(&t), "{text}");
        }
        let broken: TokenizerSpec = serde_json::from_str(r#"{"pipeline": {"model": 3}}"#).unwrap();
        assert!(matches!(
            Tokenizer::from_spec(&broken),
            Err(Error::Tokenizer(_))
        ));
    }
}
