//! `tools`, `tool_choice` and `parallel_tool_calls` of a chat request,
//! checked into what the server does with them.

use serde_json::Value;

use crate::openai::error::ApiError;

/// Longest function name OpenAI accepts.
const MAX_NAME_LEN: usize = 64;

/// What the request asks of the model.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// No calls: the tools are only rendered into the prompt.
    None,
    /// The model may answer or call.
    Auto,
    /// The model must call one of the tools.
    Required,
    /// The model must call this one.
    Named(String),
}

/// One checked function definition.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// The function's name.
    pub name: String,
    /// Its arguments' JSON schema (`{"type": "object"}` when absent).
    pub parameters: Value,
}

/// The request's tools and what to do with them.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRequest {
    /// The definitions, in request order.
    pub tools: Vec<Tool>,
    /// What the model is asked to do.
    pub choice: ToolChoice,
    /// More than one call per answer.
    pub parallel: bool,
}

impl ToolRequest {
    /// Checks the three fields; `None` when there is nothing to call.
    pub fn check(
        tools: Option<&[Value]>,
        choice: Option<&Value>,
        parallel: Option<bool>,
    ) -> Result<Option<Self>, ApiError> {
        let tools = tools
            .unwrap_or_default()
            .iter()
            .enumerate()
            .map(|(i, t)| check_tool(i, t))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some((i, t)) = tools
            .iter()
            .enumerate()
            .find(|(i, t)| tools[..*i].iter().any(|u| u.name == t.name))
        {
            return Err(ApiError::invalid(
                &format!("tools[{i}].function.name"),
                format!("the function name `{}` is defined twice", t.name),
            ));
        }
        let choice = parse_choice(choice, !tools.is_empty())?;
        if let ToolChoice::Named(name) = &choice
            && !tools.iter().any(|t| &t.name == name)
        {
            return Err(ApiError::invalid(
                "tool_choice",
                format!("tool_choice names `{name}`, which is not one of `tools`"),
            ));
        }
        if tools.is_empty() || choice == ToolChoice::None {
            return Ok(None);
        }
        Ok(Some(ToolRequest {
            tools,
            choice,
            parallel: parallel.unwrap_or(true),
        }))
    }

    /// The model must call (required or named).
    pub fn forced(&self) -> bool {
        matches!(self.choice, ToolChoice::Required | ToolChoice::Named(_))
    }

    /// The tools the model may call: the named one, or all.
    pub fn callable(&self) -> impl Iterator<Item = &Tool> {
        self.tools.iter().filter(|t| match &self.choice {
            ToolChoice::Named(name) => &t.name == name,
            _ => true,
        })
    }
}

fn check_tool(i: usize, t: &Value) -> Result<Tool, ApiError> {
    let at = |field: &str| format!("tools[{i}]{field}");
    let kind = t.get("type").and_then(Value::as_str);
    if kind != Some("function") {
        return Err(ApiError::invalid(
            &at(".type"),
            format!("tools[{i}].type must be \"function\""),
        ));
    }
    let Some(function) = t.get("function").filter(|f| f.is_object()) else {
        return Err(ApiError::invalid(
            &at(".function"),
            format!("tools[{i}].function must be an object with a `name`"),
        ));
    };
    let name = function.get("name").and_then(Value::as_str).unwrap_or("");
    let valid_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if name.is_empty() || name.len() > MAX_NAME_LEN || !name.chars().all(valid_char) {
        return Err(ApiError::invalid(
            &at(".function.name"),
            format!(
                "tools[{i}].function.name must be 1 to {MAX_NAME_LEN} letters, digits, \
                 underscores or dashes"
            ),
        ));
    }
    let parameters = match function.get("parameters") {
        None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => {
            return Err(ApiError::invalid(
                &at(".function.parameters"),
                format!("tools[{i}].function.parameters must be a JSON schema object"),
            ));
        }
    };
    Ok(Tool {
        name: name.to_string(),
        parameters,
    })
}

fn parse_choice(choice: Option<&Value>, has_tools: bool) -> Result<ToolChoice, ApiError> {
    let choice = match choice {
        None => return Ok(ToolChoice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!(
                        "tool_choice `{other}` is not one of \"none\", \"auto\", \"required\" \
                         or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"
                    ),
                ));
            }
        },
        Some(v) => {
            let name = v
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str);
            match (v.get("type").and_then(Value::as_str), name) {
                (Some("function"), Some(name)) => ToolChoice::Named(name.to_string()),
                _ => {
                    return Err(ApiError::invalid(
                        "tool_choice",
                        "a tool_choice object must be {\"type\": \"function\", \"function\": \
                         {\"name\": ...}}",
                    ));
                }
            }
        }
    };
    if !has_tools && matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) {
        return Err(ApiError::invalid(
            "tool_choice",
            "tool_choice \"required\" or a named function needs `tools`",
        ));
    }
    Ok(choice)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
    }

    #[test]
    fn refusals_name_the_field() {
        let named = |n: &str| json!({"type": "function", "function": {"name": n}});
        // (tools, tool_choice, param of the 400)
        let cases = [
            (
                vec![json!({"type": "code_interpreter"})],
                None,
                "tools[0].type",
            ),
            (vec![json!({"type": "function"})], None, "tools[0].function"),
            (
                vec![
                    weather(),
                    json!({"type": "function", "function": {"name": "a b"}}),
                ],
                None,
                "tools[1].function.name",
            ),
            (
                vec![json!({"type": "function", "function": {"name": "f", "parameters": "x"}})],
                None,
                "tools[0].function.parameters",
            ),
            (vec![weather(), weather()], None, "tools[1].function.name"),
            (vec![weather()], Some(named("nope")), "tool_choice"),
            (vec![weather()], Some(json!("sometimes")), "tool_choice"),
            (
                vec![weather()],
                Some(json!({"type": "function"})),
                "tool_choice",
            ),
            (vec![], Some(json!("required")), "tool_choice"),
            (vec![], Some(named("get_weather")), "tool_choice"),
        ];
        for (tools, choice, param) in cases {
            let err = ToolRequest::check(Some(&tools), choice.as_ref(), None).unwrap_err();
            match err {
                ApiError::Invalid { param: Some(p), .. } => assert_eq!(p, param, "{tools:?}"),
                other => panic!("{tools:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn choices_become_what_the_server_does() {
        let tools = [
            weather(),
            json!({"type": "function", "function": {"name": "now"}}),
        ];
        let check = |choice: Option<Value>, parallel| {
            ToolRequest::check(Some(&tools), choice.as_ref(), parallel).unwrap()
        };
        assert_eq!(check(Some(json!("none")), None), None);
        assert_eq!(ToolRequest::check(None, None, None).unwrap(), None);
        let auto = check(None, None).unwrap();
        assert_eq!(
            (auto.choice.clone(), auto.parallel),
            (ToolChoice::Auto, true)
        );
        assert!(!auto.forced());
        assert_eq!(auto.tools.len(), 2);
        assert_eq!(auto.tools[1].parameters["type"], "object");
        let required = check(Some(json!("required")), Some(false)).unwrap();
        assert!(required.forced() && !required.parallel);
        let named = check(
            Some(json!({"type": "function", "function": {"name": "now"}})),
            None,
        )
        .unwrap();
        assert_eq!(named.choice, ToolChoice::Named("now".into()));
    }
}
