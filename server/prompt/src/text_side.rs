//! How a conversation becomes prompt tokens, over any tokenizer and
//! template: the server's (behind its frontend) and the router's (rebuilt
//! from the server's prefix spec) go through this one path.

use ferrox_core::{ChatMessage, ChatTemplate, RenderOptions, Tokenizer};

use crate::error::PromptError;
use crate::message::Message;
use crate::tool_prompt::with_tool_prompt;

/// A model's tokenizer and chat template.
pub trait TextSide {
    /// Tokenizes `text`.
    fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, String>;
    /// Renders `messages` with the model's chat template.
    fn render_chat(
        &self,
        messages: &[ChatMessage],
        options: &RenderOptions<'_>,
    ) -> Result<String, String>;
}

/// [`TextSide::encode`] of a tokenizer: the server's and the router's.
pub fn encode_with(
    tokenizer: &Tokenizer,
    text: &str,
    add_special: bool,
) -> Result<Vec<u32>, String> {
    tokenizer
        .encode(text, add_special)
        .map_err(|e| e.to_string())
}

/// [`TextSide::render_chat`] with a model's template, if it has one.
pub fn render_with(
    template: Option<&ChatTemplate>,
    messages: &[ChatMessage],
    options: &RenderOptions<'_>,
) -> Result<String, String> {
    let template = template.ok_or("this model has no chat template; use /v1/completions")?;
    template
        .render_with(messages, options)
        .map_err(|e| e.to_string())
}

/// The conversation rendered with the chat template and tokenized (the
/// template writes its own special tokens). When calls are read
/// (`reads_calls`) and the template does not render tools itself
/// (`describe_tools`), the tools are described in the system message.
pub fn chat_prompt(
    messages: &[Message],
    options: &RenderOptions<'_>,
    reads_calls: bool,
    describe_tools: bool,
    text: &dyn TextSide,
) -> Result<Vec<u32>, PromptError> {
    let mut messages = messages
        .iter()
        .enumerate()
        .map(|(i, m)| m.for_template(i))
        .collect::<Result<Vec<_>, _>>()?;
    if let (true, Some(defs), true) = (reads_calls, options.tools, describe_tools) {
        messages = with_tool_prompt(messages, defs);
    }
    let rendered = text
        .render_chat(&messages, options)
        .map_err(PromptError::Prompt)?;
    text.encode(&rendered, false).map_err(PromptError::Prompt)
}

/// The last `keep` tokens of `prompt` (vLLM's `truncate_prompt_tokens`; -1
/// keeps `max_model_len`), before admission sees it.
pub fn truncated(mut prompt: Vec<u32>, keep: Option<i64>, max_model_len: usize) -> Vec<u32> {
    let keep = match keep {
        None => return prompt,
        Some(-1) => max_model_len,
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
    };
    if prompt.len() > keep {
        prompt.drain(..prompt.len() - keep);
    }
    prompt
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes as tokens; the template writes `role:content;`.
    struct Bytes;

    impl TextSide for Bytes {
        fn encode(&self, text: &str, _: bool) -> Result<Vec<u32>, String> {
            Ok(text.bytes().map(u32::from).collect())
        }
        fn render_chat(&self, m: &[ChatMessage], _: &RenderOptions<'_>) -> Result<String, String> {
            Ok(m.iter()
                .map(|m| format!("{}:{};", m.role, m.content))
                .collect())
        }
    }

    #[test]
    fn tools_are_described_only_when_calls_are_read_and_the_template_does_not() {
        let messages: Vec<Message> =
            serde_json::from_str(r#"[{"role": "user", "content": "A"}]"#).unwrap();
        let tools = [serde_json::json!({"type": "function"})];
        let options = RenderOptions {
            tools: Some(&tools),
            ..RenderOptions::default()
        };
        let plain = chat_prompt(&messages, &options, true, false, &Bytes).unwrap();
        assert_eq!(plain, b"user:A;".map(u32::from));
        let described = chat_prompt(&messages, &options, true, true, &Bytes).unwrap();
        assert!(described.starts_with(&b"system:# Tools".map(u32::from)));
        let unread = chat_prompt(&messages, &options, false, true, &Bytes).unwrap();
        assert_eq!(unread, plain);
        let bad: Vec<Message> =
            serde_json::from_str(r#"[{"role": "user", "content": [{"type": "image_url"}]}]"#)
                .unwrap();
        let e = chat_prompt(&bad, &options, false, false, &Bytes).unwrap_err();
        assert!(
            matches!(e, PromptError::Invalid { ref param, .. } if param == "messages[0].content[0]"),
            "{e}"
        );
    }

    #[test]
    fn truncation_keeps_the_tail() {
        let p: Vec<u32> = (0..10).collect();
        assert_eq!(truncated(p.clone(), None, 4), p);
        assert_eq!(truncated(p.clone(), Some(3), 4), vec![7, 8, 9]);
        assert_eq!(truncated(p.clone(), Some(-1), 4), vec![6, 7, 8, 9]);
        assert_eq!(truncated(p.clone(), Some(20), 4), p);
    }
}
