//! What the HTTP layer needs from the model's text side: tokenizer, chat
//! template, detokenizer and end tokens. A trait, so the handlers can be
//! tested without a model.

use ferrox_core::{ChatMessage, RenderOptions};
use ferrox_engine::{TokenConstraint, TokenText};
use ferrox_grammar::GrammarSpec;

/// The tokenizer and chat template as data.
#[derive(Debug, Clone)]
pub struct TextSpec {
    /// The tokenizer.
    pub tokenizer: ferrox_core::TokenizerSpec,
    /// The template's source.
    pub chat_template: Option<String>,
    /// The BOS and EOS strings the template gets.
    pub template_tokens: (Option<String>, Option<String>),
}

/// The model's text side.
pub trait Frontend: Send + Sync + 'static {
    /// Tokenizes `text`.
    fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, String>;
    /// Tokenizes `text` with its special tokens, its content cut so that
    /// the whole is at most `max` ids.
    fn encode_truncated(&self, text: &str, max: usize) -> Result<Vec<u32>, String>;
    /// Tokenizes a pair of texts as one sequence by the tokenizer's pair
    /// template (a cross-encoder's query and document), with each id's
    /// token type.
    fn encode_pair(&self, a: &str, b: &str) -> Result<(Vec<u32>, Vec<u32>), String> {
        let _ = (a, b);
        Err("the tokenizer has no template for a pair of texts".into())
    }
    /// Renders `messages` with the model's chat template.
    fn render_chat(
        &self,
        messages: &[ChatMessage],
        options: &RenderOptions<'_>,
    ) -> Result<String, String>;
    /// The text of `ids`, special tokens included.
    fn decode(&self, ids: &[u32]) -> Result<String, String>;
    /// A fresh incremental detokenizer for one request; with
    /// `skip_special_tokens` false, special tokens are text too.
    fn detokenizer(&self, skip_special_tokens: bool) -> Box<dyn TokenText>;
    /// The text of one token, for logprobs.
    fn token_str(&self, id: u32) -> String;
    /// The tokenizer's own string for one token (`Ġthe`), if it has one.
    fn raw_token(&self, id: u32) -> Option<String>;
    /// Ids below this are the tokenizer's.
    fn vocab_size(&self) -> usize;
    /// The model's end-of-generation ids.
    fn eos_ids(&self) -> Vec<u32>;
    /// The BOS and EOS tokens' strings, where the tokenizer names them.
    fn bos_eos_tokens(&self) -> (Option<String>, Option<String>);
    /// The tokenizer and template as data, for a router to rebuild
    /// (`GET /prefix_spec`), or why not.
    fn text_spec(&self) -> Result<TextSpec, String>;
    /// `spec` compiled over this vocabulary: one row's constraint, or why
    /// not (for a 400).
    fn constraint(&self, spec: &GrammarSpec) -> Result<Box<dyn TokenConstraint>, String>;
}
