//! `POST /v1/responses` bodies, and their translation into the chat request
//! the rest of the server already prepares (one template, tool and grammar
//! path for both APIs).

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::openai::chat_request::ChatRequest;
use crate::openai::error::ApiError;

/// `POST /v1/responses` (OpenAI's Responses API, without a response store).
#[derive(Debug, Clone, Default, Deserialize, Serialize, utoipa::ToSchema)]
pub struct ResponsesRequest {
    /// The model asked for.
    pub model: Option<String>,
    /// A string (one user message) or a list of messages, function calls
    /// and function call outputs.
    pub input: Option<Input>,
    /// A system message put before the input.
    pub instructions: Option<String>,
    /// Most tokens to generate.
    pub max_output_tokens: Option<u64>,
    /// Softmax temperature.
    pub temperature: Option<f32>,
    /// Nucleus mass.
    pub top_p: Option<f32>,
    /// Function tools (`{"type": "function", "name", "parameters", ...}`).
    pub tools: Option<Vec<FunctionTool>>,
    /// `none`, `auto`, `required` or `{"type": "function", "name"}`.
    pub tool_choice: Option<Value>,
    /// More than one call per answer (default true).
    pub parallel_tool_calls: Option<bool>,
    /// `{"format": {"type": "text" | "json_object" | "json_schema", ...}}`.
    pub text: Option<TextOptions>,
    /// Stream the Responses API's events.
    pub stream: Option<bool>,
    /// Only `false`: this server keeps no responses.
    pub store: Option<bool>,
    /// Refused: there is no response store to continue from.
    pub previous_response_id: Option<String>,
    /// Refused, as `previous_response_id`: no conversation store.
    pub conversation: Option<Value>,
    /// Extra output to include. Reasoning and hosted tools' extras are
    /// empty here (no such items); `message.output_text.logprobs` is
    /// refused (not served).
    pub include: Option<Vec<String>>,
    /// `disabled` or `auto`: either way a prompt past the context is a 400.
    pub truncation: Option<String>,
    /// `{"effort": ...}`: passed to the template as `reasoning_effort`.
    pub reasoning: Option<Value>,
}

/// The input: one text, or items.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Input {
    /// One user message.
    Text(String),
    /// Messages, function calls and their outputs, in order.
    Items(Vec<InputItem>),
}

/// One input item; which fields count depends on `type` (a message when it
/// is absent).
#[derive(Debug, Clone, Default, Deserialize, Serialize, utoipa::ToSchema)]
pub struct InputItem {
    /// `message` (the default), `function_call` or `function_call_output`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// A message's role: `user`, `assistant`, `system` or `developer`.
    pub role: Option<String>,
    /// A message's text, or its parts (`input_text` / `output_text`).
    pub content: Option<ItemContent>,
    /// The call a `function_call` makes or a `function_call_output` answers.
    pub call_id: Option<String>,
    /// A `function_call`'s function.
    pub name: Option<String>,
    /// A `function_call`'s arguments, JSON text.
    pub arguments: Option<String>,
    /// A `function_call_output`'s result (text, or JSON sent as its text).
    pub output: Option<Value>,
    /// The item's id in an earlier response (not needed here).
    pub id: Option<String>,
    /// The item's status in an earlier response (not needed here).
    pub status: Option<String>,
}

/// A message's content.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum ItemContent {
    /// Plain text.
    Text(String),
    /// Text parts.
    Parts(Vec<ItemPart>),
}

/// One content part: `input_text`, `output_text` or `text`.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
pub struct ItemPart {
    /// The part's kind.
    #[serde(rename = "type")]
    pub kind: String,
    /// Its text.
    pub text: Option<String>,
}

/// A function tool, as the Responses API writes it (flat, not under
/// `function`).
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
pub struct FunctionTool {
    /// Only `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function's name.
    pub name: String,
    /// What it does.
    pub description: Option<String>,
    /// A JSON schema of its arguments.
    pub parameters: Option<Value>,
    /// Arguments exactly of the schema.
    pub strict: Option<bool>,
}

/// `text`: the output's format.
#[derive(Debug, Clone, Default, Deserialize, Serialize, utoipa::ToSchema)]
pub struct TextOptions {
    /// `{"type": "text"}`, `{"type": "json_object"}` or `{"type":
    /// "json_schema", "name", "schema", "strict"}`.
    pub format: Option<Value>,
}

impl ResponsesRequest {
    /// The chat request that answers this one; refuses what the Responses
    /// API here cannot do, naming the field.
    pub fn to_chat(&self) -> Result<ChatRequest, ApiError> {
        if self.store == Some(true) {
            return Err(ApiError::invalid(
                "store",
                "store: this server keeps no responses; send store: false",
            ));
        }
        if self.conversation.is_some() {
            return Err(ApiError::invalid(
                "conversation",
                "conversation: this server keeps no conversations; send the whole input",
            ));
        }
        if let Some(asked) = (self.include.iter().flatten()).find(|i| i.contains("logprobs")) {
            return Err(ApiError::invalid(
                "include",
                format!("include: `{asked}` is not served"),
            ));
        }
        if let Some(t) = self
            .truncation
            .as_deref()
            .filter(|t| !matches!(*t, "disabled" | "auto"))
        {
            return Err(ApiError::invalid(
                "truncation",
                format!("truncation is `disabled` or `auto`, not `{t}`"),
            ));
        }
        if self.previous_response_id.is_some() {
            return Err(ApiError::invalid(
                "previous_response_id",
                "previous_response_id: this server keeps no responses; send the whole input",
            ));
        }
        let mut chat = json!({"messages": self.messages()?});
        let fields = [
            ("model", json!(self.model)),
            ("max_tokens", json!(self.max_output_tokens)),
            ("temperature", json!(self.temperature)),
            ("top_p", json!(self.top_p)),
            ("parallel_tool_calls", json!(self.parallel_tool_calls)),
            ("stream", json!(self.stream)),
            ("tools", self.chat_tools()?),
            ("tool_choice", self.chat_tool_choice()),
            ("response_format", self.response_format()),
            (
                "reasoning_effort",
                json!(self.reasoning.as_ref().and_then(|r| r.get("effort"))),
            ),
        ];
        for (k, v) in fields {
            if !v.is_null() {
                chat[k] = v;
            }
        }
        serde_json::from_value(chat).map_err(|e| ApiError::BadJson(e.to_string()))
    }

    /// `instructions`, then the input, as chat messages: consecutive
    /// function calls become one assistant turn, outputs tool messages.
    fn messages(&self) -> Result<Vec<Value>, ApiError> {
        let mut out = Vec::new();
        if let Some(i) = &self.instructions {
            out.push(json!({"role": "system", "content": i}));
        }
        match &self.input {
            None => return Err(ApiError::invalid("input", "input is required")),
            Some(Input::Text(t)) => out.push(json!({"role": "user", "content": t})),
            Some(Input::Items(items)) => {
                for (i, item) in items.iter().enumerate() {
                    push_item(&mut out, item, i)?;
                }
            }
        }
        if out.iter().all(|m| m["role"] == "system") {
            return Err(ApiError::invalid("input", "input has no message"));
        }
        Ok(out)
    }

    fn chat_tools(&self) -> Result<Value, ApiError> {
        let Some(tools) = &self.tools else {
            return Ok(Value::Null);
        };
        let tools: Result<Vec<Value>, ApiError> = (tools.iter().enumerate())
            .map(|(i, t)| match t.kind.as_str() {
                "function" => Ok(json!({"type": "function", "function": {
                    "name": t.name, "description": t.description,
                    "parameters": t.parameters, "strict": t.strict,
                }})),
                other => Err(ApiError::invalid(
                    &format!("tools[{i}].type"),
                    format!("tools[{i}] is a `{other}` tool; only function tools are served"),
                )),
            })
            .collect();
        Ok(Value::Array(tools?))
    }

    fn chat_tool_choice(&self) -> Value {
        match &self.tool_choice {
            Some(Value::Object(o)) if o.get("type") == Some(&json!("function")) => {
                json!({"type": "function", "function": {"name": o.get("name")}})
            }
            other => json!(other),
        }
    }

    /// `text.format` as chat's `response_format`.
    fn response_format(&self) -> Value {
        let Some(Value::Object(f)) = self.text.as_ref().and_then(|t| t.format.as_ref()) else {
            return Value::Null;
        };
        match f.get("type").and_then(Value::as_str) {
            Some("json_schema") => {
                let mut schema = f.clone();
                schema.remove("type");
                json!({"type": "json_schema", "json_schema": Value::Object(schema)})
            }
            _ => Value::Object(f.clone()),
        }
    }
}

/// One input item onto the chat messages.
fn push_item(out: &mut Vec<Value>, item: &InputItem, i: usize) -> Result<(), ApiError> {
    let missing = |field: &str| {
        ApiError::invalid(
            &format!("input[{i}].{field}"),
            format!("input[{i}] has no `{field}`"),
        )
    };
    match item.kind.as_deref().unwrap_or("message") {
        "message" => {
            let role = item.role.as_deref().ok_or_else(|| missing("role"))?;
            // The Responses API's `developer` is chat's system turn.
            let role = if role == "developer" { "system" } else { role };
            out.push(json!({"role": role, "content": item_text(item, i)?}));
        }
        "function_call" => {
            let call = json!({
                "id": item.call_id.as_ref().ok_or_else(|| missing("call_id"))?,
                "type": "function",
                "function": {
                    "name": item.name.as_ref().ok_or_else(|| missing("name"))?,
                    "arguments": item.arguments.clone().unwrap_or_else(|| "{}".into()),
                },
            });
            match out.last_mut() {
                Some(last) if last["role"] == "assistant" && last.get("tool_calls").is_some() => {
                    if let Some(calls) = last["tool_calls"].as_array_mut() {
                        calls.push(call);
                    }
                }
                _ => out.push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
            }
        }
        "function_call_output" => {
            let output = match item.output.as_ref().ok_or_else(|| missing("output"))? {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            out.push(json!({
                "role": "tool",
                "tool_call_id": item.call_id.as_ref().ok_or_else(|| missing("call_id"))?,
                "content": output,
            }));
        }
        other => {
            return Err(ApiError::invalid(
                &format!("input[{i}].type"),
                format!(
                    "input[{i}] is of type `{other}`; only message, function_call and function_call_output items are served"
                ),
            ));
        }
    }
    Ok(())
}

/// A message item's text: a string, or its text parts joined by newlines.
fn item_text(item: &InputItem, i: usize) -> Result<String, ApiError> {
    match &item.content {
        None => Ok(String::new()),
        Some(ItemContent::Text(t)) => Ok(t.clone()),
        Some(ItemContent::Parts(parts)) => {
            let texts: Result<Vec<&str>, ApiError> = (parts.iter().enumerate())
                .map(|(j, p)| match (p.kind.as_str(), &p.text) {
                    ("input_text" | "output_text" | "text", Some(t)) => Ok(t.as_str()),
                    (kind, _) => Err(ApiError::invalid(
                        &format!("input[{i}].content[{j}]"),
                        format!("input[{i}].content[{j}] is of type `{kind}`; only text parts are served"),
                    )),
                })
                .collect();
            Ok(texts?.join("\n"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: Value) -> Result<Value, ApiError> {
        let r: ResponsesRequest = serde_json::from_value(body).unwrap();
        r.to_chat().map(|c| serde_json::to_value(c).unwrap())
    }

    #[test]
    fn input_becomes_chat_messages() {
        let got = chat(json!({
            "instructions": "Be brief.",
            "input": [
                {"role": "developer", "content": "No lists."},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{\"city\":\"Oslo\"}"},
                {"type": "function_call", "call_id": "c2", "name": "weather", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            ],
            "max_output_tokens": 7,
            "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "weather"},
            "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
        }))
        .unwrap();
        let roles: Vec<&str> = (got["messages"].as_array().unwrap().iter())
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["system", "system", "user", "assistant", "tool"]);
        assert_eq!(got["messages"][2]["content"], "Weather?");
        assert_eq!(
            got["messages"][3]["tool_calls"].as_array().unwrap().len(),
            2
        );
        assert_eq!(got["messages"][4]["tool_call_id"], "c1");
        assert_eq!(got["max_tokens"], 7);
        assert_eq!(got["tools"][0]["function"]["name"], "weather");
        assert_eq!(got["tool_choice"]["function"]["name"], "weather");
        assert_eq!(got["response_format"]["json_schema"]["name"], "w");
    }

    #[test]
    fn what_cannot_be_served_is_refused_naming_it() {
        // (body, the field named)
        let cases = [
            (json!({"input": "hi", "store": true}), "store"),
            (
                json!({"input": "hi", "previous_response_id": "resp_1"}),
                "previous_response_id",
            ),
            (json!({}), "input"),
            (
                json!({"input": "hi", "conversation": "conv_1"}),
                "conversation",
            ),
            (
                json!({"input": "hi", "include": ["message.output_text.logprobs"]}),
                "include",
            ),
            (json!({"input": "hi", "truncation": "middle"}), "truncation"),
            (json!({"input": [{"type": "reasoning"}]}), "input[0].type"),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}),
                "input[0].content[0]",
            ),
            (
                json!({"input": "hi", "tools": [{"type": "web_search", "name": "w"}]}),
                "tools[0].type",
            ),
            (
                json!({"input": [{"type": "function_call_output", "output": "x"}]}),
                "input[0].call_id",
            ),
        ];
        for (body, field) in cases {
            let e = chat(body.clone()).unwrap_err();
            let param = match &e {
                ApiError::Invalid { param, .. } => param.as_deref(),
                _ => None,
            };
            assert_eq!(param, Some(field), "{body}: {e}");
        }
    }
}
