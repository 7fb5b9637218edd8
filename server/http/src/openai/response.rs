//! OpenAI response bodies and stream chunks.

use ferrox_engine::{TokenLogprob, Usage};
use serde::Serialize;
use serde_json::{Value, json};

use crate::serve::frontend::Frontend;
use crate::tools::parser::event::ToolEvent;
use crate::tools::parser::{ParsedCall, call_id};

/// Which endpoint a response is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `/v1/completions`.
    Completion,
    /// `/v1/chat/completions`.
    Chat,
}

/// The parts every response and chunk of one request share.
#[derive(Debug, Clone)]
pub struct Envelope {
    /// Which endpoint.
    pub kind: Kind,
    /// `cmpl-...` or `chatcmpl-...`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// Logprobs name tokens `token_id:N` (vLLM's
    /// `return_tokens_as_token_ids`), not by their text.
    pub token_ids: bool,
}

/// OpenAI's usage object.
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct UsageBody {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Both.
    pub total_tokens: usize,
    /// Where the prompt tokens came from.
    pub prompt_tokens_details: PromptTokensDetails,
}

/// OpenAI's `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct PromptTokensDetails {
    /// Prompt tokens read from the prefix cache instead of computed.
    pub cached_tokens: usize,
}

impl From<Usage> for UsageBody {
    fn from(u: Usage) -> Self {
        UsageBody {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens + u.completion_tokens,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: u.cached_tokens,
            },
        }
    }
}

/// Logprobs gathered for one choice.
#[derive(Debug, Clone, Default)]
pub struct Logprobs {
    /// Echoed prompt tokens (completions): id, logprob (none for the
    /// first) and where its text starts.
    pub prompt: Vec<(u32, Option<TokenLogprob>, usize)>,
    /// One entry per generated token with text, and where its text starts.
    pub tokens: Vec<(TokenLogprob, usize)>,
}

impl Logprobs {
    /// The echoed prompt's entries from the engine's, offsets counted from
    /// the start of the echoed text.
    pub fn echoed(ids: &[u32], entries: Vec<Option<TokenLogprob>>, f: &dyn Frontend) -> Self {
        let mut offset = 0;
        let prompt = ids
            .iter()
            .zip(entries.into_iter().chain(std::iter::repeat(None)))
            .map(|(&id, e)| {
                let at = offset;
                offset += f.token_str(id).len();
                (id, e, at)
            })
            .collect();
        Logprobs {
            prompt,
            tokens: Vec::new(),
        }
    }
}

/// One finished choice.
#[derive(Debug, Clone)]
pub struct Choice {
    /// Its whole text (after the echoed prompt, if any).
    pub text: String,
    /// Why it ended.
    pub finish: &'static str,
    /// Its logprobs, in the endpoint's shape.
    pub logprobs: Option<Value>,
    /// The tool calls read out of it (chat).
    pub tool_calls: Vec<ParsedCall>,
    /// The prompt's logprobs in vLLM's shape, with `prompt_logprobs`.
    pub prompt_logprobs: Option<Value>,
}

impl Envelope {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Completion, _) => "text_completion",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
        }
    }

    fn frame(&self, chunk: bool, choices: Vec<Value>) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    /// A whole, non-streamed response.
    pub fn full(&self, choices: Vec<Choice>, usage: Usage) -> Value {
        // Chat gives the prompt's logprobs once, beside the choices (vLLM).
        let chat_prompt_logprobs = match self.kind {
            Kind::Chat => choices.first().and_then(|c| c.prompt_logprobs.clone()),
            Kind::Completion => None,
        };
        let choices = choices
            .into_iter()
            .enumerate()
            .map(|(index, c)| match self.kind {
                Kind::Completion => {
                    let mut v = json!({
                        "index": index, "text": c.text, "logprobs": c.logprobs,
                        "finish_reason": c.finish,
                    });
                    if let Some(p) = c.prompt_logprobs {
                        v["prompt_logprobs"] = p;
                    }
                    v
                }
                Kind::Chat => json!({
                    "index": index,
                    "message": self.message(index, &c),
                    "logprobs": c.logprobs,
                    "finish_reason": c.finish,
                }),
            })
            .collect();
        let mut v = self.frame(false, choices);
        v["usage"] = json!(UsageBody::from(usage));
        if let Some(p) = chat_prompt_logprobs {
            v["prompt_logprobs"] = p;
        }
        v
    }

    /// The prompt's logprobs as vLLM gives them: null for the first token,
    /// then per token a map from token id to its logprob, rank and text, for
    /// the token itself and its top alternatives.
    pub fn prompt_logprobs(&self, entries: &[Option<TokenLogprob>], f: &dyn Frontend) -> Value {
        let one = |id: u32, logprob: f32, rank: usize| json!({"logprob": logprob, "rank": rank, "decoded_token": f.token_str(id)});
        let body: Vec<Value> = entries
            .iter()
            .map(|e| {
                let Some(t) = e else { return Value::Null };
                let mut m = serde_json::Map::new();
                for (rank, (id, l)) in t.top.iter().enumerate() {
                    m.insert(id.to_string(), one(*id, *l, rank + 1));
                }
                m.insert(t.id.to_string(), one(t.id, t.logprob, t.rank));
                Value::Object(m)
            })
            .collect();
        Value::Array(body)
    }

    /// A chat choice's message: its text, and its calls with their ids.
    fn message(&self, index: usize, c: &Choice) -> Value {
        if c.tool_calls.is_empty() {
            return json!({"role": "assistant", "content": c.text});
        }
        let calls: Vec<Value> = c
            .tool_calls
            .iter()
            .enumerate()
            .map(|(j, call)| {
                json!({
                    "id": call_id(&self.id, index, j),
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                })
            })
            .collect();
        let content = (!c.text.is_empty()).then_some(c.text.as_str());
        json!({"role": "assistant", "content": content, "tool_calls": calls})
    }

    /// A streamed chunk of choice `index` from the tool reader: text, or a
    /// call's start (index, id, type, name and empty arguments) or more of
    /// its arguments, as OpenAI streams them.
    pub fn tool_chunk(&self, index: usize, event: &ToolEvent, role: bool) -> Value {
        let mut delta = match event {
            ToolEvent::Content(text) => json!({"content": text}),
            ToolEvent::Start { index: k, name } => json!({"tool_calls": [{
                "index": k, "id": call_id(&self.id, index, *k), "type": "function",
                "function": {"name": name, "arguments": ""},
            }]}),
            ToolEvent::Arguments { index: k, fragment } => json!({"tool_calls": [{
                "index": k, "function": {"arguments": fragment},
            }]}),
        };
        if role {
            delta["role"] = json!("assistant");
        }
        let choice =
            json!({"index": index, "delta": delta, "logprobs": null, "finish_reason": null});
        self.frame(true, vec![choice])
    }

    /// One streamed chunk of choice `index`; `role` marks its first chat
    /// chunk.
    pub fn chunk(
        &self,
        index: usize,
        text: &str,
        role: bool,
        finish: Option<&str>,
        logprobs: Option<Value>,
    ) -> Value {
        let choice = match self.kind {
            Kind::Completion => json!({
                "index": index, "text": text, "logprobs": logprobs, "finish_reason": finish,
            }),
            Kind::Chat => {
                let mut delta = json!({});
                if role {
                    delta["role"] = json!("assistant");
                }
                if !text.is_empty() || role {
                    delta["content"] = json!(text);
                }
                json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
            }
        };
        self.frame(true, vec![choice])
    }

    /// The final usage chunk (`stream_options.include_usage`).
    pub fn usage_chunk(&self, usage: Usage) -> Value {
        let mut v = self.frame(true, Vec::new());
        v["usage"] = json!(UsageBody::from(usage));
        v
    }

    /// Logprobs in this endpoint's shape.
    pub fn logprobs(&self, lp: &Logprobs, frontend: &dyn Frontend) -> Value {
        let token_ids = self.token_ids;
        let name = |id: u32| {
            if token_ids {
                format!("token_id:{id}")
            } else {
                frontend.token_str(id)
            }
        };
        match self.kind {
            Kind::Completion => completion_logprobs(lp, &name),
            Kind::Chat => chat_logprobs(lp, &name),
        }
    }
}

/// Echoed prompt tokens first (null for the first one, and each one's top
/// alternatives with the token itself, as vLLM gives them), then the
/// generated tokens.
fn completion_logprobs(lp: &Logprobs, name: &dyn Fn(u32) -> String) -> Value {
    let top_map = |top: &[(u32, f32)]| -> serde_json::Map<String, Value> {
        top.iter().map(|(id, l)| (name(*id), json!(l))).collect()
    };
    let mut tokens: Vec<String> = Vec::new();
    let mut token_logprobs: Vec<Option<f32>> = Vec::new();
    let mut top: Vec<Option<serde_json::Map<String, Value>>> = Vec::new();
    let mut offsets: Vec<usize> = Vec::new();
    for (id, e, offset) in &lp.prompt {
        tokens.push(name(*id));
        token_logprobs.push(e.as_ref().map(|t| t.logprob));
        top.push(e.as_ref().map(|t| {
            let mut m = top_map(&t.top);
            m.entry(name(t.id)).or_insert(json!(t.logprob));
            m
        }));
        offsets.push(*offset);
    }
    for (t, offset) in &lp.tokens {
        tokens.push(name(t.id));
        token_logprobs.push(Some(t.logprob));
        top.push(Some(top_map(&t.top)));
        offsets.push(*offset);
    }
    json!({
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top,
        "text_offset": offsets,
    })
}

fn chat_logprobs(lp: &Logprobs, name: &dyn Fn(u32) -> String) -> Value {
    let entry = |id: u32, logprob: f32| {
        let token = name(id);
        json!({"token": token, "logprob": logprob, "bytes": token.as_bytes()})
    };
    let content: Vec<Value> = lp
        .tokens
        .iter()
        .map(|(t, _)| {
            let mut e = entry(t.id, t.logprob);
            e["top_logprobs"] = Value::Array(t.top.iter().map(|(id, l)| entry(*id, *l)).collect());
            e
        })
        .collect();
    json!({ "content": content })
}
