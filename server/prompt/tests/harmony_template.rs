//! gpt-oss's own chat template, rendered by our path (messages in OpenAI's
//! shape through `chat_prompt`, the template by minijinja), equals what
//! transformers' `apply_chat_template` renders for the same cases:
//! `testdata/harmony/renderings.json`, written by
//! `tests/families/harmony_template.py`.

use std::path::PathBuf;

use ferrox_core::{ChatMessage, ChatTemplate, RenderOptions};
use ferrox_prompt::{Message, TextSide, chat_prompt};
use serde_json::{Map, Value};

fn testdata(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/harmony")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The template as the text side; "tokens" are the rendered text's bytes.
struct Bytes(ChatTemplate);

impl TextSide for Bytes {
    fn encode(&self, text: &str, _add_special: bool) -> Result<Vec<u32>, String> {
        Ok(text.bytes().map(u32::from).collect())
    }

    fn render_chat(
        &self,
        messages: &[ChatMessage],
        options: &RenderOptions<'_>,
    ) -> Result<String, String> {
        self.0
            .render_with(messages, options)
            .map_err(|e| e.to_string())
    }
}

/// The text without its `Current date:` line (the day's).
fn dateless(text: &str) -> String {
    let lines: Vec<&str> = text
        .split('\n')
        .filter(|l| !l.starts_with("Current date:"))
        .collect();
    lines.join("\n")
}

#[test]
fn harmony_renders_as_transformers_does() {
    let template = ChatTemplate::new(testdata("chat_template.jinja"), None, None).unwrap();
    let text = Bytes(template);
    let cases: Vec<Value> = serde_json::from_str(&testdata("renderings.json")).unwrap();
    assert!(cases.len() >= 7);
    for case in cases {
        let name = &case["name"];
        let messages: Vec<Message> = serde_json::from_value(case["messages"].clone()).unwrap();
        let tools: Option<Vec<Value>> = serde_json::from_value(case["tools"].clone()).unwrap();
        let kwargs: Map<String, Value> = serde_json::from_value(case["kwargs"].clone()).unwrap();
        let options = RenderOptions {
            add_generation_prompt: case["add_generation_prompt"] == Value::Bool(true),
            continue_final_message: false,
            tools: tools.as_deref(),
            kwargs: Some(&kwargs),
        };
        let ids = chat_prompt(&messages, &options, tools.is_some(), false, &text)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let bytes: Vec<u8> = ids.iter().map(|&b| b as u8).collect();
        let got = String::from_utf8(bytes).unwrap();
        let want = case["rendered"].as_str().unwrap();
        assert!(got.contains("Current date: 2"), "{name}: {got}");
        assert_eq!(dateless(&got), dateless(want), "{name}");
    }
}
