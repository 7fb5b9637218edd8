//! The one rule for request fields. A field that changes the output is in an
//! endpoint's list and implemented (or refused by value, naming it); a field
//! that changes nothing a self-hosted server returns is in
//! [`IGNORED_FIELDS`], accepted and logged once; anything else is a 400 that
//! names it. A field sent as `null` counts as absent, as OpenAI and vLLM
//! read it. The lists are checked against the request types in the tests.

use std::sync::atomic::{AtomicBool, Ordering};

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::openai::error::ApiError;

/// Fields both generation endpoints parse, OpenAI's and vLLM's extras.
pub const COMMON_FIELDS: [&str; 36] = [
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "stream",
    "stream_options",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "logit_bias",
    "ignore_eos",
    "top_k",
    "min_p",
    "repetition_penalty",
    "stop_token_ids",
    "logprobs",
    "skip_special_tokens",
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
    "priority",
    "request_id",
    "min_tokens",
    "include_stop_str_in_output",
    "cache_salt",
    "truncate_prompt_tokens",
    "allowed_token_ids",
    "bad_words",
    "return_tokens_as_token_ids",
    "prompt_logprobs",
    "disable_spec_decode",
];
/// Fields only `/v1/completions` parses.
pub const COMPLETION_FIELDS: [&str; 4] = ["prompt", "echo", "best_of", "suffix"];
/// Fields only `/v1/chat/completions` parses.
pub const CHAT_FIELDS: [&str; 13] = [
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template_kwargs",
    "reasoning_effort",
    "verbosity",
    "echo",
    "include_reasoning",
];
/// Fields `/tokenize` parses (vLLM's): a prompt, or messages for the chat
/// template.
pub const TOKENIZE_FIELDS: [&str; 9] = [
    "model",
    "prompt",
    "messages",
    "add_special_tokens",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template_kwargs",
    "return_token_strs",
    "tools",
];
/// Fields `/v1/responses` parses (OpenAI's Responses API).
pub const RESPONSES_FIELDS: [&str; 17] = [
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "stream",
    "store",
    "previous_response_id",
    "conversation",
    "include",
    "truncation",
    "reasoning",
];
/// Fields `/v1/embeddings` parses: OpenAI's, and vLLM's
/// `truncate_prompt_tokens` and `normalize`.
pub const EMBEDDING_FIELDS: [&str; 7] = [
    "model",
    "input",
    "encoding_format",
    "dimensions",
    "truncate_prompt_tokens",
    "normalize",
    "prompt_name",
];
/// Fields `/v1/rerank` and `/rerank` parse (Cohere's and Jina's).
pub const RERANK_FIELDS: [&str; 5] = ["model", "query", "documents", "top_n", "return_documents"];
/// Fields `/score` parses (vLLM's).
pub const SCORE_FIELDS: [&str; 3] = ["model", "text_1", "text_2"];
/// Fields `/detokenize` parses (vLLM's).
pub const DETOKENIZE_FIELDS: [&str; 2] = ["model", "tokens"];
/// The fields of one chat message.
pub const MESSAGE_FIELDS: [&str; 7] = [
    "role",
    "content",
    "name",
    "tool_calls",
    "tool_call_id",
    "reasoning_content",
    "reasoning",
];

/// Request fields that change nothing a self-hosted server returns: who the
/// end user is, OpenAI-side storage, billing tier, cache routing, and a
/// detokenizer option only slow tokenizers have.
pub const IGNORED_FIELDS: [&str; 7] = [
    "user",
    "store",
    "metadata",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    // vLLM applies it only with slow (Python) tokenizers; a fast one's
    // decode, which ours is, never puts spaces between special tokens.
    "spaces_between_special_tokens",
];
/// Message fields clients send back from an earlier response that the
/// template has no use for.
pub const IGNORED_MESSAGE_FIELDS: [&str; 3] = ["refusal", "annotations", "audio"];

/// One flag per ignored field: logged already.
static LOGGED: [AtomicBool; IGNORED_FIELDS.len() + IGNORED_MESSAGE_FIELDS.len()] =
    [const { AtomicBool::new(false) }; IGNORED_FIELDS.len() + IGNORED_MESSAGE_FIELDS.len()];

/// Parses a generation request: `body` as a JSON object with only
/// `COMMON_FIELDS`, `extra` and ignored keys.
pub fn parse<T: DeserializeOwned>(body: &[u8], extra: &[&str]) -> Result<T, ApiError> {
    parse_fields(body, &[&COMMON_FIELDS, extra])
}

/// Parses `body` as a JSON object with only the keys of `lists` and the
/// ignored ones (dropped first); messages, if any, are held to the same
/// rule.
pub fn parse_fields<T: DeserializeOwned>(body: &[u8], lists: &[&[&str]]) -> Result<T, ApiError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::BadJson(e.to_string()))?;
    let Value::Object(mut object) = value else {
        return Err(ApiError::BadJson("the body must be a JSON object".into()));
    };
    let accepted = |k: &str| lists.iter().any(|l| l.contains(&k));
    keep_known(&mut object, accepted, &IGNORED_FIELDS, 0, "")?;
    if let Some(Value::Array(messages)) = object.get_mut("messages") {
        for (i, m) in messages.iter_mut().enumerate() {
            if let Value::Object(m) = m {
                let at = format!("messages[{i}].");
                let offset = IGNORED_FIELDS.len();
                let known = |k: &str| MESSAGE_FIELDS.contains(&k);
                keep_known(m, known, &IGNORED_MESSAGE_FIELDS, offset, &at)?;
            }
        }
    }
    serde_json::from_value(Value::Object(object)).map_err(|e| ApiError::BadJson(e.to_string()))
}

/// Drops null and ignored keys of `object` and refuses any other key that
/// `known` does not accept; `at` prefixes the field in the message.
fn keep_known(
    object: &mut Map<String, Value>,
    known: impl Fn(&str) -> bool,
    ignored: &[&str],
    log_offset: usize,
    at: &str,
) -> Result<(), ApiError> {
    object.retain(|_, v| !v.is_null());
    if let Some(key) = object
        .keys()
        .find(|k| !known(k.as_str()) && !ignored.contains(&k.as_str()))
    {
        return Err(ApiError::invalid(
            &format!("{at}{key}"),
            format!("unsupported field `{at}{key}`"),
        ));
    }
    // An ignored name an endpoint implements (the Responses API's `store`)
    // is that endpoint's to read.
    for (i, name) in ignored.iter().enumerate().filter(|(_, n)| !known(n)) {
        if object.remove(*name).is_some() && !LOGGED[log_offset + i].swap(true, Ordering::Relaxed) {
            tracing::debug!(field = %format!("{at}{name}"), "accepted and ignored (logged once)");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
