//! OpenAI response bodies and stream chunks.

use ferrox_engine::{TokenLogprob, Usage};
use serde::Serialize;
use serde_json::{Value, json};

use crate::frontend::Frontend;

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
}

/// OpenAI's usage object.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct UsageBody {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Both.
    pub total_tokens: usize,
}

impl From<Usage> for UsageBody {
    fn from(u: Usage) -> Self {
        UsageBody {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens + u.completion_tokens,
        }
    }
}

/// Logprobs gathered for one choice.
#[derive(Debug, Clone, Default)]
pub struct Logprobs {
    /// One entry per generated token with text, and where its text starts.
    pub tokens: Vec<(TokenLogprob, usize)>,
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
    pub fn full(&self, text: &str, finish: &str, logprobs: Option<Value>, usage: Usage) -> Value {
        let choice = match self.kind {
            Kind::Completion => json!({
                "index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish,
            }),
            Kind::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
        };
        let mut v = self.frame(false, vec![choice]);
        v["usage"] = json!(UsageBody::from(usage));
        v
    }

    /// One streamed chunk; `role` marks the first chat chunk.
    pub fn chunk(
        &self,
        text: &str,
        role: bool,
        finish: Option<&str>,
        logprobs: Option<Value>,
    ) -> Value {
        let choice = match self.kind {
            Kind::Completion => json!({
                "index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish,
            }),
            Kind::Chat => {
                let mut delta = json!({});
                if role {
                    delta["role"] = json!("assistant");
                }
                if !text.is_empty() || role {
                    delta["content"] = json!(text);
                }
                json!({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
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
        match self.kind {
            Kind::Completion => completion_logprobs(lp, frontend),
            Kind::Chat => chat_logprobs(lp, frontend),
        }
    }
}

fn completion_logprobs(lp: &Logprobs, f: &dyn Frontend) -> Value {
    let tokens: Vec<String> = lp.tokens.iter().map(|(t, _)| f.token_str(t.id)).collect();
    let token_logprobs: Vec<f32> = lp.tokens.iter().map(|(t, _)| t.logprob).collect();
    let offsets: Vec<usize> = lp.tokens.iter().map(|(_, o)| *o).collect();
    let top: Vec<serde_json::Map<String, Value>> = lp
        .tokens
        .iter()
        .map(|(t, _)| {
            t.top
                .iter()
                .map(|(id, l)| (f.token_str(*id), json!(l)))
                .collect()
        })
        .collect();
    json!({
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top,
        "text_offset": offsets,
    })
}

fn chat_logprobs(lp: &Logprobs, f: &dyn Frontend) -> Value {
    let entry = |id: u32, logprob: f32| {
        let token = f.token_str(id);
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
