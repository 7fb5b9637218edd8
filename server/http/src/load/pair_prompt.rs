//! How a decoder reranker sees a query and a document: Qwen3-Reranker's
//! prompt from its model card (a system turn asking for "yes" or "no", the
//! instruction, query and document as the user's turn, then an empty
//! thinking block), tokenized in three parts as the card does, so the ids
//! are the ones the model was trained on. A cross-encoder uses its
//! tokenizer's pair template instead.

use ferrox_core::Tokenizer;

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
}

impl PairFormat {
    /// The ids of `a` and `b` as one sequence, with each id's token type.
    pub fn encode(
        self,
        tokenizer: &Tokenizer,
        a: &str,
        b: &str,
    ) -> Result<(Vec<u32>, Vec<u32>), String> {
        match self {
            PairFormat::Tokenizer => tokenizer.encode_pair(a, b).map_err(|e| e.to_string()),
            PairFormat::Qwen3Reranker => qwen3_reranker(tokenizer, a, b),
        }
    }
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

    #[test]
    fn the_prompt_is_the_model_cards_token_for_token() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../models/testdata/embeddings/qwen3_rerank");
        let text = std::fs::read_to_string(dir.join("reference.json")).unwrap();
        let r: Reference = serde_json::from_str(&text).unwrap();
        let tokenizer = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
        for (doc, want) in r.documents.iter().zip(&r.tokens) {
            let (ids, types) = qwen3_reranker(&tokenizer, &r.query, doc).unwrap();
            assert_eq!(&ids, want, "{doc}");
            assert!(types.iter().all(|&t| t == 0));
        }
    }
}
