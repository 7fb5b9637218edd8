//! The families' own chat templates (server/prompt/testdata/templates, with
//! transformers' renderings): `--reasoning-parser auto` finds the markup
//! each one writes, and a prompt rendered with the thinking switch opens the
//! block exactly where the template opened it for the model.

use std::path::PathBuf;

use serde_json::Value;

use super::choice::{GEMMA4, MISTRAL, ReasoningFamily, THINK, Tags, detect, opens_think};

fn templates() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../prompt/testdata/templates")
}

fn think(tags: Tags) -> Option<ReasoningFamily> {
    Some(ReasoningFamily::Think { open: false, tags })
}

/// The rendering of case `name` of `family` (transformers').
fn rendered(family: &str, name: &str) -> String {
    let path = templates().join(family).join("renderings.json");
    let cases: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let case = cases.iter().find(|c| c["name"] == name).unwrap();
    case["rendered"].as_str().unwrap().to_string()
}

#[test]
fn auto_finds_each_family_s_markup_and_the_switch_opens_the_block() {
    // (family, what auto finds, whether the thinking_on / thinking_off
    // prompts end inside an open block)
    let cases = [
        ("gpt-oss", Some(ReasoningFamily::Harmony), None),
        ("qwen35", think(THINK), Some((true, false))),
        ("glm45", think(THINK), Some((false, false))),
        ("smollm3", think(THINK), Some((false, false))),
        ("gemma4", think(GEMMA4), Some((false, false))),
        ("ministral3", think(MISTRAL), Some((false, false))),
        ("deepseek-v3", think(THINK), Some((true, false))),
        ("nemotron-h", think(THINK), Some((true, false))),
        ("granitehybrid", None, None),
        ("kimi-k2", think(THINK), Some((false, false))),
    ];
    let mut seen = Vec::new();
    for (family, want, opens) in cases {
        let template =
            std::fs::read_to_string(templates().join(family).join("chat_template.jinja")).unwrap();
        let found = detect(&template);
        assert_eq!(found, want, "{family}");
        seen.push(family);
        let (Some(ReasoningFamily::Think { tags, .. }), Some((on, off))) = (found, opens) else {
            continue;
        };
        let open = |case| opens_think(&rendered(family, case), tags);
        assert_eq!(
            (open("thinking_on"), open("thinking_off")),
            (on, off),
            "{family}"
        );
    }
    // Every template there is in the table.
    let mut listed: Vec<String> = std::fs::read_dir(templates())
        .unwrap()
        .filter_map(|e| e.ok().filter(|e| e.path().is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    listed.sort();
    seen.sort();
    assert_eq!(listed, seen);
}
