//! A pooling request as the door takes it, and what the door refuses.

use crate::{EngineConfig, EngineError};

/// An embedding request: its inputs' token ids.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolingRequest {
    /// Each input's tokens (special tokens included), in answer order.
    pub inputs: Vec<Vec<u32>>,
    /// Each input's token types (a scored pair's: its second text's are
    /// 1), one list an input; empty when every token is type 0.
    pub token_types: Vec<Vec<u32>>,
    /// The caller's id for the logs, if it sent one.
    pub request_id: Option<String>,
}

impl PoolingRequest {
    /// Tokens over every input.
    pub fn tokens(&self) -> usize {
        self.inputs.iter().map(Vec::len).sum()
    }
}

/// Refuses, at submission, inputs no batch could ever hold: none at all,
/// an empty one, one longer than the longest sequence served
/// (`--max-model-len`) or than one batch (`--max-batch-tokens`). A request
/// of more inputs than one batch holds runs over several.
pub fn check_pooling(inputs: &[Vec<u32>], config: &EngineConfig) -> Result<(), EngineError> {
    if inputs.is_empty() {
        return Err(EngineError::invalid("input", "the input is empty"));
    }
    let limits = [
        (
            config.max_model_len,
            "the longest sequence served (--max-model-len)",
        ),
        (
            config.max_batch_tokens,
            "one batch holds (--max-batch-tokens)",
        ),
    ];
    for (i, input) in inputs.iter().enumerate() {
        if input.is_empty() {
            return Err(EngineError::invalid(
                "input",
                format!("input {i} has no tokens"),
            ));
        }
        if let Some((limit, what)) = limits.iter().find(|(l, _)| input.len() > *l) {
            return Err(EngineError::invalid(
                "input",
                format!(
                    "input {i} has {} tokens, more than the {limit} {what}; \
                     shorten it or set truncate_prompt_tokens",
                    input.len()
                ),
            ));
        }
    }
    Ok(())
}

/// Refuses token types that are not one a token of each input (none at
/// all is type 0 everywhere).
pub fn check_token_types(req: &PoolingRequest) -> Result<(), EngineError> {
    let types = &req.token_types;
    if types.is_empty() {
        return Ok(());
    }
    let fits = types.len() == req.inputs.len()
        && types
            .iter()
            .zip(&req.inputs)
            .all(|(t, i)| t.len() == i.len());
    match fits {
        true => Ok(()),
        false => Err(EngineError::invalid(
            "input",
            "the token types are not one a token of each input",
        )),
    }
}
