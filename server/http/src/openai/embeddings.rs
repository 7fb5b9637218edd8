//! `POST /v1/embeddings` in OpenAI's shape, with vLLM's
//! `truncate_prompt_tokens` and `normalize` and TEI's `prompt_name`: the
//! request, its inputs as token ids (a string, strings, ids, lists of ids),
//! and every refusal a client can cure (a 400 naming the field). Pure: no
//! engine here.

use ferrox_models::pooling::prompts::Prompts;
use serde::{Deserialize, Serialize};

use crate::openai::error::ApiError;
use crate::serve::frontend::Frontend;

/// `POST /v1/embeddings`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, utoipa::ToSchema)]
pub struct EmbeddingRequest {
    /// The model asked for.
    pub model: Option<String>,
    /// The text or texts, or their token ids.
    #[schema(value_type = Option<serde_json::Value>)]
    pub input: Option<EmbeddingInput>,
    /// `float` (default) or `base64` (little-endian f32s).
    pub encoding_format: Option<String>,
    /// Cut each vector to its first `dimensions` values, then renormalize
    /// (Matryoshka models only).
    pub dimensions: Option<usize>,
    /// Keep at most this many tokens of each input (-1: the longest
    /// sequence served); text keeps its start and its special tokens, ids
    /// their end.
    pub truncate_prompt_tokens: Option<i64>,
    /// L2-normalize each vector (default: as the model's files say).
    pub normalize: Option<bool>,
    /// The model's prompt (sentence-transformers' `prompts`, TEI's name)
    /// put before each text; default: the model's `default_prompt_name`,
    /// if it has one. Token ids are taken as given.
    pub prompt_name: Option<String>,
}

/// The forms `input` takes.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum EmbeddingInput {
    /// One text.
    Text(String),
    /// Several texts.
    Texts(Vec<String>),
    /// One input's token ids.
    Ids(Vec<u32>),
    /// Several inputs' token ids.
    IdLists(Vec<Vec<u32>>),
}

/// How vectors are written in the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// JSON numbers.
    Float,
    /// Base64 of the little-endian f32 bytes.
    Base64,
}

/// What the server knows of the model an embedding request needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddingModel {
    /// The served name.
    pub name: String,
    /// Ids below this are the model's.
    pub vocab: usize,
    /// The longest sequence served.
    pub max_model_len: usize,
    /// The width of a vector.
    pub dim: usize,
    /// Its vectors are normalized unless a request says otherwise.
    pub normalize: bool,
    /// Matryoshka sizes (`None`: not trained for them; empty: any).
    pub matryoshka: Option<Vec<usize>>,
    /// The prompts a request may name.
    pub prompts: Prompts,
}

/// An embedding request ready for the engine: each input's ids, and what
/// to do with the vectors.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedEmbedding {
    /// Each input's token ids.
    pub inputs: Vec<Vec<u32>>,
    /// How the vectors are finished.
    pub finish: Finish,
}

/// What is done to each vector the model gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finish {
    /// Cut to this many values first.
    pub dimensions: Option<usize>,
    /// Then L2-normalized.
    pub normalize: bool,
    /// Then written so.
    pub encoding: Encoding,
}

/// Checks `r` against `m` and tokenizes its inputs with `f`.
pub fn prepare(
    r: EmbeddingRequest,
    f: &dyn Frontend,
    m: &EmbeddingModel,
) -> Result<PreparedEmbedding, ApiError> {
    if let Some(asked) = r.model.as_deref().filter(|a| *a != m.name) {
        return Err(ApiError::UnknownModel(asked.to_string()));
    }
    let finish = Finish {
        dimensions: dimensions(r.dimensions, m)?,
        normalize: r.normalize.unwrap_or(m.normalize),
        encoding: match r.encoding_format.as_deref() {
            None | Some("float") => Encoding::Float,
            Some("base64") => Encoding::Base64,
            Some(other) => {
                return Err(ApiError::invalid(
                    "encoding_format",
                    format!("encoding_format must be float or base64, not {other:?}"),
                ));
            }
        },
    };
    let limit = truncation(r.truncate_prompt_tokens, m.max_model_len)?;
    let Some(input) = r.input else {
        return Err(ApiError::invalid("input", "input is required"));
    };
    let prompt = prompt(r.prompt_name.as_deref(), &input, m)?;
    let inputs = tokenize(input, f, limit, prompt)?;
    if inputs.is_empty() {
        return Err(ApiError::invalid("input", "the input is empty"));
    }
    for (i, ids) in inputs.iter().enumerate() {
        check_ids(i, ids, m, limit)?;
    }
    Ok(PreparedEmbedding { inputs, finish })
}

/// The `dimensions` a request may ask for: at most the model's width, and
/// only from a Matryoshka model (one of its sizes, where it lists them).
fn dimensions(asked: Option<usize>, m: &EmbeddingModel) -> Result<Option<usize>, ApiError> {
    let Some(d) = asked else {
        return Ok(None);
    };
    let bad = |why: String| Err(ApiError::invalid("dimensions", why));
    match &m.matryoshka {
        None => bad(format!(
            "model {} was not trained for Matryoshka dimensions: its vectors cannot be cut \
             (it gives {} values)",
            m.name, m.dim
        )),
        Some(_) if d == 0 || d > m.dim => bad(format!(
            "dimensions must be between 1 and the model's {}, not {d}",
            m.dim
        )),
        Some(sizes) if !sizes.is_empty() && !sizes.contains(&d) => bad(format!(
            "model {} gives Matryoshka dimensions {sizes:?}, not {d}",
            m.name
        )),
        Some(_) => Ok(Some(d)),
    }
}

/// The text put before each input: the prompt `name` names, else the
/// model's default for texts; none for token ids, which a named prompt
/// cannot reach (a 400).
fn prompt<'m>(
    name: Option<&str>,
    input: &EmbeddingInput,
    m: &'m EmbeddingModel,
) -> Result<Option<&'m str>, ApiError> {
    let invalid = |why: String| ApiError::invalid("prompt_name", why);
    if matches!(input, EmbeddingInput::Ids(_) | EmbeddingInput::IdLists(_)) {
        return match name {
            Some(n) => Err(invalid(format!(
                "prompt_name {n:?} applies to text inputs, not token ids"
            ))),
            None => Ok(None),
        };
    }
    m.prompts.text(name).map_err(invalid)
}

/// The most tokens an input keeps: `truncate_prompt_tokens` (-1: the
/// longest sequence), or no cut.
fn truncation(asked: Option<i64>, max_model_len: usize) -> Result<Option<usize>, ApiError> {
    match asked {
        None => Ok(None),
        Some(-1) => Ok(Some(max_model_len)),
        Some(k) if k >= 1 => Ok(Some(usize::try_from(k).unwrap_or(usize::MAX))),
        Some(k) => Err(ApiError::invalid(
            "truncate_prompt_tokens",
            format!("truncate_prompt_tokens must be -1 or at least 1, not {k}"),
        )),
    }
}

/// Each input's ids: texts through the tokenizer after `prompt`, as
/// sentence-transformers joins them (cut to `limit` keeping their special
/// tokens), ids as given (cut to their last `limit`).
fn tokenize(
    input: EmbeddingInput,
    f: &dyn Frontend,
    limit: Option<usize>,
    prompt: Option<&str>,
) -> Result<Vec<Vec<u32>>, ApiError> {
    let text = |i: usize, t: &str| -> Result<Vec<u32>, ApiError> {
        if t.is_empty() {
            return Err(ApiError::invalid(
                "input",
                format!("input {i} is an empty string"),
            ));
        }
        let joined;
        let t = match prompt {
            Some(p) => {
                joined = format!("{p}{t}");
                joined.as_str()
            }
            None => t,
        };
        let ids = match limit {
            Some(max) => f.encode_truncated(t, max),
            None => f.encode(t, true),
        };
        ids.map_err(|e| ApiError::invalid("input", format!("input {i}: {e}")))
    };
    let ids = |v: Vec<u32>| match limit {
        Some(max) if v.len() > max => v[v.len() - max..].to_vec(),
        _ => v,
    };
    match input {
        EmbeddingInput::Text(t) => Ok(vec![text(0, &t)?]),
        EmbeddingInput::Texts(ts) => ts.iter().enumerate().map(|(i, t)| text(i, t)).collect(),
        EmbeddingInput::Ids(v) => Ok(vec![ids(v)]),
        EmbeddingInput::IdLists(vs) => Ok(vs.into_iter().map(ids).collect()),
    }
}

/// Refuses an input no batch should see: no tokens, an id outside the
/// vocabulary, more tokens than the longest sequence (without truncation).
fn check_ids(
    i: usize,
    ids: &[u32],
    m: &EmbeddingModel,
    limit: Option<usize>,
) -> Result<(), ApiError> {
    let bad = |why: String| Err(ApiError::invalid("input", why));
    if ids.is_empty() {
        return bad(format!("input {i} has no tokens"));
    }
    if let Some(id) = ids.iter().find(|&&t| t as usize >= m.vocab) {
        return bad(format!(
            "input {i}: token id {id} is outside the model's vocabulary of {}",
            m.vocab
        ));
    }
    if ids.len() > m.max_model_len {
        let hint = match limit {
            Some(_) => "truncate_prompt_tokens is larger than that",
            None => "shorten it or set truncate_prompt_tokens",
        };
        return bad(format!(
            "input {i} has {} tokens, more than the model's {} (--max-model-len): {hint}",
            ids.len(),
            m.max_model_len
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
