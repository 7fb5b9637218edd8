//! How a decoder reranker sees a query and a document: Qwen3-Reranker's
//! prompt from its model card (a system turn asking for "yes" or "no", the
//! instruction, query and document as the user's turn, then an empty
//! thinking block), tokenized in three parts as the card does, so the ids
//! are the ones the model was trained on. A cross-encoder uses its
//! tokenizer's pair template instead, or, where its files carry a chat
//! template, that template over a `query` and a `document` message, as
//! sentence-transformers 6 formats a pair for such a model.

use ferrox_core::{ChatMessage, ChatTemplate, Tokenizer};

/// The system turn and the user turn's opening.
const PREFIX: &str = "<|im_start|>system\nJudge whether the Document meets the requirements \
based on the Query and the Instruct provided. Note that the answer can only be \"yes\" or \
\"no\".<|im_end|>\n<|im_start|>user\n";
/// The user turn's end and the assistant's opening, thinking skipped.
const SUFFIX: &str = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
/// The card's default instruction.
const INSTRUCT: &str = "Given a web search query, retrieve relevant passages that answer the query";

/// How a pair of texts becomes one sequence.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PairFormat {
    /// The tokenizer's pair template (a cross-encoder's).
    #[default]
    Tokenizer,
    /// Qwen3-Reranker's prompt (a decoder scoring by "yes" and "no").
    Qwen3Reranker,
    /// The model's chat template over the messages `{role: "query"}` and
    /// `{role: "document"}`, no generation prompt, the text tokenized
    /// without special tokens (transformers' `apply_chat_template`, which
    /// sentence-transformers' `CrossEncoder` calls for a model with a chat
    /// template).
    ChatTemplate,
}

impl PairFormat {
    /// The ids of `a` and `b` as one sequence, with each id's token type;
    /// `template` the model's chat template, if any.
    pub fn encode(
        self,
        (tokenizer, template): (&Tokenizer, Option<&ChatTemplate>),
        a: &str,
        b: &str,
    ) -> Result<(Vec<u32>, Vec<u32>), String> {
        match (self, template) {
            (PairFormat::Tokenizer, _) => tokenizer.encode_pair(a, b).map_err(|e| e.to_string()),
            (PairFormat::Qwen3Reranker, _) => qwen3_reranker(tokenizer, a, b),
            (PairFormat::ChatTemplate, Some(t)) => chat_pair(tokenizer, t, a, b),
            (PairFormat::ChatTemplate, None) => {
                Err("the model pairs texts by its chat template, and has none".into())
            }
        }
    }
}

/// The ids of `template` rendered over a `query` and a `document`
/// message, every token of type 0.
fn chat_pair(
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
    query: &str,
    document: &str,
) -> Result<(Vec<u32>, Vec<u32>), String> {
    let messages = [
        ChatMessage::new("query", query),
        ChatMessage::new("document", document),
    ];
    let text = template
        .render(&messages, false)
        .map_err(|e| format!("the chat template cannot render a query and a document: {e}"))?;
    let ids = tokenizer.encode(&text, false).map_err(|e| e.to_string())?;
    let types = vec![0; ids.len()];
    Ok((ids, types))
}

/// The ids of Qwen3-Reranker's prompt for `query` and `document`, every
/// token of type 0.
fn qwen3_reranker(
    tokenizer: &Tokenizer,
    query: &str,
    document: &str,
) -> Result<(Vec<u32>, Vec<u32>), String> {
    let body = format!("<Instruct>: {INSTRUCT}\n<Query>: {query}\n<Document>: {document}");
    let mut ids = Vec::new();
    for part in [PREFIX, body.as_str(), SUFFIX] {
        ids.extend(tokenizer.encode(part, false).map_err(|e| e.to_string())?);
    }
    let types = vec![0; ids.len()];
    Ok((ids, types))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[derive(serde::Deserialize)]
    struct Reference {
        query: String,
        documents: Vec<String>,
        tokens: Vec<Vec<u32>>,
    }

    fn fixture(name: &str) -> (PathBuf, Reference) {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../models/testdata/embeddings")
            .join(name);
        let text = std::fs::read_to_string(dir.join("reference.json")).unwrap();
        (dir, serde_json::from_str(&text).unwrap())
    }

    /// sentence-transformers' pair through the chat template: the ids
    /// `CrossEncoder` fed the model.
    #[test]
    fn a_chat_template_pair_is_sentence_transformers_token_for_token() {
        let (dir, r) = fixture("qwen3_cls_chat");
        let text = ferrox_models::text::from_dir(&dir).unwrap();
        let template = text.chat_template.as_ref();
        assert!(template.is_some());
        for (doc, want) in r.documents.iter().zip(&r.tokens) {
            let format = PairFormat::ChatTemplate;
            let (ids, types) = format
                .encode((&text.tokenizer, template), &r.query, doc)
                .unwrap();
            assert_eq!(&ids, want, "{doc}");
            assert!(types.iter().all(|&t| t == 0));
        }
        let err = PairFormat::ChatTemplate
            .encode((&text.tokenizer, None), "a", "b")
            .unwrap_err();
        assert!(err.contains("has none"), "{err}");
    }

    #[test]
    fn the_prompt_is_the_model_cards_token_for_token() {
        let (dir, r) = fixture("qwen3_rerank");
        let tokenizer = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
        for (doc, want) in r.documents.iter().zip(&r.tokens) {
            let (ids, types) = qwen3_reranker(&tokenizer, &r.query, doc).unwrap();
            assert_eq!(&ids, want, "{doc}");
            assert!(types.iter().all(|&t| t == 0));
        }
    }
}
