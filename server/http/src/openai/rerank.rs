//! A cross-encoder's routes: `/v1/rerank` and `/rerank` (Cohere v1/v2 and
//! Jina: `query`, `documents` as strings or `{text}`, `top_n`,
//! `return_documents`; results by `relevance_score`, best first) and vLLM's
//! `/score` (`text_1`, `text_2`, each one text or a list). Each pair is one
//! sequence, tokenized by the model's pair template. Pure: no engine here.

use serde::{Deserialize, Serialize};

use crate::openai::embeddings::EmbeddingModel;
use crate::openai::error::ApiError;
use crate::serve::frontend::Frontend;

/// `POST /v1/rerank` (and `/rerank`).
#[derive(Debug, Clone, Default, Deserialize, Serialize, utoipa::ToSchema)]
pub struct RerankRequest {
    /// The model asked for.
    pub model: Option<String>,
    /// What the documents are ranked against.
    pub query: Option<String>,
    /// The texts ranked: strings, or objects with a `text`.
    #[schema(value_type = Option<Vec<serde_json::Value>>)]
    pub documents: Option<Vec<Document>>,
    /// Keep the best this many (absent or 0: all).
    pub top_n: Option<i64>,
    /// Echo each result's document (default true).
    pub return_documents: Option<bool>,
}

/// A document as Cohere (a string) or Jina (`{"text": ...}`) sends it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Document {
    /// A bare string.
    Text(String),
    /// An object with its text.
    Object {
        /// The text.
        text: String,
    },
}

impl Document {
    /// Its text.
    pub fn text(&self) -> &str {
        match self {
            Document::Text(t) | Document::Object { text: t } => t,
        }
    }
}

/// `POST /score` (vLLM's).
#[derive(Debug, Clone, Default, Deserialize, Serialize, utoipa::ToSchema)]
pub struct ScoreRequest {
    /// The model asked for.
    pub model: Option<String>,
    /// The first text of each pair: one (paired with every `text_2`) or a
    /// list as long as `text_2`'s.
    #[schema(value_type = Option<serde_json::Value>)]
    pub text_1: Option<OneOrMany>,
    /// The second text of each pair.
    #[schema(value_type = Option<serde_json::Value>)]
    pub text_2: Option<OneOrMany>,
}

/// One text or several.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum OneOrMany {
    /// One text.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// Pairs ready for the engine: each pair's ids and token types.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PreparedPairs {
    /// Each pair's token ids.
    pub inputs: Vec<Vec<u32>>,
    /// Each pair's token types (its second text's are 1).
    pub token_types: Vec<Vec<u32>>,
}

/// What a rerank answer keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RerankOptions {
    /// The best this many (`None`: all).
    pub top_n: Option<usize>,
    /// The documents echoed (`None`: not returned).
    pub documents: Option<Vec<String>>,
}

fn check_model(asked: Option<&str>, m: &EmbeddingModel) -> Result<(), ApiError> {
    match asked.filter(|a| *a != m.name) {
        Some(a) => Err(ApiError::UnknownModel(a.to_string())),
        None => Ok(()),
    }
}

/// Checks `r` and tokenizes its (query, document) pairs with `f`.
pub fn prepare_rerank(
    r: RerankRequest,
    f: &dyn Frontend,
    m: &EmbeddingModel,
) -> Result<(PreparedPairs, RerankOptions), ApiError> {
    check_model(r.model.as_deref(), m)?;
    let query = r
        .query
        .ok_or_else(|| ApiError::invalid("query", "query is required"))?;
    let documents = r
        .documents
        .ok_or_else(|| ApiError::invalid("documents", "documents is required"))?;
    if documents.is_empty() {
        return Err(ApiError::invalid("documents", "documents is empty"));
    }
    let top_n = match r.top_n {
        None | Some(0) => None,
        Some(n) if n < 0 => {
            return Err(ApiError::invalid(
                "top_n",
                format!("top_n must be 0 (all) or more, not {n}"),
            ));
        }
        Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
    };
    let texts: Vec<String> = documents.iter().map(|d| d.text().to_string()).collect();
    let pairs: Vec<(&str, &str)> = texts.iter().map(|d| (query.as_str(), d.as_str())).collect();
    let prepared = tokenize_pairs(&pairs, f, m, "documents")?;
    let documents = r.return_documents.unwrap_or(true).then_some(texts);
    Ok((prepared, RerankOptions { top_n, documents }))
}

/// Checks `r` and tokenizes its pairs with `f`.
pub fn prepare_score(
    r: ScoreRequest,
    f: &dyn Frontend,
    m: &EmbeddingModel,
) -> Result<PreparedPairs, ApiError> {
    check_model(r.model.as_deref(), m)?;
    let need = |t: Option<OneOrMany>, field: &str| -> Result<Vec<String>, ApiError> {
        let texts = match t {
            None => return Err(ApiError::invalid(field, format!("{field} is required"))),
            Some(OneOrMany::One(t)) => vec![t],
            Some(OneOrMany::Many(ts)) => ts,
        };
        match texts.is_empty() {
            true => Err(ApiError::invalid(field, format!("{field} is empty"))),
            false => Ok(texts),
        }
    };
    let (a, b) = (need(r.text_1, "text_1")?, need(r.text_2, "text_2")?);
    let pairs: Vec<(&str, &str)> = match (a.len(), b.len()) {
        (1, _) => b.iter().map(|t| (a[0].as_str(), t.as_str())).collect(),
        (n, k) if n == k => a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x.as_str(), y.as_str()))
            .collect(),
        (n, k) => {
            return Err(ApiError::invalid(
                "text_1",
                format!(
                    "text_1 has {n} texts and text_2 {k}: give one text_1 or as many as text_2"
                ),
            ));
        }
    };
    tokenize_pairs(&pairs, f, m, "text_2")
}

/// Each pair's ids and types; an empty text, or a pair longer than the
/// longest sequence served, is a 400 naming it.
fn tokenize_pairs(
    pairs: &[(&str, &str)],
    f: &dyn Frontend,
    m: &EmbeddingModel,
    field: &str,
) -> Result<PreparedPairs, ApiError> {
    let mut out = PreparedPairs::default();
    for (i, (a, b)) in pairs.iter().enumerate() {
        if a.is_empty() || b.is_empty() {
            return Err(ApiError::invalid(
                field,
                format!("pair {i} has an empty text"),
            ));
        }
        let (ids, types) = f
            .encode_pair(a, b)
            .map_err(|e| ApiError::invalid(field, e))?;
        if ids.len() > m.max_model_len {
            return Err(ApiError::invalid(
                field,
                format!(
                    "pair {i} has {} tokens, more than the model's {} (--max-model-len)",
                    ids.len(),
                    m.max_model_len
                ),
            ));
        }
        out.inputs.push(ids);
        out.token_types.push(types);
    }
    Ok(out)
}

/// One rerank result.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct RerankResult {
    /// The document's place in the request.
    pub index: usize,
    /// Its score (the cross-encoder's, after its activation).
    pub relevance_score: f32,
    /// The document, when `return_documents`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub document: Option<RerankDocument>,
}

/// A document echoed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct RerankDocument {
    /// Its text.
    pub text: String,
}

/// The results of `scores` (one a document), best first (ties by index),
/// cut to `o.top_n`.
pub fn rank(scores: &[f32], o: &RerankOptions) -> Vec<RerankResult> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    order.truncate(o.top_n.unwrap_or(scores.len()));
    order
        .into_iter()
        .map(|index| RerankResult {
            index,
            relevance_score: scores[index],
            document: (o.documents.as_ref())
                .and_then(|d| d.get(index))
                .map(|text| RerankDocument { text: text.clone() }),
        })
        .collect()
}

#[cfg(test)]
#[path = "rerank_tests.rs"]
mod tests;

/// Token counts of a rerank or score answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct PairUsage {
    /// Tokens over every pair.
    pub prompt_tokens: usize,
    /// The same (nothing is generated).
    pub total_tokens: usize,
}

/// The answer to `/v1/rerank` and `/rerank`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct RerankResponse {
    /// This answer's id.
    pub id: String,
    /// The model that scored.
    pub model: String,
    /// The documents, best first.
    pub results: Vec<RerankResult>,
    /// Token counts.
    pub usage: PairUsage,
}

/// One pair's score in a `/score` answer.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ScoreData {
    /// The pair's place in the request.
    pub index: usize,
    /// Always `score`.
    pub object: &'static str,
    /// Its score.
    pub score: f32,
}

/// The answer to `/score` (vLLM's shape).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ScoreResponse {
    /// This answer's id.
    pub id: String,
    /// Always `list`.
    pub object: &'static str,
    /// Seconds since the epoch.
    pub created: u64,
    /// The model that scored.
    pub model: String,
    /// One score a pair, in request order.
    pub data: Vec<ScoreData>,
    /// Token counts.
    pub usage: PairUsage,
}
