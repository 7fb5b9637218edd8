//! `stream: true` on `/v1/responses`: the Responses API's events
//! (`response.created`, `response.output_item.added`,
//! `response.output_text.delta`, `response.function_call_arguments.delta`,
//! ..., `response.completed`), each with its `sequence_number`. Dropping
//! the stream (the client went away) drops the submission, which cancels
//! the request.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event as Sse, Sse as SseBody};
use axum::response::{IntoResponse, Response};
use ferrox_engine::{Event, Submission};
use futures::Stream;

use super::body::{Meta, OutputItem, OutputText, ReasoningText};
use super::event::{Envelope, PartAt, StreamEvent};
use crate::openai::error::ApiError;
use crate::openai::prepare::Shape;
use crate::reasoning::answer::{AnswerEvent, AnswerStream};
use crate::tools::parser::event::ToolEvent;

/// Where one response stream is.
struct Cursor {
    sub: Submission,
    meta: Arc<Meta>,
    /// Reads reasoning and calls out of the text.
    reader: AnswerStream,
    /// The items so far; the last may still be open.
    output: Vec<OutputItem>,
    /// Output index of the open item, if one is open.
    open: Option<usize>,
    /// Calls started so far (their `call_id`s count from 0).
    calls: usize,
    seq: u64,
    ready: VecDeque<Sse>,
    done: bool,
}

/// Answers with the Responses API's event stream of `sub`.
pub fn respond(sub: Submission, meta: Meta, shape: &Shape) -> Response {
    let mut c = Cursor {
        sub,
        meta: Arc::new(meta),
        reader: AnswerStream::new(shape.reasoning, shape.tools),
        output: Vec::new(),
        open: None,
        calls: 0,
        seq: 0,
        ready: VecDeque::new(),
        done: false,
    };
    let response = c.meta.snapshot(Vec::new(), None);
    c.send(StreamEvent::Created {
        response: response.clone(),
    });
    c.send(StreamEvent::InProgress { response });
    SseBody::new(frames(c)).into_response()
}

fn frames(cursor: Cursor) -> impl Stream<Item = Result<Sse, Infallible>> {
    futures::stream::unfold(cursor, |mut c| async move {
        loop {
            if let Some(frame) = c.ready.pop_front() {
                return Some((Ok(frame), c));
            }
            if c.done {
                return None;
            }
            match c.sub.next().await {
                Some(event) => c.absorb(event),
                None => c.fail(ApiError::Engine(ferrox_engine::EngineError::WorkerGone)),
            }
        }
    })
}

impl Cursor {
    fn send(&mut self, event: StreamEvent) {
        let sent = Envelope {
            event: &event,
            sequence_number: self.seq,
        };
        self.seq += 1;
        // The event's name is its serialised `type`: one spelling of each.
        let data = serde_json::to_value(&sent).unwrap_or_default();
        let name = data["type"].as_str().unwrap_or("error").to_string();
        self.ready
            .push_back(Sse::default().event(name).data(data.to_string()));
    }

    fn absorb(&mut self, event: Event) {
        match event {
            Event::PromptLogprobs(_) => {}
            Event::Token { text, .. } => self.text(&text, 1),
            Event::Done {
                reason,
                text,
                usage,
            } => {
                self.text(&text, 0);
                let events = self.reader.finish();
                self.apply(events);
                self.close();
                let end = if reason.as_str() == "length" {
                    "length"
                } else {
                    "stop"
                };
                let reasoning = self.reader.reasoning_tokens();
                let response =
                    (self.meta).snapshot(self.output.clone(), Some((end, usage, reasoning)));
                self.send(if end == "length" {
                    StreamEvent::Incomplete { response }
                } else {
                    StreamEvent::Completed { response }
                });
                self.done = true;
            }
            Event::Error(e) => self.fail(e.into()),
            // A generating engine sends none.
            Event::Vectors { .. } => self.fail(crate::openai::stream::vectors_to_a_generation()),
        }
    }

    /// Text of `tokens` generated tokens, through the answer's reader.
    fn text(&mut self, text: &str, tokens: usize) {
        if text.is_empty() {
            return;
        }
        let events = self.reader.push(text, tokens);
        self.apply(events);
    }

    fn apply(&mut self, events: Vec<AnswerEvent>) {
        for e in events {
            match e {
                AnswerEvent::Reasoning(t) if !t.is_empty() => self.reasoning(&t),
                AnswerEvent::Tool(ToolEvent::Content(t)) if !t.is_empty() => self.content(&t),
                AnswerEvent::Reasoning(_) | AnswerEvent::Tool(ToolEvent::Content(_)) => {}
                AnswerEvent::Tool(ToolEvent::Start { name, .. }) => self.start_call(name),
                AnswerEvent::Tool(ToolEvent::Arguments { fragment, .. }) => {
                    self.arguments(&fragment)
                }
            }
        }
    }

    /// More reasoning: into the open reasoning item, else a new one.
    fn reasoning(&mut self, delta: &str) {
        let index = match self.open {
            Some(i) if matches!(self.output[i], OutputItem::Reasoning { .. }) => i,
            _ => {
                self.close();
                let index = self.output.len();
                let item = OutputItem::Reasoning {
                    id: self.meta.item_id("rs", index),
                    summary: Vec::new(),
                    content: vec![ReasoningText::new("")],
                    status: "in_progress".into(),
                };
                self.send(StreamEvent::ItemAdded {
                    output_index: index,
                    item: item.clone(),
                });
                self.output.push(item);
                self.open = Some(index);
                index
            }
        };
        if let OutputItem::Reasoning { id, content, .. } = &mut self.output[index] {
            content[0].text.push_str(delta);
            let at = part_at(id, index);
            self.send(StreamEvent::ReasoningDelta {
                at,
                delta: delta.to_string(),
            });
        }
    }

    fn content(&mut self, delta: &str) {
        let index = match self.open {
            Some(i) if matches!(self.output[i], OutputItem::Message { .. }) => i,
            _ => self.open_message(),
        };
        if let OutputItem::Message { id, content, .. } = &mut self.output[index] {
            content[0].text.push_str(delta);
            let at = part_at(id, index);
            self.send(StreamEvent::TextDelta {
                at,
                delta: delta.to_string(),
            });
        }
    }

    fn open_message(&mut self) -> usize {
        self.close();
        let index = self.output.len();
        let item = OutputItem::Message {
            id: self.meta.item_id("msg", index),
            status: "in_progress".into(),
            role: "assistant".into(),
            content: vec![OutputText::new("")],
        };
        let id = self.meta.item_id("msg", index);
        self.send(StreamEvent::ItemAdded {
            output_index: index,
            item: item.clone(),
        });
        self.send(StreamEvent::PartAdded {
            at: part_at(&id, index),
            part: OutputText::new(""),
        });
        self.output.push(item);
        self.open = Some(index);
        index
    }

    fn start_call(&mut self, name: String) {
        self.close();
        let index = self.output.len();
        let item = OutputItem::FunctionCall {
            id: self.meta.item_id("fc", index),
            call_id: self.meta.call_id(self.calls),
            name,
            arguments: String::new(),
            status: "in_progress".into(),
        };
        self.calls += 1;
        self.send(StreamEvent::ItemAdded {
            output_index: index,
            item: item.clone(),
        });
        self.output.push(item);
        self.open = Some(index);
    }

    fn arguments(&mut self, delta: &str) {
        let Some(index) = self.open else { return };
        if let OutputItem::FunctionCall { id, arguments, .. } = &mut self.output[index] {
            arguments.push_str(delta);
            let item_id = id.clone();
            self.send(StreamEvent::ArgumentsDelta {
                item_id,
                output_index: index,
                delta: delta.to_string(),
            });
        }
    }

    /// Ends the open item: its `.done` events, its status completed.
    fn close(&mut self) {
        let Some(index) = self.open.take() else {
            return;
        };
        let mut item = self.output[index].clone();
        match &mut item {
            OutputItem::Reasoning {
                id,
                status,
                content,
                ..
            } => {
                *status = "completed".into();
                let at = part_at(id, index);
                let text = content[0].text.clone();
                self.send(StreamEvent::ReasoningDone { at, text });
            }
            OutputItem::Message {
                id,
                status,
                content,
                ..
            } => {
                *status = "completed".into();
                let (at, part) = (part_at(id, index), content[0].clone());
                self.send(StreamEvent::TextDone {
                    at: at.clone(),
                    text: part.text.clone(),
                });
                self.send(StreamEvent::PartDone { at, part });
            }
            OutputItem::FunctionCall {
                id,
                arguments,
                status,
                ..
            } => {
                *status = "completed".into();
                let (item_id, arguments) = (id.clone(), arguments.clone());
                self.send(StreamEvent::ArgumentsDone {
                    item_id,
                    output_index: index,
                    arguments,
                });
            }
        }
        self.send(StreamEvent::ItemDone {
            output_index: index,
            item: item.clone(),
        });
        self.output[index] = item;
    }

    /// An error mid-stream: one `error` event, then the end.
    fn fail(&mut self, e: ApiError) {
        let body = e.body();
        self.send(StreamEvent::Error {
            message: body.error.message,
            code: body.error.kind,
        });
        self.done = true;
    }
}

/// A message's one text part: content index 0 of item `id` at `index`.
fn part_at(id: &str, index: usize) -> PartAt {
    PartAt {
        item_id: id.to_string(),
        output_index: index,
        content_index: 0,
    }
}
