//! The model's text side: tokenizer, chat template and end-of-generation set,
//! from GGUF metadata or a Hugging Face directory.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use ferrox_core::{ChatTemplate, EndOfGeneration, GgufVocab, Tokenizer};

use crate::config::md_string;
use crate::error::{Error, Result};

/// Everything needed to turn requests into ids and ids into text.
#[derive(Debug)]
pub struct TextModel {
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    /// The model's own chat template, if it ships one.
    pub chat_template: Option<ChatTemplate>,
    /// The model's end-of-generation ids.
    pub end_of_generation: EndOfGeneration,
}

fn md_u32(md: &HashMap<String, Value>, key: &str) -> Option<u32> {
    md.get(key).and_then(|v| v.to_u32().ok())
}

fn md_strings(md: &HashMap<String, Value>, key: &str) -> Result<Option<Vec<String>>> {
    let Some(v) = md.get(key) else {
        return Ok(None);
    };
    let items = v
        .to_vec()
        .map_err(|_| Error::Config(format!("{key} is not an array")))?;
    items
        .iter()
        .map(|x| {
            x.to_string()
                .cloned()
                .map_err(|_| Error::Config(format!("{key} has a non-string entry")))
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// SentencePiece's normalization table, an array of bytes (llama.cpp
/// accepts `u8` or `i8` items).
fn charsmap(md: &HashMap<String, Value>) -> Result<Option<Vec<u8>>> {
    const KEY: &str = "tokenizer.ggml.precompiled_charsmap";
    let Some(v) = md.get(KEY) else {
        return Ok(None);
    };
    let bad = || Error::Config(format!("{KEY} is not an array of bytes"));
    v.to_vec()
        .map_err(|_| bad())?
        .iter()
        .map(|b| match b {
            Value::U8(b) => Ok(*b),
            Value::I8(b) => Ok(*b as u8),
            _ => Err(bad()),
        })
        .collect::<Result<Vec<u8>>>()
        .map(Some)
}

/// Reads the `tokenizer.ggml.*` keys.
pub fn gguf_vocab(md: &HashMap<String, Value>) -> Result<GgufVocab> {
    let numbers = |key: &str, f: fn(&Value) -> Option<f64>| -> Option<Vec<f64>> {
        md.get(key)?.to_vec().ok()?.iter().map(f).collect()
    };
    let flag = |key: &str| md.get(key).and_then(|v| v.to_bool().ok());
    Ok(GgufVocab {
        model: md_string(md, "tokenizer.ggml.model")?,
        pre: md_string(md, "tokenizer.ggml.pre").ok(),
        tokens: md_strings(md, "tokenizer.ggml.tokens")?
            .ok_or_else(|| Error::Config("missing metadata tokenizer.ggml.tokens".into()))?,
        scores: numbers("tokenizer.ggml.scores", |v| v.to_f32().ok().map(f64::from))
            .map(|v| v.into_iter().map(|x| x as f32).collect()),
        token_types: numbers("tokenizer.ggml.token_type", |v| {
            v.to_i32().ok().map(f64::from)
        })
        .map(|v| v.into_iter().map(|x| x as i32).collect()),
        merges: md_strings(md, "tokenizer.ggml.merges")?,
        bos_id: md_u32(md, "tokenizer.ggml.bos_token_id"),
        eos_id: md_u32(md, "tokenizer.ggml.eos_token_id"),
        unk_id: md_u32(md, "tokenizer.ggml.unknown_token_id"),
        eot_id: md_u32(md, "tokenizer.ggml.eot_token_id"),
        eom_id: md_u32(md, "tokenizer.ggml.eom_token_id"),
        add_bos: flag("tokenizer.ggml.add_bos_token"),
        add_eos: flag("tokenizer.ggml.add_eos_token"),
        sep_id: md_u32(md, "tokenizer.ggml.seperator_token_id"),
        add_sep: flag("tokenizer.ggml.add_sep_token"),
        precompiled_charsmap: charsmap(md)?,
        add_space_prefix: flag("tokenizer.ggml.add_space_prefix"),
        remove_extra_whitespaces: flag("tokenizer.ggml.remove_extra_whitespaces"),
    })
}

/// The text side of a GGUF file.
pub fn from_gguf(md: &HashMap<String, Value>) -> Result<TextModel> {
    let vocab = gguf_vocab(md)?;
    let bos = vocab.token(vocab.bos_id).map(str::to_string);
    let eos = vocab.token(vocab.eos_id).map(str::to_string);
    let tokenizer =
        Tokenizer::from_gguf(&vocab)?.with_special_token_strings(bos.clone(), eos.clone());
    let chat_template = match md_string(md, "tokenizer.chat_template") {
        Ok(source) => Some(ChatTemplate::new(source, bos, eos)?),
        Err(_) => None,
    };
    let end_of_generation = EndOfGeneration::from_gguf(&tokenizer, &vocab);
    Ok(TextModel {
        tokenizer,
        chat_template,
        end_of_generation,
    })
}

/// A directory's chat template: transformers 5's `chat_template.jinja`
/// (what `save_pretrained` writes now, and what transformers prefers), with
/// `tokenizer_config.json`'s BOS and EOS; else that config's own
/// `chat_template`; else none.
fn dir_template(dir: &Path) -> Result<Option<ChatTemplate>> {
    let config_path = dir.join("tokenizer_config.json");
    if let Ok(source) = std::fs::read_to_string(dir.join("chat_template.jinja")) {
        let config: serde_json::Value = std::fs::read_to_string(&config_path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        let token = |key: &str| match config.get(key)? {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
            _ => None,
        };
        let bos_eos = (token("bos_token"), token("eos_token"));
        return Ok(Some(ChatTemplate::new(source, bos_eos.0, bos_eos.1)?));
    }
    if !config_path.exists() {
        return Ok(None);
    }
    match ChatTemplate::from_tokenizer_config(&config_path) {
        Ok(t) => Ok(Some(t)),
        Err(ferrox_core::Error::ChatTemplate(m)) if m.contains("has no chat_template") => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The text side of a Hugging Face directory.
pub fn from_dir(dir: &Path) -> Result<TextModel> {
    let tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))?;
    let chat_template = dir_template(dir)?;
    let mut ids = Vec::new();
    for file in ["generation_config.json", "config.json"] {
        if let Ok(text) = std::fs::read_to_string(dir.join(file)) {
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| Error::Config(format!("{file}: {e}")))?;
            match &v["eos_token_id"] {
                serde_json::Value::Number(n) => ids.extend(n.as_u64().map(|x| x as u32)),
                serde_json::Value::Array(a) => {
                    ids.extend(a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32))
                }
                _ => {}
            }
        }
    }
    let ids: Vec<Option<u32>> = ids.into_iter().map(Some).collect();
    let end_of_generation = EndOfGeneration::new(&tokenizer, &ids);
    Ok(TextModel {
        tokenizer,
        chat_template,
        end_of_generation,
    })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    /// transformers 5 saves the template apart from the tokenizer's config.
    #[test]
    fn a_chat_template_jinja_beside_the_tokenizer_is_read() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/embeddings");
        let chat = super::from_dir(&dir.join("qwen3_cls_chat")).unwrap();
        let template = chat.chat_template.expect("chat_template.jinja");
        assert!(template.source().contains("<Query>"));
        assert_eq!(template.special_tokens().1, Some("<|im_end|>"));
        let plain = super::from_dir(&dir.join("qwen3_cls")).unwrap();
        assert!(plain.chat_template.is_none());
    }
}
