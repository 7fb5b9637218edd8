//! gpt-oss's harmony format: messages `<|start|>ROLE<|channel|>CHANNEL
//! [to=RECIPIENT] [<|constrain|>TYPE]<|message|>TEXT<|end|>` (the first
//! one's `<|start|>assistant` is the prompt's). The analysis channel is
//! reasoning, final and commentary without a recipient the answer, and a
//! message to `functions.NAME` a tool call whose text is its arguments.
//! `<|return|>` and `<|call|>` end a message as `<|end|>` does (they also
//! end generation).

use super::piece::{Found, Piece};
use crate::tools::parser::event::held_prefix;

const MESSAGE: &str = "<|message|>";
/// Markers that end a message's text.
const ENDS: [&str; 3] = ["<|end|>", "<|return|>", "<|call|>"];
/// Markers that open a new header (a message the model left unclosed).
const HEADS: [&str; 2] = ["<|start|>", "<|channel|>"];

/// What a message's text is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Reasoning,
    Content,
    Call,
}

/// Where the reader is.
#[derive(Debug)]
enum State {
    /// Reading a header, up to its `<|message|>`.
    Header(String),
    /// In a message's text, holding back what may start a marker.
    Body { kind: Kind, held: String },
}

/// The incremental harmony reader.
#[derive(Debug)]
pub struct Harmony {
    state: State,
}

impl Default for Harmony {
    fn default() -> Self {
        Harmony {
            state: State::Header(String::new()),
        }
    }
}

impl Harmony {
    /// Reads more of the output.
    pub fn push(&mut self, text: &str, found: &mut Found) {
        let mut rest = text.to_string();
        loop {
            match &mut self.state {
                State::Header(buf) => {
                    buf.push_str(&rest);
                    let t = buf.trim_start();
                    if !t.is_empty() && !t.starts_with("<|") && !"<|".starts_with(t) {
                        // Plain text with no header (a grammar held the
                        // output): the answer.
                        rest = std::mem::take(buf);
                        self.state = body(Kind::Content);
                        continue;
                    }
                    let Some(i) = buf.find(MESSAGE) else {
                        return;
                    };
                    let (kind, name) = header(&buf[..i]);
                    rest = buf[i + MESSAGE.len()..].to_string();
                    found.reasoning |= kind == Kind::Reasoning;
                    if let Some(name) = name {
                        found.add(Piece::CallStart(name));
                    }
                    self.state = body(kind);
                }
                State::Body { kind, held } => {
                    found.reasoning |= *kind == Kind::Reasoning;
                    held.push_str(&rest);
                    let marker = (ENDS.iter().chain(&HEADS))
                        .filter_map(|m| held.find(m).map(|i| (i, *m)))
                        .min();
                    if let Some((i, m)) = marker {
                        send(kind, &held[..i], found);
                        let skip = if ENDS.contains(&m) { m.len() } else { 0 };
                        rest = held[i + skip..].to_string();
                        self.state = State::Header(String::new());
                        continue;
                    }
                    let keep = (ENDS.iter().chain(&HEADS))
                        .map(|m| held_prefix(held, m))
                        .max()
                        .unwrap_or(0);
                    let sure = held.len() - keep;
                    send(kind, &held[..sure], found);
                    held.drain(..sure);
                    return;
                }
            }
        }
    }

    /// The output ended (on `<|return|>` or `<|call|>`, which the engine
    /// does not send as text): the open message's held text.
    pub fn finish(&mut self, found: &mut Found) {
        if let State::Body { kind, held } =
            std::mem::replace(&mut self.state, State::Header(String::new()))
        {
            found.reasoning |= kind == Kind::Reasoning;
            send(&kind, &held, found);
        }
    }
}

fn body(kind: Kind) -> State {
    State::Body {
        kind,
        held: String::new(),
    }
}

fn send(kind: &Kind, text: &str, found: &mut Found) {
    found.add(match kind {
        Kind::Reasoning => Piece::Reasoning(text.to_string()),
        Kind::Content => Piece::Content(text.to_string()),
        Kind::Call => Piece::CallArguments(text.to_string()),
    });
}

/// What a header's message is, and the function it calls. The recipient
/// may stand before or after the channel (`<|start|>assistant
/// to=functions.f<|channel|>commentary json` as the template writes past
/// calls, `<|channel|>commentary to=functions.f <|constrain|>json` as the
/// model does). A built-in tool's message (browser, python) is the
/// model's own business: reasoning.
fn header(h: &str) -> (Kind, Option<String>) {
    let word = |after: &str| -> Option<String> {
        let (_, tail) = h.split_once(after)?;
        let w: String = tail
            .chars()
            .take_while(|c| !c.is_whitespace() && *c != '<')
            .collect();
        Some(w)
    };
    match (word("to="), word("<|channel|>")) {
        (Some(to), _) => match to.strip_prefix("functions.") {
            Some(name) if !name.is_empty() => (Kind::Call, Some(name.to_string())),
            _ => (Kind::Reasoning, None),
        },
        (None, Some(c)) if c == "analysis" => (Kind::Reasoning, None),
        _ => (Kind::Content, None),
    }
}
