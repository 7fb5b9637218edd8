use serde_json::{Value, json};

use super::event::held_prefix;
use super::*;

use ToolFamily::{Hermes as H, Llama3Json as L};

/// What a client reassembles from streamed events: content, and (name,
/// arguments) per call index.
fn reassemble(events: &[ToolEvent]) -> (String, Vec<(String, String)>) {
    let mut content = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    for e in events {
        match e {
            ToolEvent::Content(t) => content.push_str(t),
            ToolEvent::Start { index, name } => {
                assert_eq!(*index, calls.len(), "indices in order: {events:?}");
                calls.push((name.clone(), String::new()));
            }
            ToolEvent::Arguments { index, fragment } => calls[*index].1.push_str(fragment),
        }
    }
    (content, calls)
}

/// Feeds `text` in pieces of `size` characters.
fn streamed(family: ToolFamily, parallel: bool, text: &str, size: usize) -> Vec<ToolEvent> {
    let chars: Vec<char> = text.chars().collect();
    let mut s = ToolStream::new(family, parallel);
    let mut out = Vec::new();
    for piece in chars.chunks(size) {
        out.extend(s.push(&piece.iter().collect::<String>()));
    }
    out.extend(s.finish());
    out
}

const WEATHER: &str = r#"{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}"#;

/// (family, output, content, calls as (name, arguments JSON))
type Case = (
    ToolFamily,
    String,
    Option<&'static str>,
    Vec<(&'static str, Value)>,
);

fn cases() -> Vec<Case> {
    let oslo = json!({"city": "Oslo", "unit": "c"});
    vec![
        (H, "Just text.".into(), Some("Just text."), vec![]),
        (H, format!("<tool_call>\n{WEATHER}\n</tool_call>"), None, vec![("get_weather", oslo.clone())]),
        (
            H,
            format!("Let me check.\n<tool_call>{WEATHER}</tool_call>\n<tool_call>\n{{\"name\": \"now\", \"arguments\": {{}}}}\n</tool_call>"),
            Some("Let me check."),
            vec![("get_weather", oslo.clone()), ("now", json!({}))],
        ),
        // Keys the other way round, nested and escaped arguments.
        (
            H,
            r#"<tool_call>{"arguments": {"q": "a \"}\" b", "n": [1, {"x": 2}]}, "name": "search"}</tool_call>"#.into(),
            None,
            vec![("search", json!({"q": "a \"}\" b", "n": [1, {"x": 2}]}))],
        ),
        // Arguments as a JSON string; no arguments at all; no closing tag.
        (
            H,
            r#"<tool_call>{"name": "f", "arguments": "{\"a\": 1}"}</tool_call><tool_call>{"name": "g"}"#.into(),
            None,
            vec![("f", json!({"a": 1})), ("g", json!({}))],
        ),
        (H, "a < b, and <tool_ nothing".into(), Some("a < b, and <tool_ nothing"), vec![]),
        (L, WEATHER.to_string(), None, vec![("get_weather", oslo.clone())]),
        (
            L,
            r#"<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}"#.into(),
            None,
            vec![("a", json!({"x": 1})), ("b", json!({}))],
        ),
        (L, "  The answer is {42}.".into(), Some("  The answer is {42}."), vec![]),
    ]
}

#[test]
fn whole_and_streamed_outputs_read_the_same() {
    for (family, text, content, calls) in cases() {
        let full = parse_answer(family, true, &text);
        assert_eq!(full.content.as_deref(), content, "{text}");
        let got: Vec<(&str, Value)> = full
            .calls
            .iter()
            .map(|c| (c.name.as_str(), serde_json::from_str(&c.arguments).unwrap()))
            .collect();
        assert_eq!(got, calls, "{text}");
        for size in [1, 2, 3, 7, 1000] {
            let events = streamed(family, true, &text, size);
            let (streamed_content, streamed_calls) = reassemble(&events);
            assert_eq!(streamed_content, content.unwrap_or(""), "{text} by {size}");
            let want: Vec<(String, String)> = full
                .calls
                .iter()
                .map(|c| (c.name.clone(), c.arguments.clone()))
                .collect();
            assert_eq!(streamed_calls, want, "{text} by {size}");
        }
    }
}

#[test]
fn arguments_stream_before_the_call_closes() {
    let text = format!("<tool_call>{WEATHER}</tool_call>");
    let events = streamed(H, true, &text, 1);
    let first_args = events
        .iter()
        .position(|e| matches!(e, ToolEvent::Arguments { .. }))
        .unwrap();
    let fragments = events
        .iter()
        .filter(|e| matches!(e, ToolEvent::Arguments { .. }))
        .count();
    assert!(
        matches!(&events[first_args - 1], ToolEvent::Start { name, .. } if name == "get_weather")
    );
    assert!(fragments > 10, "{events:?}");
}

#[test]
fn malformed_output_is_text() {
    let cases = [
        (H, "<tool_call>not json</tool_call>"),
        (
            H,
            r#"<tool_call>{"name": "f", "arguments": {"a": tru}}</tool_call>"#,
        ),
        (H, r#"<tool_call>{"arguments": {}}</tool_call>"#),
        (H, r#"<tool_call>{"name": "f", "arguments": 5}</tool_call>"#),
        (H, r#"<tool_call>{"name": "f", "argu"#),
        (
            H,
            format!("<tool_call>{WEATHER}</tool_call><tool_call>oops").leak(),
        ),
        (L, r#"{"text": "not a call"}"#),
        (L, r#"{"name": "f", "parameters": {"#),
    ];
    for (family, text) in cases {
        let full = parse_answer(family, true, text);
        assert_eq!(full.content.as_deref(), Some(text), "{text}");
        assert!(full.calls.is_empty(), "{text}");
        // Streamed, whatever was not yet sent as a call comes as text, and
        // nothing is lost or doubled.
        for size in [1, 4, 1000] {
            let events = streamed(family, true, text, size);
            let (content, calls) = reassemble(&events);
            let started: String = calls.iter().map(|(_, a)| a.as_str()).collect();
            assert!(
                calls.is_empty() || text.contains(&started) || started.is_empty(),
                "{text}: {events:?}"
            );
            if calls.is_empty() {
                assert_eq!(content, text, "{text} by {size}");
            }
        }
    }
}

#[test]
fn no_markup_leaks_into_text() {
    let text = format!("Sure.<tool_call>{WEATHER}</tool_call>\n\nDone.");
    for size in [1, 2, 5] {
        let (content, calls) = reassemble(&streamed(H, true, &text, size));
        assert_eq!(content, "Sure.\n\nDone.");
        assert_eq!(calls.len(), 1);
    }
    // Whitespace between calls is not text.
    let two = format!("<tool_call>{WEATHER}</tool_call>\n<tool_call>{WEATHER}</tool_call>\n");
    let events = streamed(H, true, &two, 3);
    assert!(
        !events.iter().any(|e| matches!(e, ToolEvent::Content(_))),
        "{events:?}"
    );
}

#[test]
fn one_call_when_not_parallel() {
    let two = format!("<tool_call>{WEATHER}</tool_call><tool_call>{WEATHER}</tool_call> bye");
    let full = parse_answer(H, false, &two);
    assert_eq!((full.calls.len(), full.content), (1, None));
    let l = r#"{"name": "a", "parameters": {}}; {"name": "b", "parameters": {}}"#;
    assert_eq!(parse_answer(L, false, l).calls.len(), 1);
    let mut s = ToolStream::new(H, false);
    s.push(&two);
    s.finish();
    assert_eq!(s.calls(), 1);
}

#[test]
fn families_from_templates_and_flags() {
    let qwen = "{% for tool in tools %}{{ tool | tojson }}{% endfor %}<tool_call>\\n{\"name\": ...";
    let llama = "{%- if tools %}<|start_header_id|>ipython<|end_header_id|>{\"name\": function name, \"parameters\": ...}";
    let smol = "{% for message in messages %}<|im_start|>{{ message['content'] }}{% endfor %}";
    assert_eq!(detect(qwen), H);
    assert_eq!(detect(llama), L);
    assert_eq!(detect("{{ '<|python_tag|>' }}"), L);
    assert_eq!(detect(smol), H);
    let cases = [
        ("auto", Some(Some(L))),
        ("hermes", Some(Some(H))),
        ("llama3-json", Some(Some(L))),
        ("none", Some(None)),
        ("mistral", None),
    ];
    for (flag, want) in cases {
        let got = flag
            .parse::<ParserChoice>()
            .ok()
            .map(|c| c.resolve(Some(llama)));
        assert_eq!(got, want, "{flag}");
    }
    assert_eq!(ParserChoice::Auto.resolve(None), Some(H));
    let setup = |c: &str, t| ToolSetup::new(c.parse().unwrap(), Some(t));
    assert_eq!(
        setup("auto", smol),
        ToolSetup {
            family: Some(H),
            describe: true
        }
    );
    assert_eq!(
        setup("auto", qwen),
        ToolSetup {
            family: Some(H),
            describe: false
        }
    );
    assert_eq!(setup("none", qwen).family, None);
}

#[test]
fn call_ids_are_openai_shaped_and_distinct() {
    let a = call_id("chatcmpl-1", 0, 0);
    assert!(a.starts_with("call_") && a.len() == 29, "{a}");
    assert_eq!(a, call_id("chatcmpl-1", 0, 0));
    assert_ne!(a, call_id("chatcmpl-1", 0, 1));
    assert_ne!(a, call_id("chatcmpl-1", 1, 0));
    assert_ne!(a, call_id("chatcmpl-2", 0, 0));
}

#[test]
fn held_prefixes() {
    for (text, n) in [
        ("ab<", 1),
        ("ab<tool_c", 7),
        ("<tool_call", 10),
        ("abc", 0),
        ("é<t", 2),
        ("", 0),
    ] {
        assert_eq!(held_prefix(text, "<tool_call>"), n, "{text}");
    }
}
