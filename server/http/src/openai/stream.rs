//! Server-sent events for `stream: true`, one stream for all n choices.
//! Dropping the stream (the client went away) drops every `Submission`,
//! which cancels every choice.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;

use axum::response::sse::{Event as Sse, Sse as SseBody};
use axum::response::{IntoResponse, Response};
use ferrox_engine::{Event, Submission, Usage};
use futures::stream::SelectAll;
use futures::{Stream, StreamExt};

use crate::openai::error::ApiError;
use crate::openai::prepare::{ChoiceMeta, Shape};
use crate::openai::response::{Chunk, Envelope, Logprobs, LogprobsBody};
use crate::reasoning::answer::{AnswerEvent, AnswerStream};
use crate::serve::frontend::Frontend;
use crate::tools::parser::finish_reason;

/// Each choice's events, tagged with its index; `None` once its
/// submission ended without a last event (the worker went away).
type Tagged = Pin<Box<dyn Stream<Item = (usize, Option<Event>)> + Send>>;

/// Where one choice is.
#[derive(Debug, Default)]
struct ChoiceState {
    first: bool,
    done: bool,
    offset: usize,
    /// Tokens generated so far.
    generated: usize,
    /// Its echo, and whether its usage counts its prompt.
    meta: ChoiceMeta,
    /// Reads reasoning and tool calls out of the text, when the request
    /// has tools or the model a reasoning parser.
    reader: Option<AnswerStream>,
}

/// Where one stream is.
struct Cursor {
    events: SelectAll<Tagged>,
    env: Envelope,
    frontend: Arc<dyn Frontend>,
    shape: Shape,
    choices: Vec<ChoiceState>,
    usage: Usage,
    /// The finished choices' reasoning tokens, where reasoning is read.
    reasoning_tokens: Option<usize>,
    /// Frames ready to send before reading the next event.
    ready: Vec<String>,
    done: bool,
}

/// Answers with an SSE stream of these submissions' events, choice `i`
/// from `subs[i]`, answered as `metas[i]` says.
pub fn respond(
    subs: Vec<Submission>,
    metas: Vec<ChoiceMeta>,
    env: Envelope,
    frontend: Arc<dyn Frontend>,
    shape: Shape,
) -> Response {
    let mut events = SelectAll::new();
    for (i, sub) in subs.into_iter().enumerate() {
        let tagged = futures::stream::unfold(Some(sub), move |sub| async move {
            let mut sub = sub?;
            match sub.next().await {
                Some(e) => Some(((i, Some(e)), Some(sub))),
                None => Some(((i, None), None)),
            }
        });
        events.push(Box::pin(tagged) as Tagged);
    }
    let n = events.len();
    let mut cursor = Cursor {
        events,
        env,
        frontend,
        choices: metas
            .into_iter()
            .map(|meta| ChoiceState {
                first: true,
                reader: (shape.tools.is_some() || shape.reasoning.is_some())
                    .then(|| AnswerStream::new(shape.reasoning, shape.tools)),
                meta,
                ..ChoiceState::default()
            })
            .collect(),
        usage: Usage::default(),
        reasoning_tokens: shape.reasoning.map(|_| 0),
        ready: Vec::new(),
        done: false,
        shape,
    };
    // An echo without prompt logprobs to wait for (no logprobs asked, or
    // chat's, which has no tokens of its own) opens every choice at once.
    for i in 0..n {
        let echo = cursor.choices[i].meta.echo.clone();
        if let Some(echo) = echo.filter(|e| !cursor.shape.logprobs || e.ids.is_empty()) {
            cursor.choices[i].offset = echo.text.len();
            cursor.push(i, &echo.text, None, None);
        }
    }
    SseBody::new(frames(cursor)).into_response()
}

fn frames(cursor: Cursor) -> impl Stream<Item = Result<Sse, Infallible>> {
    futures::stream::unfold(cursor, |mut c| async move {
        loop {
            if !c.ready.is_empty() {
                let frame = c.ready.remove(0);
                return Some((Ok(Sse::default().data(frame)), c));
            }
            if c.done {
                return None;
            }
            match c.events.next().await {
                Some((i, Some(event))) => c.absorb(i, event),
                // A choice's channel closes after its last event.
                Some((i, None)) if c.choices[i].done => {}
                Some((_, None)) | None => {
                    c.fail(ApiError::Engine(ferrox_engine::EngineError::WorkerGone))
                }
            }
        }
    })
}

impl Cursor {
    fn absorb(&mut self, i: usize, event: Event) {
        match event {
            Event::PromptLogprobs(entries) => {
                // Echo with logprobs: the prompt's text and its logprobs.
                let Some(echo) = self.choices[i].meta.echo.clone() else {
                    return;
                };
                let lp = Logprobs::echoed(&echo.ids, entries, self.frontend.as_ref());
                let lp = self.env.logprobs(&lp, self.frontend.as_ref());
                self.choices[i].offset = echo.text.len();
                self.push(i, &echo.text, None, Some(lp));
            }
            Event::Token { text, logprob, .. } => {
                let offset = self.choices[i].offset;
                let lp = match (self.shape.logprobs, logprob) {
                    (true, Some(t)) => {
                        let one = Logprobs {
                            tokens: vec![(t, offset)],
                            ..Logprobs::default()
                        };
                        Some(self.env.logprobs(&one, self.frontend.as_ref()))
                    }
                    _ => None,
                };
                self.choices[i].offset += text.len();
                self.choices[i].generated += 1;
                self.text(i, &text, lp);
            }
            Event::Done {
                reason,
                text,
                usage,
            } => {
                // Counted first, so that this choice's last chunks carry its
                // final usage.
                self.choices[i].meta.add_usage(&mut self.usage, &usage);
                self.choices[i].done = true;
                let calls = match self.choices[i].reader.as_mut() {
                    Some(reader) => {
                        let mut events = reader.push(&text, 0);
                        events.extend(reader.finish());
                        let calls = reader.calls();
                        if let Some(n) = self.reasoning_tokens.as_mut() {
                            *n += reader.reasoning_tokens();
                        }
                        self.answer_events(i, events);
                        calls
                    }
                    None => {
                        if !text.is_empty() {
                            self.push(i, &text, None, None);
                        }
                        0
                    }
                };
                self.push(i, "", Some(finish_reason(reason.as_str(), calls)), None);
                if self.choices.iter().all(|c| c.done) {
                    self.finish();
                }
            }
            Event::Error(e) => self.fail(ApiError::Engine(e)),
            // A generating engine sends none.
            Event::Vectors { .. } => self.fail(vectors_to_a_generation()),
        }
    }

    /// One generated token's text of choice `i`, through its reader if it
    /// has one.
    fn text(&mut self, i: usize, text: &str, lp: Option<LogprobsBody>) {
        let Some(reader) = self.choices[i].reader.as_mut() else {
            if !text.is_empty() || lp.is_some() || self.choices[i].first {
                self.push(i, text, None, lp);
            }
            return;
        };
        let events = reader.push(text, 1);
        self.answer_events(i, events);
        if lp.is_some() || self.choices[i].first {
            self.push(i, "", None, lp);
        }
    }

    fn answer_events(&mut self, i: usize, events: Vec<AnswerEvent>) {
        for e in events {
            let first = self.choices[i].first;
            let chunk = match &e {
                AnswerEvent::Reasoning(t) => self.env.reasoning_chunk(i, t, first),
                AnswerEvent::Tool(t) => self.env.tool_chunk(i, t, first),
            };
            self.choices[i].first = false;
            self.send(chunk);
        }
    }

    fn push(&mut self, i: usize, text: &str, finish: Option<&str>, lp: Option<LogprobsBody>) {
        let chunk = self.env.chunk(i, text, self.choices[i].first, finish, lp);
        self.choices[i].first = false;
        self.send(chunk);
    }

    /// Queues a choice's chunk, with the usage so far when every chunk
    /// carries it (`continuous_usage_stats`).
    fn send(&mut self, mut chunk: Chunk) {
        if self.shape.continuous_usage {
            let (usage, reasoning) = self.usage_so_far();
            chunk.set_usage(usage, reasoning);
        }
        // The body types have string keys and no fallible parts: this
        // cannot fail.
        self.ready
            .push(serde_json::to_string(&chunk).unwrap_or_default());
    }

    /// The finished choices' usage and the running ones' prompts and tokens
    /// so far: it only grows, and once every choice is done it is the final
    /// usage.
    fn usage_so_far(&self) -> (Usage, Option<usize>) {
        let mut u = self.usage;
        let mut reasoning = self.reasoning_tokens;
        for c in self.choices.iter().filter(|c| !c.done) {
            if c.meta.counts_prompt {
                u.prompt_tokens += c.meta.prompt_tokens;
            }
            u.completion_tokens += c.generated;
            if let (Some(n), Some(r)) = (reasoning.as_mut(), c.reader.as_ref()) {
                *n += r.reasoning_tokens();
            }
        }
        (u, reasoning)
    }

    fn finish(&mut self) {
        if self.shape.include_usage {
            let chunk = self.env.usage_chunk(self.usage, self.reasoning_tokens);
            self.ready
                .push(serde_json::to_string(&chunk).unwrap_or_default());
        }
        self.ready.push("[DONE]".into());
        self.done = true;
    }

    /// Ends the stream with the error; the other choices are cancelled when
    /// the stream, and with it their submissions, is dropped.
    fn fail(&mut self, e: ApiError) {
        self.ready
            .push(serde_json::to_string(&e.body()).unwrap_or_default());
        self.ready.push("[DONE]".into());
        self.done = true;
    }
}

/// The error of a generation answered with vectors: a wiring bug (only a
/// pooling engine sends them, and generation routes refuse a pooling model).
pub(crate) fn vectors_to_a_generation() -> ApiError {
    ApiError::Internal("a generation was answered with vectors".into())
}
