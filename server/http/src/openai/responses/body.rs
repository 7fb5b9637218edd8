//! The Responses API's response object: one definition, serialized for whole
//! answers, for the streamed events' snapshots and for /openapi.json.

use ferrox_engine::Usage;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::request::ResponsesRequest;
use crate::openai::response::{Choice, Envelope};
use crate::tools::parser::call_id;

/// A response (`object: "response"`).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ResponseObject {
    /// `resp_...`.
    pub id: String,
    /// `response`.
    pub object: String,
    /// Unix seconds.
    pub created_at: u64,
    /// `in_progress`, `completed`, `incomplete` or `failed`.
    pub status: String,
    /// Why it is incomplete (`max_output_tokens`).
    pub incomplete_details: Option<IncompleteDetails>,
    /// The served model name.
    pub model: String,
    /// The answer: a message, function calls, or both.
    pub output: Vec<OutputItem>,
    /// Token counts; null until it ends.
    pub usage: Option<ResponseUsage>,
    /// What the request asked for, echoed.
    #[serde(flatten)]
    pub settings: Settings,
}

/// The request's settings a response echoes back.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Settings {
    /// The system message given.
    pub instructions: Option<String>,
    /// The token limit given.
    pub max_output_tokens: Option<u64>,
    /// Sampling temperature.
    pub temperature: f32,
    /// Nucleus mass.
    pub top_p: f32,
    /// The tools given.
    pub tools: Vec<Value>,
    /// The tool choice.
    pub tool_choice: Value,
    /// Whether several calls may come at once.
    pub parallel_tool_calls: bool,
    /// The text format given.
    pub text: TextSettings,
    /// Always false: no response is kept.
    pub store: bool,
    /// Always null.
    pub previous_response_id: Option<String>,
    /// Always empty.
    pub metadata: serde_json::Map<String, Value>,
    /// Null unless it failed.
    pub error: Option<Value>,
}

impl From<&ResponsesRequest> for Settings {
    fn from(r: &ResponsesRequest) -> Self {
        let format = r.text.as_ref().and_then(|t| t.format.clone());
        Settings {
            instructions: r.instructions.clone(),
            max_output_tokens: r.max_output_tokens,
            temperature: r.temperature.unwrap_or(1.0),
            top_p: r.top_p.unwrap_or(1.0),
            tools: (r.tools.iter().flatten())
                .map(|t| serde_json::to_value(t).unwrap_or_default())
                .collect(),
            tool_choice: r.tool_choice.clone().unwrap_or_else(|| "auto".into()),
            parallel_tool_calls: r.parallel_tool_calls.unwrap_or(true),
            text: format.map_or_else(TextSettings::plain, |format| TextSettings { format }),
            store: false,
            previous_response_id: None,
            metadata: serde_json::Map::new(),
            error: None,
        }
    }
}

/// The text format a response echoes back (`text`).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TextSettings {
    /// `{"type": "text"}`, `{"type": "json_object"}` or the `json_schema`
    /// format given.
    pub format: Value,
}

impl TextSettings {
    /// Plain text: the format of a request that names none.
    fn plain() -> Self {
        let mut format = serde_json::Map::new();
        format.insert("type".into(), "text".into());
        TextSettings {
            format: Value::Object(format),
        }
    }
}

/// Why a response is incomplete.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct IncompleteDetails {
    /// `max_output_tokens`.
    pub reason: String,
}

/// One output item.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    /// The model's reasoning, read out of its answer by the reasoning
    /// parser (vLLM's shape: no summary, the text as one part).
    Reasoning {
        /// `rs_...`.
        id: String,
        /// Always empty: no summarizer.
        summary: Vec<Value>,
        /// One `reasoning_text` part.
        content: Vec<ReasoningText>,
        /// `in_progress` or `completed`.
        status: String,
    },
    /// The assistant's text.
    Message {
        /// `msg_...`.
        id: String,
        /// `in_progress` or `completed`.
        status: String,
        /// `assistant`.
        role: String,
        /// One `output_text` part.
        content: Vec<OutputText>,
    },
    /// A call of one of the request's functions.
    FunctionCall {
        /// `fc_...`.
        id: String,
        /// `call_...`: what a `function_call_output` answers.
        call_id: String,
        /// The function.
        name: String,
        /// Its arguments, JSON text.
        arguments: String,
        /// `in_progress` or `completed`.
        status: String,
    },
}

/// A message's text part.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OutputText {
    /// `output_text`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text.
    pub text: String,
    /// Always empty.
    pub annotations: Vec<Value>,
}

impl OutputText {
    /// An `output_text` part.
    pub fn new(text: impl Into<String>) -> Self {
        OutputText {
            kind: "output_text".into(),
            text: text.into(),
            annotations: Vec::new(),
        }
    }
}

/// A reasoning item's text part.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReasoningText {
    /// `reasoning_text`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text.
    pub text: String,
}

impl ReasoningText {
    /// A `reasoning_text` part.
    pub fn new(text: impl Into<String>) -> Self {
        ReasoningText {
            kind: "reasoning_text".into(),
            text: text.into(),
        }
    }
}

/// The Responses API's token counts.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ResponseUsage {
    /// Prompt tokens.
    pub input_tokens: usize,
    /// `{"cached_tokens"}`: prompt tokens from the prefix cache.
    pub input_tokens_details: CachedTokens,
    /// Generated tokens.
    pub output_tokens: usize,
    /// `{"reasoning_tokens"}`: generated tokens that were reasoning (0
    /// with no reasoning parser).
    pub output_tokens_details: ReasoningTokens,
    /// Both.
    pub total_tokens: usize,
}

/// Prompt tokens read from the prefix cache.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CachedTokens {
    /// How many.
    pub cached_tokens: usize,
}

/// Reasoning tokens.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReasoningTokens {
    /// How many (0 with no reasoning parser).
    pub reasoning_tokens: usize,
}

impl ResponseUsage {
    /// `u`, of which `reasoning` generated tokens were reasoning.
    fn new(u: Usage, reasoning: usize) -> Self {
        ResponseUsage {
            input_tokens: u.prompt_tokens,
            input_tokens_details: CachedTokens {
                cached_tokens: u.cached_tokens,
            },
            output_tokens: u.completion_tokens,
            output_tokens_details: ReasoningTokens {
                reasoning_tokens: reasoning,
            },
            total_tokens: u.prompt_tokens + u.completion_tokens,
        }
    }
}

/// What every snapshot of one response shares.
#[derive(Debug, Clone)]
pub struct Meta {
    /// `resp_...`.
    pub id: String,
    /// Unix seconds.
    pub created_at: u64,
    /// The served model name.
    pub model: String,
    /// The request's settings.
    pub settings: Settings,
}

impl Meta {
    /// The response that answers `env`: `resp_<the id's tail>`, its time
    /// and model.
    pub fn new(env: &Envelope, settings: Settings) -> Self {
        let tail = env.id.split_once('-').map_or(env.id.as_str(), |(_, t)| t);
        Meta {
            id: format!("resp_{tail}"),
            created_at: env.created,
            model: env.model.clone(),
            settings,
        }
    }

    /// The response with `output` so far; `end` is the finish reason,
    /// usage and reasoning tokens once it ended.
    pub fn snapshot(
        &self,
        output: Vec<OutputItem>,
        end: Option<(&str, Usage, usize)>,
    ) -> ResponseObject {
        let (status, incomplete, usage) = match end {
            None => ("in_progress", None, None),
            Some(("length", u, r)) => (
                "incomplete",
                Some(IncompleteDetails {
                    reason: "max_output_tokens".into(),
                }),
                Some(ResponseUsage::new(u, r)),
            ),
            Some((_, u, r)) => ("completed", None, Some(ResponseUsage::new(u, r))),
        };
        ResponseObject {
            id: self.id.clone(),
            object: "response".into(),
            created_at: self.created_at,
            status: status.into(),
            incomplete_details: incomplete,
            model: self.model.clone(),
            output,
            usage,
            settings: self.settings.clone(),
        }
    }

    /// The id of output item `index` (`msg_...` / `fc_...`).
    pub fn item_id(&self, prefix: &str, index: usize) -> String {
        let tail = self.id.trim_start_matches("resp_");
        format!("{prefix}_{tail}_{index}")
    }

    /// Call `j`'s id, as chat's answers name them.
    pub fn call_id(&self, j: usize) -> String {
        call_id(&self.id, 0, j)
    }
}

/// A whole answer as a response: its reasoning (when read), its text (when
/// there is any, or no call) and then its calls.
pub fn whole(meta: &Meta, choice: Choice, usage: Usage) -> ResponseObject {
    let mut output = Vec::new();
    if let Some(reasoning) = choice.reasoning {
        output.push(OutputItem::Reasoning {
            id: meta.item_id("rs", 0),
            summary: Vec::new(),
            content: vec![ReasoningText::new(reasoning)],
            status: "completed".into(),
        });
    }
    if !choice.text.is_empty() || choice.tool_calls.is_empty() {
        output.push(OutputItem::Message {
            id: meta.item_id("msg", output.len()),
            status: "completed".into(),
            role: "assistant".into(),
            content: vec![OutputText::new(choice.text)],
        });
    }
    for (j, call) in choice.tool_calls.into_iter().enumerate() {
        output.push(OutputItem::FunctionCall {
            id: meta.item_id("fc", output.len()),
            call_id: meta.call_id(j),
            name: call.name,
            arguments: call.arguments,
            status: "completed".into(),
        });
    }
    let reason = if choice.finish == "length" {
        "length"
    } else {
        "stop"
    };
    let reasoning = choice.reasoning_tokens.unwrap_or(0);
    meta.snapshot(output, Some((reason, usage, reasoning)))
}
