//! A tagged reasoning block (`<think>…</think>` of Qwen3, DeepSeek-R1 and
//! their distills; Gemma 4's and Mistral's, see [`Tags`]): the text inside
//! the block is reasoning, the rest the answer. Whitespace next to the tags
//! is dropped, as the templates write it there.

use super::choice::Tags;
use super::piece::{Found, Piece};
use crate::tools::parser::event::held_prefix;

/// Where the reader is.
#[derive(Debug)]
enum State {
    /// Nothing but whitespace yet: held until it is the opening tag or not.
    Start(String),
    /// In the block: text held back while it may be the start of the
    /// closing tag or trailing whitespace; `leading`: nothing sent yet.
    Reasoning { held: String, leading: bool },
    /// After the block (or with none); `leading`: drop whitespace first.
    Content { leading: bool },
}

/// The incremental reader of a tagged block.
#[derive(Debug)]
pub struct Think {
    state: State,
    tags: Tags,
    /// The block is open before the output starts (the template wrote
    /// opening tag, or the family always does): text before the closing
    /// tag is reasoning even without an opening tag.
    open: bool,
}

impl Think {
    /// A reader of blocks between `tags`; `open`: the prompt already
    /// opened the block.
    pub fn new(open: bool, tags: Tags) -> Self {
        Think {
            state: State::Start(String::new()),
            tags,
            open,
        }
    }

    /// Reads more of the output.
    pub fn push(&mut self, text: &str, found: &mut Found) {
        let mut rest = text.to_string();
        let Tags { open, close, .. } = self.tags;
        loop {
            match &mut self.state {
                State::Start(held) => {
                    held.push_str(&rest);
                    let t = held.trim_start();
                    if let Some(after) = t.strip_prefix(open) {
                        found.reasoning = true;
                        rest = after.to_string();
                    } else if open.starts_with(t) {
                        return;
                    } else if self.open {
                        rest = std::mem::take(held);
                    } else {
                        found.add(Piece::Content(std::mem::take(held)));
                        self.state = State::Content { leading: false };
                        return;
                    }
                    self.state = State::Reasoning {
                        held: String::new(),
                        leading: true,
                    };
                }
                State::Reasoning { held, leading } => {
                    found.reasoning = true;
                    held.push_str(&rest);
                    if let Some(i) = held.find(close) {
                        let text = held[..i].trim_end();
                        send_reasoning(text, leading, found);
                        rest = held[i + close.len()..].to_string();
                        self.state = State::Content { leading: true };
                        continue;
                    }
                    // Held: what may start the closing tag, and the whitespace
                    // before it (dropped if the block closes there).
                    let sure = held.len() - held_prefix(held, close);
                    let sent = held[..sure].trim_end().len();
                    send_reasoning(&held[..sent], leading, found);
                    held.drain(..sent);
                    return;
                }
                State::Content { leading } => {
                    let text = match leading {
                        true => rest.trim_start(),
                        false => &rest,
                    };
                    if !text.is_empty() {
                        *leading = false;
                        found.add(Piece::Content(text.to_string()));
                    }
                    return;
                }
            }
        }
    }

    /// The output ended: what was held back. A block never closed is all
    /// reasoning; with none opened, the text is the answer.
    pub fn finish(&mut self, found: &mut Found) {
        match std::mem::replace(&mut self.state, State::Content { leading: false }) {
            State::Start(held) if self.open => {
                found.reasoning = true;
                send_reasoning(held.trim(), &mut true, found);
            }
            State::Start(held) => found.add(Piece::Content(held)),
            State::Reasoning { held, mut leading } => {
                found.reasoning = true;
                send_reasoning(held.trim_end(), &mut leading, found);
            }
            State::Content { .. } => {}
        }
    }
}

/// Sends reasoning text, its leading whitespace dropped while nothing has
/// been sent.
fn send_reasoning(text: &str, leading: &mut bool, found: &mut Found) {
    let text = match *leading {
        true => text.trim_start(),
        false => text,
    };
    if !text.is_empty() {
        *leading = false;
        found.add(Piece::Reasoning(text.to_string()));
    }
}
