//! What the family readers find in the model's text, and the calls of one
//! answer they share: a file of its own, so that the readers and the parser
//! that holds them need not import each other.

use super::call_body::BodyEvent;

/// What the reader found in a piece of output.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolEvent {
    /// Text of the answer.
    Content(String),
    /// Call `index` begins: its function's name.
    Start {
        /// The call's place in the answer.
        index: usize,
        /// The function.
        name: String,
    },
    /// More of call `index`'s arguments (JSON text).
    Arguments {
        /// The call's place in the answer.
        index: usize,
        /// The next piece.
        fragment: String,
    },
}

/// The calls of one answer, shared by the families' readers.
#[derive(Debug, Default)]
pub struct Calls {
    /// Calls started.
    pub(super) count: usize,
    /// At most this many.
    pub(super) max: Option<usize>,
    /// Some call was not well-formed.
    pub malformed: bool,
}

impl Calls {
    pub(super) fn map(&self, events: Vec<BodyEvent>, out: &mut Vec<ToolEvent>) {
        let index = self.count;
        out.extend(events.into_iter().map(|e| match e {
            BodyEvent::Start(name) => ToolEvent::Start { index, name },
            BodyEvent::Arguments(fragment) => ToolEvent::Arguments { index, fragment },
        }));
    }

    pub(super) fn closed(&mut self) {
        self.count += 1;
    }

    pub(super) fn full(&self) -> bool {
        self.max.is_some_and(|m| self.count >= m)
    }
}

/// How many trailing bytes of `text` may be the start of `marker`.
pub(crate) fn held_prefix(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}
