//! `POST /v1/chat/completions` bodies: the conversation as clients send it
//! (content as text or text parts, names, tool calls and tool results) and
//! the chat-only knobs.

use ferrox_core::ChatMessage;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::request::Knobs;
use crate::tool_choice::ToolRequest;

/// Message content: a string or text parts.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Parts; only `{"type": "text"}` ones.
    Parts(Vec<ContentPart>),
}

/// One content part.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
pub struct ContentPart {
    /// Must be "text".
    #[serde(rename = "type")]
    pub kind: String,
    /// The text.
    pub text: Option<String>,
}

/// A function call of an earlier assistant turn.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
pub struct ToolCall {
    /// The call's id, which a `tool` message answers.
    pub id: Option<String>,
    /// Always "function".
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// What was called.
    pub function: FunctionCall,
}

/// The function and its arguments.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
pub struct FunctionCall {
    /// The function's name.
    pub name: String,
    /// The arguments: a JSON string as OpenAI sends it (an object is taken too).
    #[serde(default)]
    pub arguments: Value,
}

impl ToolCall {
    /// The call as templates read it: `arguments` as an object where the
    /// string parses, as vLLM and transformers pass it.
    fn for_template(&self) -> Value {
        let arguments = match &self.function.arguments {
            Value::String(s) => serde_json::from_str(s).unwrap_or_else(|_| json!(s)),
            Value::Null => json!({}),
            other => other.clone(),
        };
        json!({
            "id": self.id,
            "type": self.kind.as_deref().unwrap_or("function"),
            "function": {"name": self.function.name, "arguments": arguments},
        })
    }
}

/// One chat message.
#[derive(Debug, Clone, Default, Deserialize, Serialize, utoipa::ToSchema)]
pub struct Message {
    /// system, user, assistant, tool, ...
    pub role: String,
    /// The content; may be absent for an assistant turn with tool calls.
    pub content: Option<Content>,
    /// Participant name.
    pub name: Option<String>,
    /// An assistant turn's tool calls.
    pub tool_calls: Option<Vec<ToolCall>>,
    /// The call a `tool` message answers.
    pub tool_call_id: Option<String>,
}

impl Message {
    /// The content as one string, parts joined by newlines as vLLM joins
    /// them; a part other than text is refused, naming it. `i` is the
    /// message's index, for the error.
    pub fn text(&self, i: usize) -> Result<String, ApiError> {
        match &self.content {
            None => Ok(String::new()),
            Some(Content::Text(t)) => Ok(t.clone()),
            Some(Content::Parts(parts)) => {
                let texts =
                    parts
                        .iter()
                        .enumerate()
                        .map(|(j, p)| match (p.kind.as_str(), &p.text) {
                            ("text", Some(t)) => Ok(t.as_str()),
                            (kind, _) => Err(ApiError::invalid(
                                &format!("messages[{i}].content[{j}]"),
                                format!(
                                    "content part {j} of message {i} is of type `{kind}`; only \
                             text parts with a `text` are supported"
                                ),
                            )),
                        });
                Ok(texts.collect::<Result<Vec<_>, _>>()?.join("\n"))
            }
        }
    }

    /// The message as the chat template sees it.
    pub fn for_template(&self, i: usize) -> Result<ChatMessage, ApiError> {
        Ok(ChatMessage {
            role: self.role.clone(),
            content: self.text(i)?,
            name: self.name.clone(),
            tool_calls: self
                .tool_calls
                .as_ref()
                .map(|calls| calls.iter().map(ToolCall::for_template).collect()),
            tool_call_id: self.tool_call_id.clone(),
        })
    }
}

/// The chat template's request fields (vLLM's), read by chat and
/// `/tokenize` alike.
#[derive(Debug, Clone, Default, Deserialize, Serialize, utoipa::ToSchema)]
pub struct TemplateArgs {
    /// Open the assistant's turn (default: true; false with
    /// `continue_final_message`).
    pub add_generation_prompt: Option<bool>,
    /// Continue the last message instead of opening a new turn.
    pub continue_final_message: Option<bool>,
    /// More variables for the template, e.g. `{"enable_thinking": false}`
    /// (what they do is the template's business).
    pub chat_template_kwargs: Option<Map<String, Value>>,
}

impl TemplateArgs {
    /// (add_generation_prompt, continue_final_message); both true is a 400,
    /// as in vLLM.
    pub fn turn(&self) -> Result<(bool, bool), ApiError> {
        let cont = self.continue_final_message == Some(true);
        let add = self.add_generation_prompt.unwrap_or(!cont);
        if add && cont {
            return Err(ApiError::invalid(
                "continue_final_message",
                "continue_final_message and add_generation_prompt cannot both be true",
            ));
        }
        Ok((add, cont))
    }

    /// True when any field is set (they go with messages only).
    pub fn any(&self) -> bool {
        self.add_generation_prompt.is_some()
            || self.continue_final_message.is_some()
            || self.chat_template_kwargs.is_some()
    }
}

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
        let mut kwargs = self
            .template
            .chat_template_kwargs
            .clone()
            .unwrap_or_default();
        for (name, value) in [
            ("reasoning_effort", &self.reasoning_effort),
            ("verbosity", &self.verbosity),
        ] {
            if let Some(v) = value {
                kwargs.entry(name).or_insert_with(|| json!(v));
            }
        }
        (!kwargs.is_empty()).then_some(kwargs)
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
    use super::*;
    use crate::fields::{CHAT_FIELDS, parse};

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
            let err = match chat(&body) {
                Ok(r) => r.messages[0].text(0).unwrap_err(),
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
