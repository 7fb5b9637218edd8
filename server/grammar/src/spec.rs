//! What a request asks its output to match.

use llguidance::JsonCompileOptions;
use llguidance::api::TopLevelGrammar;
use serde_json::{Value, json};

use crate::GrammarError;

/// The shape a request's output must have.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A value valid under this JSON schema.
    JsonSchema(Value),
    /// Text in this Lark grammar (llguidance's dialect).
    Lark(String),
    /// Text matching this regular expression as a whole (Rust `regex`
    /// syntax).
    Regex(String),
}

impl GrammarSpec {
    /// Exactly one of `choices`, as written (vLLM's `choice`): a regex of
    /// the escaped alternatives. None when there is nothing to choose.
    pub fn choice<S: AsRef<str>>(choices: &[S]) -> Option<GrammarSpec> {
        if choices.is_empty() {
            return None;
        }
        let alternatives: Vec<String> = choices
            .iter()
            .map(|c| format!("(?:{})", regex::escape(c.as_ref())))
            .collect();
        Some(GrammarSpec::Regex(alternatives.join("|")))
    }

    /// llguidance's form of the spec. JSON is written with fixed separators
    /// (`", "` and `": "`) and no free whitespace: a small model offered
    /// whitespace can run to `max_tokens` emitting newlines.
    pub(crate) fn to_llguidance(&self) -> Result<TopLevelGrammar, GrammarError> {
        let schema = match self {
            GrammarSpec::Lark(g) => return Ok(TopLevelGrammar::from_lark(g.clone())),
            GrammarSpec::Regex(r) => return Ok(TopLevelGrammar::from_regex(r)),
            GrammarSpec::JsonObject => json!({"type": "object"}),
            GrammarSpec::JsonSchema(s) => s.clone(),
        };
        let Value::Object(mut schema) = schema else {
            return Err(GrammarError::Compile(
                "the JSON schema must be an object".into(),
            ));
        };
        // The client's own llguidance options are not honoured: ours keep
        // the output bounded.
        schema.remove("x-guidance");
        let mut schema = Value::Object(schema);
        json_options().apply_to(&mut schema);
        Ok(TopLevelGrammar::from_json_schema(schema))
    }
}

fn json_options() -> JsonCompileOptions {
    JsonCompileOptions {
        item_separator: ", ".into(),
        key_separator: ": ".into(),
        whitespace_flexible: false,
        ..JsonCompileOptions::default()
    }
}
