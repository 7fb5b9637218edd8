//! Tool calls read out of the model's text, one reader per family, fed as
//! the text arrives (streamed) or all at once (one mechanism for both).

mod call_body;
pub mod event;
mod hermes;
mod llama3_json;

use std::str::FromStr;

use self::event::{Calls, ToolEvent};
use self::hermes::Hermes;
use self::llama3_json::Llama3Json;

/// A family of tool-call markup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFamily {
    /// `<tool_call>{json}</tool_call>` (Hermes, Qwen2.5, Qwen3).
    Hermes,
    /// A bare `{"name": ..., "parameters": ...}` (Llama 3.1/3.2).
    Llama3Json,
    /// gpt-oss's harmony messages to `functions.NAME`, read by the harmony
    /// reasoning reader with the channels they share; the answer's text
    /// holds none.
    Harmony,
}

/// `--tool-call-parser`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParserChoice {
    /// The family the chat template writes; Hermes when it writes none.
    Auto,
    /// This family.
    Family(ToolFamily),
    /// No tool calling: `tool_choice` other than "none" is refused.
    Off,
}

impl FromStr for ParserChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(ParserChoice::Auto),
            "hermes" => Ok(ParserChoice::Family(ToolFamily::Hermes)),
            "llama3-json" | "llama3_json" => Ok(ParserChoice::Family(ToolFamily::Llama3Json)),
            "openai" | "harmony" => Ok(ParserChoice::Family(ToolFamily::Harmony)),
            "none" => Ok(ParserChoice::Off),
            other => Err(format!(
                "`{other}` is not a tool-call parser (auto, hermes, llama3-json, openai or none)"
            )),
        }
    }
}

impl ParserChoice {
    /// The family for a model whose chat template is `template`.
    pub fn resolve(self, template: Option<&str>) -> Option<ToolFamily> {
        match self {
            ParserChoice::Auto => Some(detect(template.unwrap_or_default())),
            ParserChoice::Family(f) => Some(f),
            ParserChoice::Off => None,
        }
    }
}

/// The family a chat template writes calls in. A template with no tool
/// markup of its own (SmolLM2's) gets Hermes, what vLLM users expect of
/// such models; the server then describes the tools in Hermes' words.
pub fn detect(template: &str) -> ToolFamily {
    if template.contains("<|call|>") {
        ToolFamily::Harmony
    } else if template.contains("<tool_call>") {
        ToolFamily::Hermes
    } else if template.contains("<|python_tag|>")
        || (template.contains("ipython") && template.contains("\"parameters\""))
    {
        ToolFamily::Llama3Json
    } else {
        ToolFamily::Hermes
    }
}

/// How the served model calls tools, settled at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolSetup {
    /// The family its calls are read in; `None`: tool calling is off.
    pub family: Option<ToolFamily>,
    /// The template does not render `tools`: the server describes them.
    pub describe: bool,
}

impl ToolSetup {
    /// The setup for `choice` and the model's template.
    pub fn new(choice: ParserChoice, template: Option<&str>) -> Self {
        ToolSetup {
            family: choice.resolve(template),
            describe: !template.is_some_and(|t| t.contains("tools")),
        }
    }
}

#[derive(Debug)]
enum Reader {
    Hermes(Hermes),
    Llama3Json(Llama3Json),
    /// The text as it comes (harmony's calls are not in it).
    Plain,
}

/// One answer's incremental tool-call reader.
#[derive(Debug)]
pub struct ToolStream {
    reader: Reader,
    calls: Calls,
    /// Trailing whitespace, sent with the next visible text or dropped at
    /// the end of an answer that called tools (so that how the text was cut
    /// into pieces changes nothing).
    blank: String,
    /// Calls started.
    started: usize,
}

impl ToolStream {
    /// A reader for `family`; `parallel: false` keeps only the first call.
    pub fn new(family: ToolFamily, parallel: bool) -> Self {
        ToolStream {
            reader: match family {
                ToolFamily::Hermes => Reader::Hermes(Hermes::default()),
                ToolFamily::Llama3Json => Reader::Llama3Json(Llama3Json::default()),
                ToolFamily::Harmony => Reader::Plain,
            },
            calls: Calls {
                max: (!parallel).then_some(1),
                ..Calls::default()
            },
            blank: String::new(),
            started: 0,
        }
    }

    /// Reads the next piece of output.
    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        let mut raw = Vec::new();
        match &mut self.reader {
            Reader::Hermes(r) => r.push(text, &mut self.calls, &mut raw),
            Reader::Llama3Json(r) => r.push(text, &mut self.calls, &mut raw),
            Reader::Plain => raw.push(ToolEvent::Content(text.to_string())),
        }
        self.tidy(raw)
    }

    /// The output ended: what was held back.
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        let mut raw = Vec::new();
        match &mut self.reader {
            Reader::Hermes(r) => r.finish(&mut self.calls, &mut raw),
            Reader::Llama3Json(r) => r.finish(&mut self.calls, &mut raw),
            Reader::Plain => {}
        }
        let mut out = self.tidy(raw);
        if self.started == 0 && !self.blank.is_empty() {
            out.push(ToolEvent::Content(std::mem::take(&mut self.blank)));
        }
        out
    }

    /// Calls started so far.
    pub fn calls(&self) -> usize {
        self.started
    }

    /// Some call was not well-formed.
    pub fn malformed(&self) -> bool {
        self.calls.malformed
    }

    /// Drops empty text and holds trailing whitespace.
    fn tidy(&mut self, raw: Vec<ToolEvent>) -> Vec<ToolEvent> {
        let mut out = Vec::with_capacity(raw.len());
        for e in raw {
            match e {
                ToolEvent::Content(t) if t.trim().is_empty() => self.blank.push_str(&t),
                ToolEvent::Content(t) => {
                    let visible = t.trim_end();
                    let text = std::mem::take(&mut self.blank) + visible;
                    self.blank.push_str(&t[visible.len()..]);
                    out.push(ToolEvent::Content(text));
                }
                other => {
                    if matches!(other, ToolEvent::Start { .. }) {
                        self.started += 1;
                    }
                    out.push(other);
                }
            }
        }
        out
    }
}

/// One parsed call of a whole answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCall {
    /// The function.
    pub name: String,
    /// Its arguments, JSON text.
    pub arguments: String,
}

/// A whole answer, read.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedAnswer {
    /// The text, if any.
    pub content: Option<String>,
    /// The calls, in order.
    pub calls: Vec<ParsedCall>,
}

/// Reads a whole answer. Any malformed call makes the whole answer text,
/// as the model wrote it.
pub fn parse_answer(family: ToolFamily, parallel: bool, text: &str) -> ParsedAnswer {
    let mut stream = ToolStream::new(family, parallel);
    let mut events = stream.push(text);
    events.extend(stream.finish());
    if stream.malformed() {
        return ParsedAnswer {
            content: Some(text.to_string()),
            calls: Vec::new(),
        };
    }
    let mut content = String::new();
    let mut calls: Vec<ParsedCall> = Vec::new();
    for e in events {
        match e {
            ToolEvent::Content(t) => content.push_str(&t),
            ToolEvent::Start { name, .. } => calls.push(ParsedCall {
                name,
                arguments: String::new(),
            }),
            ToolEvent::Arguments { fragment, .. } => {
                if let Some(c) = calls.last_mut() {
                    c.arguments.push_str(&fragment);
                }
            }
        }
    }
    ParsedAnswer {
        content: (!content.is_empty()).then_some(content),
        calls,
    }
}

/// An answer that called tools and ended on its own ends with
/// "tool_calls"; one cut off keeps its reason.
pub fn finish_reason(reason: &'static str, calls: usize) -> &'static str {
    match (reason, calls) {
        ("stop", 1..) => "tool_calls",
        _ => reason,
    }
}

/// The id of call `call` of choice `choice` of the response `response_id`:
/// `call_` and 24 hex digits, unique per call and the same when streamed.
pub fn call_id(response_id: &str, choice: usize, call: usize) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("{response_id}/{choice}/{call}"));
    let hex: String = digest.iter().take(12).map(|b| format!("{b:02x}")).collect();
    format!("call_{hex}")
}

#[cfg(test)]
mod tests;
