//! Llama 3.1/3.2 JSON calls: the answer is `{"name": ..., "parameters":
//! {...}}` (optionally after `<|python_tag|>`, several separated by `;`),
//! or it is text.

use super::call_body::{BodyState, CallBody};
use super::event::{Calls, ToolEvent};

const TAG: &str = "<|python_tag|>";

/// Where the reader is.
#[derive(Debug)]
enum State {
    /// Before the first visible character, which decides.
    Start(String),
    /// A text answer.
    Text,
    /// Inside a call's object.
    Call(CallBody),
    /// Between calls (whitespace and `;`).
    Between(String),
    /// Calls are capped and the cap is reached: the rest is dropped.
    Done,
}

/// The incremental Llama 3 JSON reader.
#[derive(Debug)]
pub struct Llama3Json {
    state: State,
}

impl Default for Llama3Json {
    fn default() -> Self {
        Llama3Json {
            state: State::Start(String::new()),
        }
    }
}

impl Llama3Json {
    /// Reads more of the output.
    pub fn push(&mut self, text: &str, calls: &mut Calls, out: &mut Vec<ToolEvent>) {
        let mut rest = text.to_string();
        loop {
            match &mut self.state {
                State::Done => return,
                State::Text => {
                    out.push(ToolEvent::Content(rest));
                    return;
                }
                State::Start(buf) => {
                    buf.push_str(&rest);
                    let t = buf.trim_start();
                    if t.is_empty() || (TAG.starts_with(t) && t != TAG) {
                        return;
                    }
                    if let Some(after) = t.strip_prefix(TAG) {
                        rest = after.to_string();
                        self.state = State::Between(String::new());
                    } else if t.starts_with('{') {
                        rest = t.to_string();
                        self.state = State::Call(CallBody::default());
                    } else {
                        rest = std::mem::take(buf);
                        self.state = State::Text;
                    }
                }
                State::Call(body) => {
                    let mut events = Vec::new();
                    let (after, state) = body.push(&rest, &mut events);
                    let after = after.to_string();
                    match state {
                        BodyState::Open => {
                            calls.map(events, out);
                            return;
                        }
                        BodyState::Call => {
                            body.closing_events(&mut events);
                            calls.map(events, out);
                            calls.closed();
                            self.state = match calls.full() {
                                true => State::Done,
                                false => State::Between(String::new()),
                            };
                            rest = after;
                        }
                        BodyState::Malformed => {
                            calls.malformed = true;
                            if body.started() {
                                calls.map(events, out);
                                calls.closed();
                                rest = after;
                            } else {
                                rest = format!("{}{after}", body.text());
                            }
                            self.state = State::Text;
                        }
                    }
                }
                State::Between(buf) => {
                    buf.push_str(&rest);
                    let t = buf.trim_start_matches(|c: char| c.is_whitespace() || c == ';');
                    if t.is_empty() {
                        return;
                    }
                    rest = t.to_string();
                    self.state = match t.starts_with('{') {
                        true => State::Call(CallBody::default()),
                        false => State::Text,
                    };
                }
            }
        }
    }

    /// The output ended: what was held back.
    pub fn finish(&mut self, calls: &mut Calls, out: &mut Vec<ToolEvent>) {
        match std::mem::replace(&mut self.state, State::Done) {
            State::Start(buf) => out.push(ToolEvent::Content(buf)),
            State::Call(body) => {
                calls.malformed = true;
                if !body.started() {
                    out.push(ToolEvent::Content(body.text().to_string()));
                }
            }
            State::Text | State::Between(_) | State::Done => {}
        }
    }
}
