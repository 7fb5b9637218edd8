//! What the worker tells a request's caller, in order.

use crate::EngineError;

/// Why a generation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// The model's end token, a stop token or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The caller went away.
    Cancelled,
}

impl FinishReason {
    /// OpenAI's and the metrics' name for it.
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "abort",
        }
    }
}

/// The chosen token's log-probability and the most likely alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The chosen token.
    pub id: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// Its rank in the vocabulary, 1 for the most likely (ties share the
    /// better rank), as vLLM's prompt logprobs give it.
    pub rank: usize,
    /// The top alternatives, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// Token counts of a finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens (an end token counts).
    pub completion_tokens: usize,
    /// Prompt tokens read from the prefix cache instead of computed.
    pub cached_tokens: usize,
}

/// One message from the worker to a request's caller.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The prompt's logprobs, once it is prefilled and before any token, for
    /// a request that asked: one entry per prompt token, `None` for the first
    /// (nothing predicts it).
    PromptLogprobs(Vec<Option<TokenLogprob>>),
    /// A generated token and the text it released (may be empty while held back).
    Token {
        /// The token id.
        id: u32,
        /// Newly released text.
        text: String,
        /// Present when the request asked for logprobs.
        logprob: Option<TokenLogprob>,
    },
    /// The request is over; always the last event.
    Done {
        /// Why.
        reason: FinishReason,
        /// Any text released at the end (held-back text that was no stop).
        text: String,
        /// Token counts.
        usage: Usage,
    },
    /// A pooling request's vectors, one per input in order, as the model
    /// pools them (not normalized, not truncated); always the last event.
    Vectors {
        /// The vectors.
        data: Vec<Vec<f32>>,
        /// Token counts (every input's tokens are prompt tokens).
        usage: Usage,
    },
    /// The request failed; always the last event.
    Error(EngineError),
}
