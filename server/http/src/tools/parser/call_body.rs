//! One call's JSON object, `{"name": "f", "arguments": {...}}` (or
//! `"parameters"`, as Llama 3 writes it), read as it arrives: the name as
//! soon as it is complete, then the arguments' text as it grows.

use serde_json::Value;

/// The keys a call's arguments come under.
const ARGUMENT_KEYS: [&str; 2] = ["arguments", "parameters"];

/// Where the object's opening keys are.
#[derive(Debug, Clone, PartialEq)]
enum Header {
    /// Not all there yet.
    Pending,
    /// `name` first, then the arguments, starting at this byte.
    Found { name: String, args_start: usize },
    /// Some other layout: read the whole object when it closes.
    Absent,
}

/// What one push found.
#[derive(Debug, Clone, PartialEq)]
pub enum BodyEvent {
    /// The call's function name (once).
    Start(String),
    /// More of the arguments' JSON text.
    Arguments(String),
}

/// How the object ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyState {
    /// Still open.
    Open,
    /// Closed and a well-formed call.
    Call,
    /// Not a call: not an object, not JSON, or without a name.
    Malformed,
}

/// The incremental reader of one call object.
#[derive(Debug, Default)]
pub struct CallBody {
    buf: String,
    opened: bool,
    depth: usize,
    in_string: bool,
    escaped: bool,
    header: Option<Header>,
    args_end: Option<usize>,
    /// Bytes of `buf` already given out as arguments.
    emitted: usize,
    started: bool,
    state: Option<BodyState>,
}

impl CallBody {
    /// The text read so far.
    pub fn text(&self) -> &str {
        &self.buf
    }

    /// A start event was given out: the call can no longer become text.
    pub fn started(&self) -> bool {
        self.started
    }

    /// Reads `text` up to the end of the object; returns what comes after
    /// it (empty while the object is open) and how far it is.
    pub fn push<'t>(&mut self, text: &'t str, out: &mut Vec<BodyEvent>) -> (&'t str, BodyState) {
        for (at, c) in text.char_indices() {
            if self.state.is_some() {
                return (&text[at..], self.finish_state());
            }
            self.step(c);
        }
        self.after_push(out);
        (&text[text.len()..], self.finish_state())
    }

    fn finish_state(&self) -> BodyState {
        self.state.unwrap_or(BodyState::Open)
    }

    fn step(&mut self, c: char) {
        let pos = self.buf.len();
        self.buf.push(c);
        if !self.opened {
            match c {
                '{' => {
                    self.opened = true;
                    self.depth = 1;
                }
                c if c.is_whitespace() => {}
                _ => self.state = Some(BodyState::Malformed),
            }
            return;
        }
        if self.in_string {
            match (self.escaped, c) {
                (true, _) => self.escaped = false,
                (false, '\\') => self.escaped = true,
                (false, '"') => self.in_string = false,
                _ => {}
            }
            return;
        }
        let in_args =
            matches!(&self.header, Some(Header::Found { args_start, .. }) if pos >= *args_start);
        if in_args && self.args_end.is_none() && self.depth == 1 && matches!(c, ',' | '}') {
            self.args_end = Some(pos);
        }
        match c {
            '"' => self.in_string = true,
            '{' | '[' => self.depth += 1,
            '}' | ']' => self.depth = self.depth.saturating_sub(1),
            _ => {}
        }
        if self.header.as_ref().is_none_or(|h| *h == Header::Pending) {
            self.header = Some(read_header(&self.buf));
        }
        if self.depth == 0 {
            self.state = Some(self.close());
        }
    }

    /// Streams what of the arguments is certain after a push.
    fn after_push(&mut self, out: &mut Vec<BodyEvent>) {
        if self.state.is_some() {
            return;
        }
        let Some(Header::Found { name, args_start }) = &self.header else {
            return;
        };
        let (name, args_start) = (name.clone(), *args_start);
        if self.buf[args_start..].starts_with('"') {
            // Arguments given as a JSON string: decoded at the close.
            return;
        }
        if !self.started {
            self.started = true;
            out.push(BodyEvent::Start(name));
        }
        let end = self.args_end.unwrap_or(self.buf.len());
        let end = args_start + self.buf[args_start..end].trim_end().len();
        let from = self.emitted.max(args_start);
        if end > from {
            out.push(BodyEvent::Arguments(self.buf[from..end].to_string()));
            self.emitted = end;
        }
    }

    /// Checks the closed object; the events it still owes are taken by
    /// [`CallBody::closing_events`].
    fn close(&self) -> BodyState {
        match serde_json::from_str::<Value>(&self.buf) {
            Ok(v) if call_parts(&v).is_some() => BodyState::Call,
            _ => BodyState::Malformed,
        }
    }

    /// After a push that closed a well-formed call: the start (if not given
    /// yet) and the rest of the arguments.
    pub fn closing_events(&mut self, out: &mut Vec<BodyEvent>) {
        let Ok(v) = serde_json::from_str::<Value>(&self.buf) else {
            return;
        };
        let Some((name, args)) = call_parts(&v) else {
            return;
        };
        if !self.started {
            self.started = true;
            out.push(BodyEvent::Start(name.to_string()));
        }
        let rest = match (&self.header, args) {
            (_, None) => "{}".to_string(),
            (_, Some(Value::String(s))) => s.clone(),
            (Some(Header::Found { args_start, .. }), _) => {
                let end = self.args_end.unwrap_or(self.buf.len());
                let end = *args_start + self.buf[*args_start..end].trim_end().len();
                self.buf[self.emitted.max(*args_start)..end].to_string()
            }
            (_, Some(args)) => args.to_string(),
        };
        self.emitted = self.buf.len();
        if !rest.is_empty() {
            out.push(BodyEvent::Arguments(rest));
        }
    }
}

/// The name and arguments of a call object (`None`: no arguments key).
fn call_parts(v: &Value) -> Option<(&str, Option<&Value>)> {
    let name = v.get("name")?.as_str().filter(|n| !n.is_empty())?;
    match ARGUMENT_KEYS.iter().find_map(|k| v.get(*k)) {
        None => Some((name, None)),
        Some(a @ (Value::Object(_) | Value::String(_))) => Some((name, Some(a))),
        Some(_) => None,
    }
}

/// Reads `{ "name": "<name>", "arguments": ` at the start of `buf`.
fn read_header(buf: &str) -> Header {
    let mut rest = buf.trim_start();
    let steps: [&dyn Fn(&mut &str) -> Step; 3] = [
        &|r| punct(r, '{'),
        &|r| key(r, &["name"]).map(|_| ()),
        &|r| punct(r, ':'),
    ];
    for step in steps {
        match step(&mut rest) {
            Step::Ok(()) => {}
            Step::More => return Header::Pending,
            Step::No => return Header::Absent,
        }
    }
    let name = match string(&mut rest) {
        Step::Ok(n) => n,
        Step::More => return Header::Pending,
        Step::No => return Header::Absent,
    };
    for step in [
        &(|r: &mut &str| punct(r, ',')) as &dyn Fn(&mut &str) -> Step,
        &|r| key(r, &ARGUMENT_KEYS).map(|_| ()),
        &|r| punct(r, ':'),
    ] {
        match step(&mut rest) {
            Step::Ok(()) => {}
            Step::More => return Header::Pending,
            Step::No => return Header::Absent,
        }
    }
    let value = rest.trim_start();
    if value.is_empty() {
        return Header::Pending;
    }
    Header::Found {
        name,
        args_start: buf.len() - value.len(),
    }
}

/// One step of reading the header.
enum Step<T = ()> {
    Ok(T),
    More,
    No,
}

impl<T> Step<T> {
    fn map<U>(self, f: impl FnOnce(T) -> U) -> Step<U> {
        match self {
            Step::Ok(t) => Step::Ok(f(t)),
            Step::More => Step::More,
            Step::No => Step::No,
        }
    }
}

fn punct(rest: &mut &str, c: char) -> Step {
    let r = rest.trim_start();
    match r.chars().next() {
        None => Step::More,
        Some(d) if d == c => {
            *rest = &r[c.len_utf8()..];
            Step::Ok(())
        }
        Some(_) => Step::No,
    }
}

fn key(rest: &mut &str, keys: &[&str]) -> Step<String> {
    match string(rest) {
        Step::Ok(k) if keys.contains(&k.as_str()) => Step::Ok(k),
        Step::Ok(_) | Step::No => Step::No,
        Step::More => Step::More,
    }
}

/// A JSON string literal, decoded.
fn string(rest: &mut &str) -> Step<String> {
    let r = rest.trim_start();
    if r.is_empty() {
        return Step::More;
    }
    if !r.starts_with('"') {
        return Step::No;
    }
    let mut escaped = false;
    for (i, c) in r.char_indices().skip(1) {
        match (escaped, c) {
            (true, _) => escaped = false,
            (false, '\\') => escaped = true,
            (false, '"') => {
                let Ok(s) = serde_json::from_str::<String>(&r[..=i]) else {
                    return Step::No;
                };
                *rest = &r[i + 1..];
                return Step::Ok(s);
            }
            _ => {}
        }
    }
    Step::More
}
