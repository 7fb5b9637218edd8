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
use serde_json::{Value, json};

use super::body::{Meta, OutputItem, OutputText};
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
    let snapshot = c.meta.snapshot(Vec::new(), None);
    c.send("response.created", json!({"response": snapshot}));
    c.send("response.in_progress", json!({"response": snapshot}));
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
    fn send(&mut self, kind: &str, mut data: Value) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        self.ready
            .push_back(Sse::default().event(kind).data(data.to_string()));
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
                let kind = if end == "length" {
                    "response.incomplete"
                } else {
                    "response.completed"
                };
                self.send(kind, json!({"response": response}));
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
            let item_id = id.clone();
            self.send(
                "response.output_text.delta",
                json!({"item_id": item_id, "output_index": index, "content_index": 0, "delta": delta}),
            );
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
        self.send(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
        self.send(
            "response.content_part.added",
            json!({"item_id": id, "output_index": index, "content_index": 0,
                   "part": OutputText::new("")}),
        );
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
        self.send(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
        self.output.push(item);
        self.open = Some(index);
    }

    fn arguments(&mut self, delta: &str) {
        let Some(index) = self.open else { return };
        if let OutputItem::FunctionCall { id, arguments, .. } = &mut self.output[index] {
            arguments.push_str(delta);
            let item_id = id.clone();
            self.send(
                "response.function_call_arguments.delta",
                json!({"item_id": item_id, "output_index": index, "delta": delta}),
            );
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
                let (id, part) = (id.clone(), content[0].clone());
                self.send(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                           "text": part.text}),
                );
                self.send(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                           "part": part}),
                );
            }
            OutputItem::FunctionCall {
                id,
                arguments,
                status,
                ..
            } => {
                *status = "completed".into();
                let (id, arguments) = (id.clone(), arguments.clone());
                self.send(
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": index, "arguments": arguments}),
                );
            }
        }
        self.send(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        self.output[index] = item;
    }

    /// An error mid-stream: one `error` event, then the end.
    fn fail(&mut self, e: ApiError) {
        let body = e.body();
        self.send(
            "error",
            json!({"message": body.error.message, "code": body.error.kind}),
        );
        self.done = true;
    }
}
