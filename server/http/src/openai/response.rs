//! OpenAI response bodies and stream chunks, built from the schema types.

use ferrox_engine::{TokenLogprob, Usage};
use serde::Serialize;

use crate::openai::response_schema::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionResponse,
    ChatDelta, ChatLogprobs, ChatTokenLogprob, ChatTopLogprob, CompletionChoice, CompletionChunk,
    CompletionLogprobs, CompletionResponse, FunctionCallBody, PromptLogprob, PromptLogprobs,
    Ranked, ToolCallBody, ToolCallDelta, UsageBody,
};
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

/// Logprobs in one endpoint's shape.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum LogprobsBody {
    /// `/v1/completions`' shape.
    Completion(CompletionLogprobs),
    /// `/v1/chat/completions`' shape.
    Chat(ChatLogprobs),
}

// An envelope makes logprobs in its own endpoint's shape only, so the other
// shape is never asked for.
impl LogprobsBody {
    fn completion(self) -> Option<CompletionLogprobs> {
        match self {
            LogprobsBody::Completion(lp) => Some(lp),
            LogprobsBody::Chat(_) => None,
        }
    }

    fn chat(self) -> Option<ChatLogprobs> {
        match self {
            LogprobsBody::Chat(lp) => Some(lp),
            LogprobsBody::Completion(_) => None,
        }
    }
}

/// A whole, non-streamed response in its endpoint's shape.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Whole {
    /// `/v1/completions`.
    Completion(CompletionResponse),
    /// `/v1/chat/completions`.
    Chat(ChatCompletionResponse),
}

/// One streamed chunk in its endpoint's shape.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Chunk {
    /// `/v1/completions`.
    Completion(CompletionChunk),
    /// `/v1/chat/completions`.
    Chat(ChatCompletionChunk),
}

impl Chunk {
    /// Sets the chunk's usage (the last chunk's, or the usage so far with
    /// `continuous_usage_stats`).
    pub fn set_usage(&mut self, usage: Usage, reasoning_tokens: Option<usize>) {
        let usage = Some(UsageBody::from(usage).with_reasoning(reasoning_tokens));
        match self {
            Chunk::Completion(c) => c.usage = usage,
            Chunk::Chat(c) => c.usage = usage,
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
    pub logprobs: Option<LogprobsBody>,
    /// The tool calls read out of it (chat).
    pub tool_calls: Vec<ParsedCall>,
    /// The reasoning read out of it, where it is sent.
    pub reasoning: Option<String>,
    /// Its generated tokens that were reasoning, where reasoning was read.
    pub reasoning_tokens: Option<usize>,
    /// The prompt's logprobs in vLLM's shape, with `prompt_logprobs`.
    pub prompt_logprobs: Option<PromptLogprobs>,
}

impl Envelope {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Completion, _) => "text_completion",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
        }
    }

    /// A whole, non-streamed response.
    pub fn full(&self, choices: Vec<Choice>, usage: Usage) -> Whole {
        let reasoning = (choices.iter().map(|c| c.reasoning_tokens))
            .reduce(|a, b| Some(a? + b?))
            .flatten();
        let usage = UsageBody::from(usage).with_reasoning(reasoning);
        match self.kind {
            Kind::Completion => Whole::Completion(CompletionResponse {
                id: self.id.clone(),
                object: self.object(false).into(),
                created: self.created,
                model: self.model.clone(),
                choices: (choices.into_iter().enumerate())
                    .map(|(index, c)| CompletionChoice {
                        index,
                        text: c.text,
                        logprobs: c.logprobs.and_then(LogprobsBody::completion),
                        finish_reason: Some(c.finish.into()),
                        prompt_logprobs: c.prompt_logprobs,
                    })
                    .collect(),
                usage,
            }),
            Kind::Chat => {
                // Chat gives the prompt's logprobs once, beside the choices
                // (vLLM).
                let prompt_logprobs = choices.first().and_then(|c| c.prompt_logprobs.clone());
                Whole::Chat(ChatCompletionResponse {
                    id: self.id.clone(),
                    object: self.object(false).into(),
                    created: self.created,
                    model: self.model.clone(),
                    choices: (choices.into_iter().enumerate())
                        .map(|(index, c)| ChatChoice {
                            index,
                            message: self.message(index, &c),
                            logprobs: c.logprobs.and_then(LogprobsBody::chat),
                            finish_reason: c.finish.into(),
                        })
                        .collect(),
                    usage,
                    prompt_logprobs,
                })
            }
        }
    }

    /// The prompt's logprobs as vLLM gives them: null for the first token,
    /// then per token a map from token id to its logprob, rank and text, for
    /// the token itself and its top alternatives.
    pub fn prompt_logprobs(
        &self,
        entries: &[Option<TokenLogprob>],
        f: &dyn Frontend,
    ) -> PromptLogprobs {
        let one = |id: u32, logprob: f32, rank: usize| PromptLogprob {
            logprob: f64::from(logprob),
            rank,
            decoded_token: f.token_str(id),
        };
        entries
            .iter()
            .map(|e| {
                let t = e.as_ref()?;
                let mut m: Ranked<PromptLogprob> = (t.top.iter().enumerate())
                    .map(|(rank, (id, l))| (id.to_string(), one(*id, *l, rank + 1)))
                    .collect();
                m.insert(t.id.to_string(), one(t.id, t.logprob, t.rank));
                Some(m)
            })
            .collect()
    }

    /// A chat choice's message: its text, and its calls with their ids.
    fn message(&self, index: usize, c: &Choice) -> AssistantMessage {
        if c.tool_calls.is_empty() {
            return AssistantMessage {
                role: "assistant".into(),
                content: Some(c.text.clone()),
                reasoning_content: c.reasoning.clone(),
                tool_calls: None,
            };
        }
        let calls = (c.tool_calls.iter().enumerate())
            .map(|(j, call)| ToolCallBody {
                id: call_id(&self.id, index, j),
                kind: "function".into(),
                function: FunctionCallBody {
                    name: Some(call.name.clone()),
                    arguments: call.arguments.clone(),
                },
            })
            .collect();
        AssistantMessage {
            role: "assistant".into(),
            content: (!c.text.is_empty()).then(|| c.text.clone()),
            reasoning_content: c.reasoning.clone(),
            tool_calls: Some(calls),
        }
    }

    /// A streamed chunk of choice `index` from the tool reader: text, or a
    /// call's start (index, id, type, name and empty arguments) or more of
    /// its arguments, as OpenAI streams them.
    pub fn tool_chunk(&self, index: usize, event: &ToolEvent, role: bool) -> Chunk {
        let mut delta = ChatDelta {
            role: role.then(|| "assistant".into()),
            content: None,
            reasoning_content: None,
            tool_calls: None,
        };
        match event {
            ToolEvent::Content(text) => delta.content = Some(text.clone()),
            ToolEvent::Start { index: k, name } => {
                delta.tool_calls = Some(vec![ToolCallDelta {
                    index: *k,
                    id: Some(call_id(&self.id, index, *k)),
                    kind: Some("function".into()),
                    function: FunctionCallBody {
                        name: Some(name.clone()),
                        arguments: String::new(),
                    },
                }]);
            }
            ToolEvent::Arguments { index: k, fragment } => {
                delta.tool_calls = Some(vec![ToolCallDelta {
                    index: *k,
                    id: None,
                    kind: None,
                    function: FunctionCallBody {
                        name: None,
                        arguments: fragment.clone(),
                    },
                }]);
            }
        }
        self.chat_chunk(vec![ChatChunkChoice {
            index,
            delta,
            logprobs: None,
            finish_reason: None,
        }])
    }

    /// One streamed chunk of choice `index`; `role` marks its first chat
    /// chunk.
    pub fn chunk(
        &self,
        index: usize,
        text: &str,
        role: bool,
        finish: Option<&str>,
        logprobs: Option<LogprobsBody>,
    ) -> Chunk {
        match self.kind {
            Kind::Completion => self.completion_chunk(vec![CompletionChoice {
                index,
                text: text.into(),
                logprobs: logprobs.and_then(LogprobsBody::completion),
                finish_reason: finish.map(Into::into),
                prompt_logprobs: None,
            }]),
            Kind::Chat => self.chat_chunk(vec![ChatChunkChoice {
                index,
                delta: ChatDelta {
                    role: role.then(|| "assistant".into()),
                    content: (!text.is_empty() || role).then(|| text.into()),
                    reasoning_content: None,
                    tool_calls: None,
                },
                logprobs: logprobs.and_then(LogprobsBody::chat),
                finish_reason: finish.map(Into::into),
            }]),
        }
    }

    /// A streamed chunk of choice `index`'s reasoning (`role` marks its
    /// first chunk).
    pub fn reasoning_chunk(&self, index: usize, text: &str, role: bool) -> Chunk {
        self.chat_chunk(vec![ChatChunkChoice {
            index,
            delta: ChatDelta {
                role: role.then(|| "assistant".into()),
                content: None,
                reasoning_content: Some(text.into()),
                tool_calls: None,
            },
            logprobs: None,
            finish_reason: None,
        }])
    }

    /// The final usage chunk (`stream_options.include_usage`).
    pub fn usage_chunk(&self, usage: Usage, reasoning_tokens: Option<usize>) -> Chunk {
        let mut chunk = match self.kind {
            Kind::Completion => self.completion_chunk(Vec::new()),
            Kind::Chat => self.chat_chunk(Vec::new()),
        };
        chunk.set_usage(usage, reasoning_tokens);
        chunk
    }

    fn completion_chunk(&self, choices: Vec<CompletionChoice>) -> Chunk {
        Chunk::Completion(CompletionChunk {
            id: self.id.clone(),
            object: self.object(true).into(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage: None,
        })
    }

    fn chat_chunk(&self, choices: Vec<ChatChunkChoice>) -> Chunk {
        Chunk::Chat(ChatCompletionChunk {
            id: self.id.clone(),
            object: self.object(true).into(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage: None,
        })
    }

    /// Logprobs in this endpoint's shape.
    pub fn logprobs(&self, lp: &Logprobs, frontend: &dyn Frontend) -> LogprobsBody {
        let token_ids = self.token_ids;
        let name = |id: u32| {
            if token_ids {
                format!("token_id:{id}")
            } else {
                frontend.token_str(id)
            }
        };
        match self.kind {
            Kind::Completion => LogprobsBody::Completion(completion_logprobs(lp, &name)),
            Kind::Chat => LogprobsBody::Chat(chat_logprobs(lp, &name)),
        }
    }
}

/// Echoed prompt tokens first (null for the first one, and each one's top
/// alternatives with the token itself, as vLLM gives them), then the
/// generated tokens.
fn completion_logprobs(lp: &Logprobs, name: &dyn Fn(u32) -> String) -> CompletionLogprobs {
    let top_map = |top: &[(u32, f32)]| -> Ranked<f64> {
        top.iter()
            .map(|(id, l)| (name(*id), f64::from(*l)))
            .collect()
    };
    let mut tokens: Vec<String> = Vec::new();
    let mut token_logprobs: Vec<Option<f64>> = Vec::new();
    let mut top: Vec<Option<Ranked<f64>>> = Vec::new();
    let mut offsets: Vec<usize> = Vec::new();
    for (id, e, offset) in &lp.prompt {
        tokens.push(name(*id));
        token_logprobs.push(e.as_ref().map(|t| f64::from(t.logprob)));
        top.push(e.as_ref().map(|t| {
            let mut m = top_map(&t.top);
            m.insert_new(name(t.id), f64::from(t.logprob));
            m
        }));
        offsets.push(*offset);
    }
    for (t, offset) in &lp.tokens {
        tokens.push(name(t.id));
        token_logprobs.push(Some(f64::from(t.logprob)));
        top.push(Some(top_map(&t.top)));
        offsets.push(*offset);
    }
    CompletionLogprobs {
        tokens,
        token_logprobs,
        top_logprobs: top,
        text_offset: offsets,
    }
}

fn chat_logprobs(lp: &Logprobs, name: &dyn Fn(u32) -> String) -> ChatLogprobs {
    let top = |id: u32, logprob: f32| {
        let token = name(id);
        ChatTopLogprob {
            bytes: token.as_bytes().to_vec(),
            token,
            logprob: f64::from(logprob),
        }
    };
    let content = (lp.tokens.iter())
        .map(|(t, _)| {
            let token = name(t.id);
            ChatTokenLogprob {
                bytes: token.as_bytes().to_vec(),
                token,
                logprob: f64::from(t.logprob),
                top_logprobs: t.top.iter().map(|(id, l)| top(*id, *l)).collect(),
            }
        })
        .collect();
    ChatLogprobs { content }
}
