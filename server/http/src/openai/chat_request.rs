//! `POST /v1/chat/completions` bodies: the conversation as clients send it
//! (content as text or text parts, names, tool calls and tool results) and
//! the chat-only knobs.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use ferrox_prompt::{Message, TemplateArgs};

use crate::openai::error::ApiError;
use crate::openai::request::Knobs;
use crate::tools::choice::ToolRequest;

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, utoipa::ToSchema)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<Message>,
    /// Newer name for `max_tokens`.
    pub max_completion_tokens: Option<u64>,
    /// Return logprobs.
    pub logprobs: Option<bool>,
    /// Alternatives per token.
    pub top_logprobs: Option<u64>,
    /// Tool definitions, rendered into the template.
    pub tools: Option<Vec<Value>>,
    /// `none`, `auto`, `required` or a named function.
    pub tool_choice: Option<Value>,
    /// More than one call per answer (default true).
    pub parallel_tool_calls: Option<bool>,
    /// Open the answer with the last message's content when it is in the
    /// answer's role (vLLM extra).
    pub echo: Option<bool>,
    /// Passed to the template as `reasoning_effort` (vLLM does; templates
    /// without it ignore it).
    pub reasoning_effort: Option<String>,
    /// Passed to the template as `verbosity`, as `reasoning_effort`.
    pub verbosity: Option<String>,
    /// Send the reasoning read out of the answer as `reasoning_content`
    /// (default true; vLLM's).
    pub include_reasoning: Option<bool>,
    /// The chat template's fields.
    #[serde(flatten)]
    pub template: TemplateArgs,
    /// The shared knobs.
    #[serde(flatten)]
    pub knobs: Knobs,
}

impl ChatRequest {
    /// The template's extra variables: `chat_template_kwargs`, with
    /// `reasoning_effort` and `verbosity` where given and not already there.
    pub fn template_kwargs(&self) -> Option<Map<String, Value>> {
        ferrox_prompt::template_kwargs(
            self.template.chat_template_kwargs.as_ref(),
            self.reasoning_effort.as_deref(),
            self.verbosity.as_deref(),
        )
    }

    /// Refuses values this server does not implement.
    pub fn check_supported(&self) -> Result<(), ApiError> {
        self.knobs.check_supported()?;
        if self.messages.is_empty() {
            return Err(ApiError::invalid("messages", "messages must not be empty"));
        }
        if self.top_logprobs.is_some() && self.logprobs != Some(true) {
            return Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs needs logprobs: true",
            ));
        }
        self.tool_request().map(|_| ())
    }

    /// The checked tools and what to do with them; `None` when no call
    /// can be made.
    pub fn tool_request(&self) -> Result<Option<ToolRequest>, ApiError> {
        ToolRequest::check(
            self.tools.as_deref(),
            self.tool_choice.as_ref(),
            self.parallel_tool_calls,
        )
    }

    /// The tools to render into the template, if any.
    pub fn template_tools(&self) -> Option<&[Value]> {
        self.tools.as_deref().filter(|t| !t.is_empty())
    }

    /// `max_completion_tokens`, else `max_tokens`.
    pub fn max_tokens(&self) -> Option<u64> {
        self.max_completion_tokens.or(self.knobs.max_tokens)
    }
}

#[cfg(test)]
mod tests {
    use ferrox_core::ChatMessage;
    use serde_json::json;

    use super::*;
    use crate::openai::fields::{CHAT_FIELDS, parse};

    fn chat(body: &str) -> Result<ChatRequest, ApiError> {
        let req: ChatRequest = parse(body.as_bytes(), &CHAT_FIELDS)?;
        req.check_supported()?;
        Ok(req)
    }

    const USER: &str = r#""messages": [{"role": "user", "content": "x"}]"#;

    #[test]
    fn refusals_name_the_problem() {
        let cases = [
            (r#"{"messages": []}"#.to_string(), "must not be empty"),
            (
                format!(r#"{{{USER}, "top_logprobs": 2}}"#),
                "logprobs: true",
            ),
            (
                format!(r#"{{{USER}, "tools": [{{"type": "function"}}]}}"#),
                "tools[0].function",
            ),
            (
                format!(r#"{{{USER}, "tool_choice": "required"}}"#),
                "needs `tools`",
            ),
            (
                r#"{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}"#.into(),
                "type `image_url`",
            ),
        ];
        for (body, want) in cases {
            let err: ApiError = match chat(&body) {
                Ok(r) => r.messages[0].text(0).unwrap_err().into(),
                Err(e) => e,
            };
            assert!(err.to_string().contains(want), "{body}: {err}");
        }
    }

    #[test]
    fn messages_become_what_the_template_reads() {
        let req = chat(
            r#"{"messages": [
                {"role": "user", "name": "ann", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "2"},
                {"role": "assistant", "tool_calls": [{"function": {"name": "g", "arguments": "not json"}}]}
            ], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none",
               "max_completion_tokens": 3}"#,
        )
        .unwrap();
        let got: Vec<ChatMessage> = req
            .messages
            .iter()
            .enumerate()
            .map(|(i, m)| m.for_template(i).unwrap())
            .collect();
        assert_eq!(
            (got[0].content.as_str(), got[0].name.as_deref()),
            ("a\nb", Some("ann"))
        );
        let call = &got[1].tool_calls.as_ref().unwrap()[0];
        assert_eq!(call["function"]["arguments"], json!({"x": 1}));
        assert_eq!(
            (call["id"].as_str(), got[1].content.as_str()),
            (Some("c1"), "")
        );
        assert_eq!(got[2].tool_call_id.as_deref(), Some("c1"));
        let bad_args = &got[3].tool_calls.as_ref().unwrap()[0];
        assert_eq!(bad_args["function"]["arguments"], json!("not json"));
        assert_eq!(bad_args["type"], json!("function"));
        assert_eq!(req.template_tools().map(<[Value]>::len), Some(1));
        assert_eq!(req.max_tokens(), Some(3));
    }
}
