//! The tools described in a system message, for chat templates that do
//! not render `tools` themselves (SmolLM2's): Qwen2.5's wording of the
//! Hermes format, so that the model is asked for the markup the server
//! reads.

use ferrox_core::ChatMessage;
use serde_json::Value;

/// `messages` with the tools' description in the system message (a new
/// first message when there is none).
pub fn with_tool_prompt(mut messages: Vec<ChatMessage>, tools: &[Value]) -> Vec<ChatMessage> {
    let described = describe(tools);
    match messages.first_mut() {
        Some(first) if first.role == "system" => {
            first.content = format!("{}\n\n{described}", first.content);
        }
        _ => messages.insert(0, ChatMessage::new("system", described)),
    }
    messages
}

fn describe(tools: &[Value]) -> String {
    let mut out = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for t in tools {
        out.push('\n');
        out.push_str(&t.to_string());
    }
    out.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and \
         arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n\
         {\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_description_joins_the_system_message_or_becomes_one() {
        let tools = [json!({"type": "function", "function": {"name": "get_weather"}})];
        let user = ChatMessage::new("user", "hi");
        let added = with_tool_prompt(vec![user.clone()], &tools);
        assert_eq!(added.len(), 2);
        assert_eq!(added[0].role, "system");
        assert!(
            added[0]
                .content
                .contains(r#"{"type":"function","function":{"name":"get_weather"}}"#),
            "the tool as the client wrote it, keys in its order"
        );
        assert!(added[0].content.contains("<tool_call>"));
        assert_eq!(added[1], user);
        let system = ChatMessage::new("system", "Be brief.");
        let joined = with_tool_prompt(vec![system, user], &tools);
        assert_eq!(joined.len(), 2);
        assert!(joined[0].content.starts_with("Be brief.\n\n# Tools"));
    }
}
