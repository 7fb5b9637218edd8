//! What the router reads of a request body: the model, and whatever decides
//! the prompt's tokens (so its chained block hashes) or, without a
//! tokenizer, its leading text. Lenient on purpose: the server checks the
//! request; a body the router cannot read is still forwarded, routed by load.

use ferrox_core::BlockHash;
use ferrox_prompt::{ChatPrompt, Message, Prompter, TemplateArgs};
use serde::Deserialize;
use serde_json::Value;

/// The parts of a chat or completions body the router routes on.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RequestView {
    /// The served model name asked for.
    pub model: Option<String>,
    /// Chat: the conversation.
    pub messages: Option<Vec<Message>>,
    /// Completions: text, texts, token ids or batches of them.
    pub prompt: Option<Value>,
    /// Chat: tool definitions.
    pub tools: Option<Vec<Value>>,
    /// Chat: `none`, `auto`, ...
    pub tool_choice: Option<Value>,
    /// Chat: the template's fields.
    #[serde(flatten)]
    pub template: TemplateArgs,
    /// Chat: passed to the template.
    pub reasoning_effort: Option<String>,
    /// Chat: passed to the template.
    pub verbosity: Option<String>,
    /// Mixed into the chain's root by the server.
    pub cache_salt: Option<String>,
    /// The server keeps only the prompt's last N tokens.
    pub truncate_prompt_tokens: Option<i64>,
}

impl RequestView {
    /// Reads `body`; `None` when it is not a JSON object of these shapes.
    pub fn parse(body: &[u8]) -> Option<Self> {
        serde_json::from_slice(body).ok()
    }

    /// The prompt's tokens as the server will see them (a batch's first
    /// prompt); `None` when they cannot be worked out.
    pub fn tokens(&self, p: &Prompter) -> Option<Vec<u32>> {
        if let Some(messages) = &self.messages {
            let chat = ChatPrompt {
                messages,
                tools: self.tools.as_deref(),
                tool_choice_none: self.tool_choice.as_ref().and_then(Value::as_str) == Some("none"),
                template: &self.template,
                reasoning_effort: self.reasoning_effort.as_deref(),
                verbosity: self.verbosity.as_deref(),
                truncate: self.truncate_prompt_tokens,
            };
            return p.chat_tokens(&chat).ok();
        }
        let first = match self.prompt.as_ref()? {
            Value::Array(items) if items.first().is_some_and(|v| !v.is_number()) => {
                items.first()?
            }
            other => other,
        };
        match first {
            Value::String(text) => p.text_tokens(text, self.truncate_prompt_tokens).ok(),
            Value::Array(ids) => {
                let ids: Option<Vec<u32>> = ids
                    .iter()
                    .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
                    .collect();
                Some(ferrox_prompt::truncated(
                    ids?,
                    self.truncate_prompt_tokens,
                    p.max_model_len(),
                ))
            }
            _ => None,
        }
    }

    /// The blocks of the prompt the server could take from its cache: its
    /// full blocks but the one holding the last prompt token (the server
    /// always computes at least that token), for the LoRA adapter whose
    /// prefix-cache key is `adapter_key` (`None`: the base model). `None`
    /// without a chain.
    pub fn chain(&self, p: &Prompter, adapter_key: Option<&str>) -> Option<Vec<BlockHash>> {
        let hasher = p.hasher(adapter_key, self.cache_salt.as_deref())?;
        let tokens = self.tokens(p)?;
        let cacheable = tokens.len().saturating_sub(1) / hasher.block_size();
        let mut chain = hasher.chain(&tokens);
        chain.truncate(cacheable);
        Some(chain)
    }

    /// The prompt's text for the hash fallback: messages as `role:content`
    /// lines, or a completions prompt's first text. Salted requests never
    /// share blocks with others, so the salt leads.
    pub fn text_key(&self) -> String {
        let mut key = self.cache_salt.clone().unwrap_or_default();
        if let Some(messages) = &self.messages {
            for (i, m) in messages.iter().enumerate() {
                key.push_str(&m.role);
                key.push(':');
                key.push_str(&m.text(i).unwrap_or_default());
                key.push('\n');
                if key.chars().count() >= crate::chwbl::KEY_CHARS {
                    break;
                }
            }
        } else {
            match &self.prompt {
                Some(Value::String(t)) => key.push_str(t),
                Some(Value::Array(items)) => match items.first() {
                    Some(Value::String(t)) => key.push_str(t),
                    Some(first) => key.push_str(&first.to_string()),
                    None => {}
                },
                _ => {}
            }
        }
        key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_routing_needs_and_ignores_the_rest() {
        let v = RequestView::parse(
            br#"{"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                "temperature": 0.2, "stream": true, "cache_salt": "t1",
                "add_generation_prompt": true, "unknown_field": [1]}"#,
        )
        .unwrap();
        assert_eq!(v.model.as_deref(), Some("m"));
        assert_eq!(v.template.add_generation_prompt, Some(true));
        assert_eq!(v.text_key(), "t1system:Be brief.\nuser:hi\n");
        let cases: [(&[u8], Option<&str>, &str); 5] = [
            (br#"{"model": "c", "prompt": "Once"}"#, Some("c"), "Once"),
            (br#"{"prompt": ["A", "B"]}"#, None, "A"),
            (br#"{"prompt": [1, 2]}"#, None, "1"),
            (br#"{"prompt": [[7, 8], [9]]}"#, None, "[7,8]"),
            (br#"{}"#, None, ""),
        ];
        for (body, model, key) in cases {
            let v = RequestView::parse(body).unwrap();
            assert_eq!(v.model.as_deref(), model);
            assert_eq!(v.text_key(), key);
        }
        for bad in [&b"not json"[..], b"[1]", br#"{"model": 3}"#] {
            assert!(RequestView::parse(bad).is_none());
        }
    }
}
