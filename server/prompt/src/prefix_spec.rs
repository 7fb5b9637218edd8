//! What a router needs to hash prompts exactly as one server does: its
//! tokenizer and chat template as data, its block size and chain root, and
//! how it describes tools. The server publishes it (`GET /prefix_spec`); a
//! [`Prompter`] is that spec made usable.

use ferrox_core::{
    BlockHash, BlockHasher, ChatMessage, ChatTemplate, RenderOptions, Tokenizer, TokenizerSpec,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::PromptError;
use crate::message::Message;
use crate::template_args::{TemplateArgs, template_kwargs};
use crate::text_side::{TextSide, chat_prompt, truncated};

/// A server's prompt-to-blocks recipe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrefixSpec {
    /// The served model name.
    pub model: String,
    /// Tokens per KV block.
    pub block_size: usize,
    /// The root of the server's chains; `None` with the prefix cache off.
    pub root: Option<BlockHash>,
    /// The longest sequence (for `truncate_prompt_tokens: -1`).
    pub max_model_len: usize,
    /// The tokenizer.
    pub tokenizer: TokenizerSpec,
    /// The chat template's source, if the model has one.
    pub chat_template: Option<String>,
    /// The BOS and EOS strings the template gets.
    pub template_tokens: (Option<String>, Option<String>),
    /// The server reads tool calls (a tool-call family is known).
    pub tool_calls: bool,
    /// The template does not render `tools`: the server describes them in
    /// the system message.
    pub describe_tools: bool,
}

/// One chat request's parts that decide its prompt.
#[derive(Debug, Clone)]
pub struct ChatPrompt<'a> {
    /// The conversation.
    pub messages: &'a [Message],
    /// Tool definitions.
    pub tools: Option<&'a [Value]>,
    /// `tool_choice` is `"none"`.
    pub tool_choice_none: bool,
    /// The template's fields.
    pub template: &'a TemplateArgs,
    /// `reasoning_effort`, passed to the template.
    pub reasoning_effort: Option<&'a str>,
    /// `verbosity`, passed to the template.
    pub verbosity: Option<&'a str>,
    /// `truncate_prompt_tokens`.
    pub truncate: Option<i64>,
}

/// A spec made usable: tokenizes, renders and hashes as its server does.
#[derive(Debug)]
pub struct Prompter {
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    hasher: Option<BlockHasher>,
    max_model_len: usize,
    tool_calls: bool,
    describe_tools: bool,
}

fn prompt_err(e: ferrox_core::Error) -> PromptError {
    PromptError::Prompt(e.to_string())
}

impl Prompter {
    /// Builds the tokenizer and template `spec` describes.
    pub fn new(spec: &PrefixSpec) -> Result<Self, PromptError> {
        let tokenizer = Tokenizer::from_spec(&spec.tokenizer).map_err(prompt_err)?;
        let (bos, eos) = spec.template_tokens.clone();
        let template = spec
            .chat_template
            .as_ref()
            .map(|s| ChatTemplate::new(s.clone(), bos, eos))
            .transpose()
            .map_err(prompt_err)?;
        Ok(Prompter {
            tokenizer,
            template,
            hasher: spec
                .root
                .map(|root| BlockHasher::from_root(root, spec.block_size)),
            max_model_len: spec.max_model_len,
            tool_calls: spec.tool_calls,
            describe_tools: spec.describe_tools,
        })
    }

    /// The chain hasher of a request for the LoRA adapter whose cache key
    /// is `adapter_key` (the base model: `None`) with `cache_salt`; `None`
    /// when the server caches no prefixes.
    pub fn hasher(
        &self,
        adapter_key: Option<&str>,
        cache_salt: Option<&str>,
    ) -> Option<BlockHasher> {
        let h = self.hasher.as_ref()?;
        Some(h.for_request(adapter_key, cache_salt))
    }

    /// The prompt tokens of a chat request, as the server submits them.
    pub fn chat_tokens(&self, r: &ChatPrompt<'_>) -> Result<Vec<u32>, PromptError> {
        let (add_generation_prompt, continue_final_message) = r.template.turn()?;
        let kwargs = template_kwargs(
            r.template.chat_template_kwargs.as_ref(),
            r.reasoning_effort,
            r.verbosity,
        );
        let tools = r.tools.filter(|t| !t.is_empty());
        let options = RenderOptions {
            add_generation_prompt,
            continue_final_message,
            tools,
            kwargs: kwargs.as_ref(),
        };
        let reads_calls = tools.is_some() && !r.tool_choice_none && self.tool_calls;
        let ids = chat_prompt(r.messages, &options, reads_calls, self.describe_tools, self)?;
        Ok(truncated(ids, r.truncate, self.max_model_len))
    }

    /// The prompt tokens of a completions prompt given as text.
    pub fn text_tokens(&self, text: &str, truncate: Option<i64>) -> Result<Vec<u32>, PromptError> {
        let ids = self.tokenizer.encode(text, true).map_err(prompt_err)?;
        Ok(truncated(ids, truncate, self.max_model_len))
    }

    /// The longest sequence, for truncation of token prompts.
    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }
}

impl TextSide for Prompter {
    fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, String> {
        crate::text_side::encode_with(&self.tokenizer, text, add_special)
    }

    fn render_chat(
        &self,
        messages: &[ChatMessage],
        options: &RenderOptions<'_>,
    ) -> Result<String, String> {
        crate::text_side::render_with(self.template.as_ref(), messages, options)
    }
}
