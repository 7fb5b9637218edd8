//! One answer read as it arrives: the reasoning splitter first, then the
//! tool-call reader over the answer's part only. Harmony's calls come from
//! the splitter, in the model's own markup.

use super::choice::{ReasoningFamily, ReasoningShape};
use super::piece::Piece;
use super::split::Splitter;
use crate::openai::prepare::ToolShape;
use crate::tools::parser::event::ToolEvent;
use crate::tools::parser::{ParsedCall, ToolStream, parse_answer};

/// What an answer's reader sends, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum AnswerEvent {
    /// More reasoning (`reasoning_content`).
    Reasoning(String),
    /// Answer text or a tool call's part.
    Tool(ToolEvent),
}

/// The calls of one answer made in harmony's markup.
#[derive(Debug, Default)]
struct ModelCalls {
    /// Calls kept so far.
    count: usize,
    /// At most this many (`parallel_tool_calls: false`: one).
    max: Option<usize>,
    /// The call being read is kept.
    open: bool,
}

impl ModelCalls {
    /// Maps a call's piece; `None`: not a call's.
    fn map(&mut self, piece: Piece) -> Result<Option<ToolEvent>, Piece> {
        match piece {
            Piece::CallStart(name) => {
                self.open = self.max.is_none_or(|m| self.count < m);
                if !self.open {
                    return Ok(None);
                }
                self.count += 1;
                Ok(Some(ToolEvent::Start {
                    index: self.count - 1,
                    name,
                }))
            }
            Piece::CallArguments(fragment) => Ok(self.open.then(|| ToolEvent::Arguments {
                index: self.count - 1,
                fragment,
            })),
            other => Err(other),
        }
    }
}

/// One streamed answer's reader.
#[derive(Debug)]
pub struct AnswerStream {
    split: Option<Splitter>,
    include: bool,
    /// Reads calls out of the answer's text (not with harmony).
    tools: Option<ToolStream>,
    /// Harmony's calls, when the request offered tools.
    model_calls: Option<ModelCalls>,
}

impl AnswerStream {
    /// A reader for a request answered as `reasoning` and `tools` say.
    pub fn new(reasoning: Option<ReasoningShape>, tools: Option<ToolShape>) -> Self {
        let harmony = reasoning.is_some_and(|r| r.family == ReasoningFamily::Harmony);
        AnswerStream {
            split: reasoning.map(|r| Splitter::new(r.family, r.open)),
            include: reasoning.is_none_or(|r| r.include),
            tools: (tools.filter(|_| !harmony)).map(|t| ToolStream::new(t.family, t.parallel)),
            model_calls: (tools.filter(|_| harmony)).map(|t| ModelCalls {
                max: (!t.parallel).then_some(1),
                ..ModelCalls::default()
            }),
        }
    }

    /// The text of `tokens` more generated tokens.
    pub fn push(&mut self, text: &str, tokens: usize) -> Vec<AnswerEvent> {
        let pieces = match self.split.as_mut() {
            Some(s) => s.push(text, tokens),
            None => vec![Piece::Content(text.to_string())],
        };
        self.route(pieces)
    }

    /// The output ended: what was held back.
    pub fn finish(&mut self) -> Vec<AnswerEvent> {
        let pieces = self
            .split
            .as_mut()
            .map(Splitter::finish)
            .unwrap_or_default();
        let mut out = self.route(pieces);
        if let Some(tools) = self.tools.as_mut() {
            out.extend(tools.finish().into_iter().map(AnswerEvent::Tool));
        }
        out
    }

    /// Calls started so far.
    pub fn calls(&self) -> usize {
        self.tools.as_ref().map_or(0, ToolStream::calls)
            + self.model_calls.as_ref().map_or(0, |c| c.count)
    }

    /// Generated tokens that were reasoning.
    pub fn reasoning_tokens(&self) -> usize {
        self.split.as_ref().map_or(0, Splitter::reasoning_tokens)
    }

    fn route(&mut self, pieces: Vec<Piece>) -> Vec<AnswerEvent> {
        let mut out = Vec::new();
        for piece in pieces {
            let piece = match self.model_calls.as_mut() {
                Some(calls) => match calls.map(piece) {
                    Ok(event) => {
                        out.extend(event.map(AnswerEvent::Tool));
                        continue;
                    }
                    Err(p) => p,
                },
                None => piece,
            };
            match piece {
                Piece::Reasoning(t) if self.include => out.push(AnswerEvent::Reasoning(t)),
                Piece::Reasoning(_) | Piece::CallStart(_) => {}
                // A call with no tools offered: its text is the answer's.
                Piece::Content(t) | Piece::CallArguments(t) => match self.tools.as_mut() {
                    Some(tools) => out.extend(tools.push(&t).into_iter().map(AnswerEvent::Tool)),
                    None => out.push(AnswerEvent::Tool(ToolEvent::Content(t))),
                },
            }
        }
        out
    }
}

/// A whole answer, read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WholeAnswer {
    /// The reasoning, if any was read and is to be sent.
    pub reasoning: Option<String>,
    /// The answer's text.
    pub content: String,
    /// The calls, in order.
    pub calls: Vec<ParsedCall>,
    /// Generated tokens that were reasoning.
    pub reasoning_tokens: usize,
}

/// One whole answer's reader: the same splitter as a stream's, fed token
/// by token (for the count); the answer's text is then read for calls
/// whole, so that a malformed call leaves the text as the model wrote it.
#[derive(Debug)]
pub struct AnswerCollector {
    split: Option<Splitter>,
    include: bool,
    tools: Option<ToolShape>,
    model_calls: Option<ModelCalls>,
    out: WholeAnswer,
}

impl AnswerCollector {
    /// A reader for a request answered as `reasoning` and `tools` say;
    /// `echo`: the text the answer opens with (chat's `echo`).
    pub fn new(reasoning: Option<ReasoningShape>, tools: Option<ToolShape>, echo: &str) -> Self {
        let harmony = reasoning.is_some_and(|r| r.family == ReasoningFamily::Harmony);
        AnswerCollector {
            split: reasoning.map(|r| Splitter::new(r.family, r.open)),
            include: reasoning.is_none_or(|r| r.include),
            tools: tools.filter(|_| !harmony),
            model_calls: (tools.filter(|_| harmony)).map(|t| ModelCalls {
                max: (!t.parallel).then_some(1),
                ..ModelCalls::default()
            }),
            out: WholeAnswer {
                content: echo.to_string(),
                ..WholeAnswer::default()
            },
        }
    }

    /// The text of `tokens` more generated tokens.
    pub fn push(&mut self, text: &str, tokens: usize) {
        match self.split.as_mut() {
            Some(s) => {
                let pieces = s.push(text, tokens);
                self.take(pieces);
            }
            None => self.out.content.push_str(text),
        }
    }

    /// The output ended: the answer.
    pub fn finish(mut self) -> WholeAnswer {
        if let Some(s) = self.split.as_mut() {
            let pieces = s.finish();
            self.out.reasoning_tokens = s.reasoning_tokens();
            self.take(pieces);
        }
        if let Some(t) = self.tools {
            let parsed = parse_answer(t.family, t.parallel, &self.out.content);
            self.out.content = parsed.content.unwrap_or_default();
            self.out.calls = parsed.calls;
        }
        self.out
    }

    fn take(&mut self, pieces: Vec<Piece>) {
        for piece in pieces {
            let piece = match self.model_calls.as_mut() {
                Some(calls) => match calls.map(piece) {
                    Ok(Some(ToolEvent::Start { name, .. })) => {
                        self.out.calls.push(ParsedCall {
                            name,
                            arguments: String::new(),
                        });
                        continue;
                    }
                    Ok(Some(ToolEvent::Arguments { fragment, .. })) => {
                        if let Some(c) = self.out.calls.last_mut() {
                            c.arguments.push_str(&fragment);
                        }
                        continue;
                    }
                    Ok(_) => continue,
                    Err(p) => p,
                },
                None => piece,
            };
            match piece {
                Piece::Reasoning(t) if self.include => {
                    self.out.reasoning.get_or_insert_default().push_str(&t)
                }
                Piece::Reasoning(_) | Piece::CallStart(_) => {}
                Piece::Content(t) | Piece::CallArguments(t) => self.out.content.push_str(&t),
            }
        }
    }
}
