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

use super::body::{Meta, OutputItem, OutputText};
use super::event::{Envelope, PartAt, StreamEvent};
use crate::openai::error::ApiError;
use crate::openai::prepare::ToolShape;
use crate::tools::parser::ToolStream;
use crate::tools::parser::event::ToolEvent;

/// Where one response stream is.
struct Cursor {
    sub: Submission,
    meta: Arc<Meta>,
    tools: Option<ToolStream>,
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
pub fn respond(sub: Submission, meta: Meta, tools: Option<ToolShape>) -> Response {
    let mut c = Cursor {
        sub,
        meta: Arc::new(meta),
        tools: tools.map(|t| ToolStream::new(t.family, t.parallel)),
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
            Event::Token { text, .. } => self.text(&text),
            Event::Done {
                reason,
                text,
                usage,
            } => {
                self.text(&text);
                if let Some(events) = self.tools.as_mut().map(ToolStream::finish) {
                    self.apply(events);
                }
                self.close();
                let end = if reason.as_str() == "length" {
                    "length"
                } else {
                    "stop"
                };
                let response = self.meta.snapshot(self.output.clone(), Some((end, usage)));
                self.send(if end == "length" {
                    StreamEvent::Incomplete { response }
                } else {
                    StreamEvent::Completed { response }
                });
                self.done = true;
            }
            Event::Error(e) => self.fail(e.into()),
        }
    }

    /// Text from the engine: through the tool reader when the request has
    /// tools, else straight into the message.
    fn text(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        let events = match self.tools.as_mut() {
            Some(t) => t.push(text),
            None => vec![ToolEvent::Content(text.to_string())],
        };
        self.apply(events);
    }

    fn apply(&mut self, events: Vec<ToolEvent>) {
        for e in events {
            match e {
                ToolEvent::Content(t) if !t.is_empty() => self.content(&t),
                ToolEvent::Content(_) => {}
                ToolEvent::Start { name, .. } => self.start_call(name),
                ToolEvent::Arguments { fragment, .. } => self.arguments(&fragment),
            }
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
