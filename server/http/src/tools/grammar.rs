//! The grammar that a forced `tool_choice` ("required" or a named function)
//! holds the answer to: exactly one call, in the family's markup, whose
//! name is one of the callable tools and whose arguments match that tool's
//! `parameters` schema.

use ferrox_grammar::GrammarSpec;
use serde_json::{Value, json};

use crate::tools::choice::ToolRequest;
use crate::tools::parser::ToolFamily;

/// The grammar of one call of `request`'s callable tools; `None` for
/// harmony, whose markup is special tokens a grammar over text cannot hold.
pub fn tool_grammar(request: &ToolRequest, family: ToolFamily) -> Option<GrammarSpec> {
    let key = match family {
        ToolFamily::Hermes => "arguments",
        ToolFamily::Llama3Json => "parameters",
        ToolFamily::Harmony => return None,
    };
    let calls: Vec<Value> = request
        .callable()
        .map(|t| {
            json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, key: t.parameters},
                "required": ["name", key],
                "additionalProperties": false,
            })
        })
        .collect();
    let schema = match <[Value; 1]>::try_from(calls) {
        Ok([one]) => one,
        Err(many) => json!({"anyOf": many}),
    };
    Some(match family {
        ToolFamily::Llama3Json => GrammarSpec::JsonSchema(schema),
        _ => GrammarSpec::Lark(hermes_lark(schema)),
    })
}

/// `<tool_call>\n{call}\n</tool_call>`, the JSON written with fixed
/// separators and no free whitespace (a small model offered whitespace can
/// run to `max_tokens` writing newlines).
fn hermes_lark(mut schema: Value) -> String {
    schema["x-guidance"] = json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
    });
    format!("start: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: %json {schema}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(choice: Value) -> ToolRequest {
        let tools = [
            json!({"type": "function", "function": {"name": "get_weather", "parameters":
                {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}),
            json!({"type": "function", "function": {"name": "now"}}),
        ];
        ToolRequest::check(Some(&tools), Some(&choice), None)
            .unwrap()
            .unwrap()
    }

    #[test]
    fn one_call_of_a_callable_tool_with_its_schema() {
        let named = request(json!({"type": "function", "function": {"name": "now"}}));
        let GrammarSpec::JsonSchema(named) = tool_grammar(&named, ToolFamily::Llama3Json).unwrap()
        else {
            panic!("llama3 calls are a JSON schema");
        };
        assert_eq!(named["properties"]["name"], json!({"const": "now"}));
        assert_eq!(named["required"], json!(["name", "parameters"]));
        let GrammarSpec::Lark(lark) =
            tool_grammar(&request(json!("required")), ToolFamily::Hermes).unwrap()
        else {
            panic!("hermes calls are a Lark grammar");
        };
        assert!(
            lark.starts_with("start: \"<tool_call>\\n\" call \"\\n</tool_call>\""),
            "{lark}"
        );
        let schema: Value = serde_json::from_str(lark.split("%json ").nth(1).unwrap()).unwrap();
        let names: Vec<&Value> = schema["anyOf"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| &c["properties"]["name"]["const"])
            .collect();
        assert_eq!(names, [&json!("get_weather"), &json!("now")]);
        assert_eq!(
            schema["anyOf"][0]["properties"]["arguments"]["required"],
            json!(["city"])
        );
    }
}
