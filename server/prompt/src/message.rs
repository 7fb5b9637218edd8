//! Chat messages as clients send them (content as text or text parts,
//! names, tool calls and tool results), and as the template reads them.

use ferrox_core::ChatMessage;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::PromptError;

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
    /// An assistant turn's reasoning, sent back as an answer gave it
    /// (vLLM's field); the template gets it as `reasoning_content` and
    /// `thinking`.
    pub reasoning_content: Option<String>,
    /// Newer vLLM's name for `reasoning_content` (that one wins).
    pub reasoning: Option<String>,
}

impl Message {
    /// The content as one string, parts joined by newlines as vLLM joins
    /// them; a part other than text is refused, naming it. `i` is the
    /// message's index, for the error.
    pub fn text(&self, i: usize) -> Result<String, PromptError> {
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
                            (kind, _) => Err(PromptError::invalid(
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
    pub fn for_template(&self, i: usize) -> Result<ChatMessage, PromptError> {
        Ok(ChatMessage {
            role: self.role.clone(),
            content: self.text(i)?,
            name: self.name.clone(),
            tool_calls: self
                .tool_calls
                .as_ref()
                .map(|calls| calls.iter().map(ToolCall::for_template).collect()),
            tool_call_id: self.tool_call_id.clone(),
            ..ChatMessage::default()
        }
        .with_reasoning(self.reasoning_content.clone().or(self.reasoning.clone())))
    }
}
