//! Each family's own chat template, rendered by our path (messages in
//! OpenAI's shape through `chat_prompt`, the template by minijinja), equals
//! what transformers' `apply_chat_template` renders for the same cases, and
//! refuses where it refuses: `testdata/templates/<family>/renderings.json`,
//! written by `tests/families/chat_templates.py`.

use std::path::PathBuf;

use ferrox_core::{ChatMessage, ChatTemplate, RenderOptions};
use ferrox_prompt::{Message, TextSide, chat_prompt};
use serde_json::{Map, Value};

/// The families whose templates are here.
const FAMILIES: [&str; 10] = [
    "gpt-oss",
    "qwen35",
    "glm45",
    "smollm3",
    "gemma4",
    "ministral3",
    "deepseek-v3",
    "nemotron-h",
    "granitehybrid",
    "kimi-k2",
];

fn testdata(family: &str, name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/templates")
        .join(family)
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
fn every_family_s_template_renders_as_transformers_does() {
    for family in FAMILIES {
        // The special tokens transformers' tokenizer is given too.
        let (bos, eos) = (Some("<s>".to_string()), Some("</s>".to_string()));
        let template = ChatTemplate::new(testdata(family, "chat_template.jinja"), bos, eos)
            .unwrap_or_else(|e| panic!("{family}: {e}"));
        let text = Bytes(template);
        let cases: Vec<Value> = serde_json::from_str(&testdata(family, "renderings.json")).unwrap();
        assert!(cases.len() >= 10, "{family}");
        for case in cases {
            check(family, &case, &text);
        }
    }
}

/// One case: our rendering equals transformers', or both refuse.
fn check(family: &str, case: &Value, text: &Bytes) {
    let name = format!("{family} {}", case["name"]);
    let messages: Vec<Message> = serde_json::from_value(case["messages"].clone()).unwrap();
    let tools: Option<Vec<Value>> = serde_json::from_value(case["tools"].clone()).unwrap();
    let kwargs: Map<String, Value> = serde_json::from_value(case["kwargs"].clone()).unwrap();
    let options = RenderOptions {
        add_generation_prompt: case["add_generation_prompt"] == Value::Bool(true),
        continue_final_message: false,
        tools: tools.as_deref(),
        kwargs: Some(&kwargs),
    };
    let got = chat_prompt(&messages, &options, tools.is_some(), false, text);
    let Some(want) = case["rendered"].as_str() else {
        assert!(
            got.is_err(),
            "{name}: transformers refuses ({}), we render",
            case["error"]
        );
        return;
    };
    let ids = got.unwrap_or_else(|e| panic!("{name}: {e}"));
    let bytes: Vec<u8> = ids.iter().map(|&b| b as u8).collect();
    let got = String::from_utf8(bytes).unwrap();
    if family == "gpt-oss" {
        assert!(got.contains("Current date: 2"), "{name}: {got}");
    }
    assert_eq!(dateless(&got), dateless(want), "{name}");
}
