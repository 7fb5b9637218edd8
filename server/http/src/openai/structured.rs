//! Structured outputs as clients ask for them: OpenAI's `response_format`
//! (`text`, `json_object`, `json_schema`), and vLLM's `guided_json`,
//! `guided_regex`, `guided_choice`, `guided_grammar` and `structured_outputs`
//! (`json`, `regex`, `choice`, `grammar` or `json_object`), on both
//! generation endpoints. At most one of them per request.

use ferrox_grammar::GrammarSpec;
use serde_json::Value;

use crate::openai::error::ApiError;
use crate::openai::request::Knobs;

/// The grammar a request asks for, and the field that asked (for errors).
#[derive(Debug, Clone, PartialEq)]
pub struct Asked {
    /// What the output must match.
    pub spec: GrammarSpec,
    /// The request field it came from.
    pub field: &'static str,
}

impl Knobs {
    /// The request's grammar, if it asks for one; a malformed or second one
    /// is refused, naming the field.
    pub fn grammar(&self) -> Result<Option<Asked>, ApiError> {
        let asked: Vec<Asked> = [
            self.response_format
                .as_ref()
                .map(|v| response_format(v).map(|s| s.map(|s| ("response_format", s)))),
            self.guided_json
                .as_ref()
                .map(|v| json_schema("guided_json", v).map(|s| Some(("guided_json", s)))),
            self.guided_regex
                .as_ref()
                .map(|r| Ok(Some(("guided_regex", GrammarSpec::Regex(r.clone()))))),
            self.guided_choice
                .as_ref()
                .map(|c| choice("guided_choice", c).map(|s| Some(("guided_choice", s)))),
            self.guided_grammar
                .as_ref()
                .map(|g| Ok(Some(("guided_grammar", GrammarSpec::Lark(g.clone()))))),
            self.structured_outputs
                .as_ref()
                .map(|v| structured_outputs(v).map(|s| Some(("structured_outputs", s)))),
        ]
        .into_iter()
        .flatten()
        .filter_map(|r| r.transpose())
        .map(|r| r.map(|(field, spec)| Asked { spec, field }))
        .collect::<Result<_, _>>()?;
        match <[Asked; 1]>::try_from(asked) {
            Ok([one]) => Ok(Some(one)),
            Err(v) if v.is_empty() => Ok(None),
            Err(v) => Err(ApiError::invalid(
                v[1].field,
                format!(
                    "give one of response_format, guided_json, guided_regex, \
                     guided_choice, guided_grammar and structured_outputs, not both {} and {}",
                    v[0].field, v[1].field
                ),
            )),
        }
    }
}

/// `response_format`; `text` asks for nothing.
fn response_format(v: &Value) -> Result<Option<GrammarSpec>, ApiError> {
    const P: &str = "response_format";
    match v.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(GrammarSpec::JsonObject)),
        Some("json_schema") => {
            let schema = v
                .get("json_schema")
                .and_then(|j| j.get("schema"))
                .ok_or_else(|| {
                    ApiError::invalid(
                        P,
                        "response_format: type \"json_schema\" needs json_schema.schema",
                    )
                })?;
            json_schema(P, schema).map(Some)
        }
        _ => Err(ApiError::invalid(
            P,
            "response_format: type must be \"text\", \"json_object\" or \"json_schema\"",
        )),
    }
}

/// A schema given as an object, or as a JSON string of one (vLLM takes both).
fn json_schema(field: &'static str, v: &Value) -> Result<GrammarSpec, ApiError> {
    let schema = match v {
        Value::String(s) => serde_json::from_str(s).map_err(|e| {
            ApiError::invalid(field, format!("{field}: the schema is not JSON: {e}"))
        })?,
        other => other.clone(),
    };
    if !schema.is_object() {
        return Err(ApiError::invalid(
            field,
            format!("{field}: the schema must be a JSON object"),
        ));
    }
    Ok(GrammarSpec::JsonSchema(schema))
}

/// A non-empty list of choices; the output is exactly one of them.
fn choice(field: &'static str, choices: &[String]) -> Result<GrammarSpec, ApiError> {
    GrammarSpec::choice(choices)
        .ok_or_else(|| ApiError::invalid(field, format!("{field}: give at least one choice")))
}

/// vLLM's `structured_outputs`: one of `{"json": schema}`, `{"regex": rx}`,
/// `{"choice": [..]}`, `{"grammar": lark}` or `{"json_object": true}`.
fn structured_outputs(v: &Value) -> Result<GrammarSpec, ApiError> {
    const P: &str = "structured_outputs";
    let refused = || {
        ApiError::invalid(
            P,
            "structured_outputs: give exactly one of `json` (a schema), `regex` (a \
             string), `choice` (a list of strings), `grammar` (a Lark grammar) or \
             `json_object: true`",
        )
    };
    let obj = v.as_object().filter(|o| o.len() == 1);
    match obj.and_then(|o| o.iter().next()) {
        Some((k, schema)) if k == "json" => json_schema(P, schema),
        Some((k, Value::String(r))) if k == "regex" => Ok(GrammarSpec::Regex(r.clone())),
        Some((k, Value::Array(c))) if k == "choice" => {
            let c: Option<Vec<String>> = c.iter().map(|c| c.as_str().map(str::to_owned)).collect();
            choice(P, &c.ok_or_else(refused)?)
        }
        Some((k, Value::String(g))) if k == "grammar" => Ok(GrammarSpec::Lark(g.clone())),
        Some((k, Value::Bool(true))) if k == "json_object" => Ok(GrammarSpec::JsonObject),
        _ => Err(refused()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn knobs(v: Value) -> Knobs {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn each_form_reads_as_its_grammar() {
        let schema = json!({"type": "object"});
        // (request fields, grammar, field)
        let cases: Vec<(Value, Option<(GrammarSpec, &str)>)> = vec![
            (json!({}), None),
            (json!({"response_format": {"type": "text"}}), None),
            (
                json!({"response_format": {"type": "json_object"}}),
                Some((GrammarSpec::JsonObject, "response_format")),
            ),
            (
                json!({"response_format": {"type": "json_schema",
                       "json_schema": {"name": "x", "schema": schema, "strict": true}}}),
                Some((GrammarSpec::JsonSchema(schema.clone()), "response_format")),
            ),
            (
                json!({"guided_json": schema}),
                Some((GrammarSpec::JsonSchema(schema.clone()), "guided_json")),
            ),
            (
                json!({"guided_json": "{\"type\": \"object\"}"}),
                Some((GrammarSpec::JsonSchema(schema.clone()), "guided_json")),
            ),
            (
                json!({"guided_grammar": "start: \"a\""}),
                Some((GrammarSpec::Lark("start: \"a\"".into()), "guided_grammar")),
            ),
            (
                json!({"structured_outputs": {"json": schema}}),
                Some((
                    GrammarSpec::JsonSchema(schema.clone()),
                    "structured_outputs",
                )),
            ),
            (
                json!({"structured_outputs": {"grammar": "start: \"a\""}}),
                Some((
                    GrammarSpec::Lark("start: \"a\"".into()),
                    "structured_outputs",
                )),
            ),
            (
                json!({"guided_regex": "[0-9]+"}),
                Some((GrammarSpec::Regex("[0-9]+".into()), "guided_regex")),
            ),
            (
                json!({"structured_outputs": {"regex": "[0-9]+"}}),
                Some((GrammarSpec::Regex("[0-9]+".into()), "structured_outputs")),
            ),
            (
                json!({"guided_choice": ["a.b", "c"]}),
                Some((GrammarSpec::choice(&["a.b", "c"]).unwrap(), "guided_choice")),
            ),
            (
                json!({"structured_outputs": {"choice": ["a.b", "c"]}}),
                Some((
                    GrammarSpec::choice(&["a.b", "c"]).unwrap(),
                    "structured_outputs",
                )),
            ),
            (
                json!({"structured_outputs": {"json_object": true}}),
                Some((GrammarSpec::JsonObject, "structured_outputs")),
            ),
        ];
        for (fields, want) in cases {
            let got = knobs(fields.clone()).grammar().unwrap();
            assert_eq!(got.map(|a| (a.spec, a.field)), want, "{fields}");
        }
    }

    #[test]
    fn malformed_or_doubled_requests_name_the_field() {
        // (request fields, field named, fragment)
        let cases = [
            (
                json!({"response_format": {"type": "xml"}}),
                "response_format",
                "type must be",
            ),
            (
                json!({"response_format": {"type": "json_schema"}}),
                "response_format",
                "json_schema.schema",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"schema": [1]}}}),
                "response_format",
                "must be a JSON object",
            ),
            (json!({"guided_json": "{"}), "guided_json", "not JSON"),
            (
                json!({"structured_outputs": {"regex": "a+", "choice": ["a"]}}),
                "structured_outputs",
                "exactly one",
            ),
            (
                json!({"structured_outputs": {"choice": ["a", 1]}}),
                "structured_outputs",
                "list of strings",
            ),
            (
                json!({"structured_outputs": {"json_object": false}}),
                "structured_outputs",
                "exactly one",
            ),
            (
                json!({"structured_outputs": {"choice": []}}),
                "structured_outputs",
                "at least one choice",
            ),
            (
                json!({"guided_choice": []}),
                "guided_choice",
                "at least one",
            ),
            (
                json!({"guided_regex": "a", "guided_choice": ["a"]}),
                "guided_choice",
                "not both guided_regex and guided_choice",
            ),
            (
                json!({"response_format": {"type": "json_object"}, "guided_json": {}}),
                "guided_json",
                "not both response_format and guided_json",
            ),
        ];
        for (fields, field, fragment) in cases {
            match knobs(fields.clone()).grammar() {
                Err(ApiError::Invalid { message, param }) => {
                    assert_eq!(param.as_deref(), Some(field), "{fields}");
                    assert!(message.contains(fragment), "{fields}: {message}");
                }
                other => panic!("{fields}: {other:?}"),
            }
        }
    }
}
