//! Hermes / Qwen2.5 calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
//! any number of them, with text around them.

use super::call_body::{BodyState, CallBody};
use super::event::{Calls, ToolEvent, held_prefix};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// Where the reader is.
#[derive(Debug)]
enum State {
    /// Text, holding back what may be the start of `<tool_call>`.
    Text(String),
    /// Inside a call's object.
    Call(CallBody),
    /// After a call's object, before its `</tool_call>`.
    After(String),
    /// Calls are capped and the cap is reached: the rest is dropped.
    Done,
}

/// The incremental Hermes reader.
#[derive(Debug)]
pub struct Hermes {
    state: State,
}

impl Default for Hermes {
    fn default() -> Self {
        Hermes {
            state: State::Text(String::new()),
        }
    }
}

impl Hermes {
    /// Reads more of the output.
    pub fn push(&mut self, text: &str, calls: &mut Calls, out: &mut Vec<ToolEvent>) {
        let mut rest = text.to_string();
        loop {
            match &mut self.state {
                State::Done => return,
                State::Text(held) => {
                    held.push_str(&rest);
                    if let Some(i) = held.find(OPEN) {
                        out.push(ToolEvent::Content(held[..i].to_string()));
                        rest = held[i + OPEN.len()..].to_string();
                        self.state = State::Call(CallBody::default());
                        continue;
                    }
                    let keep = held_prefix(held, OPEN);
                    let sure = held.len() - keep;
                    out.push(ToolEvent::Content(held[..sure].to_string()));
                    held.drain(..sure);
                    return;
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
                                false => State::After(String::new()),
                            };
                        }
                        BodyState::Malformed => {
                            calls.malformed = true;
                            if body.started() {
                                // Sent as a call already: its closing tag is
                                // still markup.
                                calls.map(events, out);
                                calls.closed();
                                self.state = State::After(String::new());
                            } else {
                                out.push(ToolEvent::Content(format!("{OPEN}{}", body.text())));
                                self.state = State::Text(String::new());
                            }
                        }
                    }
                    rest = after;
                }
                State::After(buf) => {
                    buf.push_str(&rest);
                    let t = buf.trim_start();
                    if let Some(after) = t.strip_prefix(CLOSE) {
                        rest = after.to_string();
                    } else if CLOSE.starts_with(t) {
                        return;
                    } else {
                        // No closing tag: what follows is text again.
                        rest = t.to_string();
                    }
                    self.state = State::Text(String::new());
                }
            }
        }
    }

    /// The output ended: what was held back.
    pub fn finish(&mut self, calls: &mut Calls, out: &mut Vec<ToolEvent>) {
        match std::mem::replace(&mut self.state, State::Done) {
            State::Text(held) => out.push(ToolEvent::Content(held)),
            State::Call(body) => {
                // Cut off inside a call.
                calls.malformed = true;
                if !body.started() {
                    out.push(ToolEvent::Content(format!("{OPEN}{}", body.text())));
                }
            }
            State::After(_) | State::Done => {}
        }
    }
}
