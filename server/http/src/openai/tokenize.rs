//! `POST /tokenize` and `POST /detokenize` in vLLM's shapes: a prompt, or
//! messages through the chat template, to token ids; token ids to text.

use ferrox_core::RenderOptions;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::openai::chat_request::{Message, TemplateArgs};
use crate::openai::error::ApiError;
use crate::openai::prepare::{PrepareConfig, chat_prompt};
use crate::openai::response_schema::{DetokenizeResponse, TokenizeResponse};
use crate::serve::frontend::Frontend;

/// `POST /tokenize`: `prompt`, or `messages` (with the chat template).
#[derive(Debug, Clone, Default, Deserialize, Serialize, utoipa::ToSchema)]
pub struct TokenizeRequest {
    /// The model asked for.
    pub model: Option<String>,
    /// Text to tokenize.
    pub prompt: Option<String>,
    /// A conversation to render and tokenize.
    pub messages: Option<Vec<Message>>,
    /// Add the tokenizer's special tokens (default: true for a prompt; the
    /// template writes its own, so false for messages).
    pub add_special_tokens: Option<bool>,
    /// The chat template's fields (messages only).
    #[serde(flatten)]
    pub template: TemplateArgs,
    /// Also return each token's string.
    pub return_token_strs: Option<bool>,
    /// Tool definitions for the template (messages only).
    pub tools: Option<Vec<Value>>,
}

/// `POST /detokenize`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, utoipa::ToSchema)]
pub struct DetokenizeRequest {
    /// The model asked for.
    pub model: Option<String>,
    /// Token ids.
    pub tokens: Vec<u32>,
}

/// Tokenizes a request; the answer is `{count, max_model_len, tokens,
/// token_strs}`.
pub fn tokenize(
    r: TokenizeRequest,
    f: &dyn Frontend,
    c: &PrepareConfig,
) -> Result<TokenizeResponse, ApiError> {
    c.check_model(r.model.as_deref())?;
    let tokens = match (&r.prompt, &r.messages) {
        (Some(prompt), None) => {
            if r.template.any() || r.tools.is_some() {
                return Err(ApiError::invalid(
                    "add_generation_prompt",
                    "add_generation_prompt, continue_final_message, chat_template_kwargs and \
                     tools go with messages, not prompt",
                ));
            }
            let special = r.add_special_tokens.unwrap_or(true);
            f.encode(prompt, special).map_err(ApiError::Prompt)?
        }
        (None, Some(messages)) => {
            let (add_generation_prompt, continue_final_message) = r.template.turn()?;
            let options = RenderOptions {
                add_generation_prompt,
                continue_final_message,
                tools: r.tools.as_deref().filter(|t| !t.is_empty()),
                kwargs: r.template.chat_template_kwargs.as_ref(),
            };
            // As chat with tools and no tool_choice ("auto"): calls are read
            // whenever this server reads any.
            let mut ids = chat_prompt(messages, &options, c.tools.family.is_some(), c, f)?;
            if r.add_special_tokens == Some(true) {
                // As vLLM: the tokenizer's own special tokens on top.
                let mut with = f.encode("", true).map_err(ApiError::Prompt)?;
                with.append(&mut ids);
                ids = with;
            }
            ids
        }
        _ => {
            return Err(ApiError::invalid(
                "prompt",
                "give exactly one of prompt and messages",
            ));
        }
    };
    let strs = (r.return_token_strs == Some(true))
        .then(|| tokens.iter().map(|&t| f.raw_token(t)).collect::<Vec<_>>());
    Ok(TokenizeResponse {
        count: tokens.len(),
        max_model_len: c.max_model_len,
        tokens,
        token_strs: strs,
    })
}

/// Detokenizes a request; the answer is `{prompt}`.
pub fn detokenize(
    r: DetokenizeRequest,
    f: &dyn Frontend,
    c: &PrepareConfig,
) -> Result<DetokenizeResponse, ApiError> {
    c.check_model(r.model.as_deref())?;
    let vocab = f.vocab_size();
    if let Some(bad) = r.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid(
            "tokens",
            format!("token id {bad} is outside the vocabulary (size {vocab})"),
        ));
    }
    let prompt = f.decode(&r.tokens).map_err(ApiError::Prompt)?;
    Ok(DetokenizeResponse { prompt })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::fixtures::FakeFrontend;
    use crate::openai::fields::{DETOKENIZE_FIELDS, TOKENIZE_FIELDS, parse_fields};

    fn config() -> PrepareConfig {
        PrepareConfig {
            model_name: "fake".into(),
            max_model_len: 128,
            default_max_tokens: 5,
            max_queue: 8,
            tools: crate::tools::parser::ToolSetup {
                family: Some(crate::tools::parser::ToolFamily::Hermes),
                describe: false,
            },
            reasoning: None,
            adapters: None,
        }
    }

    /// An answer as it goes on the wire.
    fn wire(body: impl Serialize) -> Value {
        serde_json::to_value(body).unwrap()
    }

    fn run(path: &str, body: &str) -> Result<Value, ApiError> {
        let b = body.as_bytes();
        if path == "tokenize" {
            tokenize(
                parse_fields(b, &[&TOKENIZE_FIELDS])?,
                &FakeFrontend,
                &config(),
            )
            .map(wire)
        } else {
            detokenize(
                parse_fields(b, &[&DETOKENIZE_FIELDS])?,
                &FakeFrontend,
                &config(),
            )
            .map(wire)
        }
    }

    #[test]
    fn tokenize_and_detokenize_in_vllm_shapes() {
        // The fake tokenizer: byte b is token b % 64, token i reads '0' + i;
        // the fake template writes "role:content\n".
        let cases: [(&str, &str, Result<Value, &str>); 9] = [
            (
                "tokenize",
                r#"{"prompt": "AB", "return_token_strs": true}"#,
                Ok(
                    json!({"count": 2, "max_model_len": 128, "tokens": [1, 2], "token_strs": ["1", "2"]}),
                ),
            ),
            (
                "tokenize",
                r#"{"model": "fake", "messages": [{"role": "u", "content": "A"}]}"#,
                Ok(
                    json!({"count": 4, "max_model_len": 128, "tokens": [53, 58, 1, 10], "token_strs": null}),
                ),
            ),
            (
                "tokenize",
                r#"{"messages": [{"role": "u", "content": "A"}], "tools": [{"type": "function"}]}"#,
                Ok(json!({"count": 12, "max_model_len": 128,
                    "tokens": [53, 58, 1, 10, 52, 47, 47, 44, 51, 58, 49, 10], "token_strs": null})),
            ),
            (
                "tokenize",
                r#"{"prompt": "A", "messages": []}"#,
                Err("exactly one of"),
            ),
            ("tokenize", r#"{}"#, Err("exactly one of")),
            (
                "tokenize",
                r#"{"prompt": "A", "max_tokens": 3}"#,
                Err("`max_tokens`"),
            ),
            (
                "tokenize",
                r#"{"prompt": "A", "model": "other"}"#,
                Err("does not exist"),
            ),
            (
                "detokenize",
                r#"{"tokens": [1, 2, 10]}"#,
                Ok(json!({"prompt": "12:"})),
            ),
            (
                "detokenize",
                r#"{"tokens": [64]}"#,
                Err("outside the vocabulary (size 64)"),
            ),
        ];
        for (path, body, want) in cases {
            match (run(path, body), want) {
                (Ok(v), Ok(w)) => assert_eq!(v, w, "{body}"),
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{body}: {e}"),
                (g, w) => panic!("{body}: {g:?} vs {w:?}"),
            }
        }
    }

    #[test]
    fn a_conversation_with_tools_counts_what_chat_submits() {
        // A template that renders no tools: both describe them in the system
        // message, from the one function.
        let mut c = config();
        c.tools.describe = true;
        let body = r#"{"messages": [{"role": "user", "content": "A"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}"#;
        let counted = wire(
            tokenize(
                parse_fields(body.as_bytes(), &[&TOKENIZE_FIELDS]).unwrap(),
                &FakeFrontend,
                &c,
            )
            .unwrap(),
        );
        let chat_body =
            crate::openai::fields::parse(body.as_bytes(), &crate::openai::fields::CHAT_FIELDS)
                .unwrap();
        let chat = crate::openai::prepare::chat(chat_body, &FakeFrontend, &c).unwrap();
        let submitted = &chat.jobs[0].req.prompt;
        assert_eq!(counted["tokens"], json!(submitted));
        let plain = run(
            "tokenize",
            r#"{"messages": [{"role": "user", "content": "A"}]}"#,
        )
        .unwrap();
        assert!(submitted.len() > plain["count"].as_u64().unwrap() as usize + 20);
    }
}
