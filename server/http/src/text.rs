//! The real model's text side: ferrox-core's tokenizer, chat template,
//! incremental detokenizer and end-of-generation set behind [`Frontend`].

use std::sync::Arc;

use ferrox_core::{ChatMessage, ChatTemplate, Detokenizer, RenderOptions, Tokenizer};
use ferrox_engine::TokenText;

use crate::frontend::Frontend;

/// Tokenizer, optional chat template and end ids of one model.
pub struct CoreFrontend {
    tokenizer: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    eos: Vec<u32>,
}

impl CoreFrontend {
    /// Wraps the model's text parts.
    pub fn new(tokenizer: Tokenizer, template: Option<ChatTemplate>, eos: Vec<u32>) -> Self {
        CoreFrontend {
            tokenizer: Arc::new(tokenizer),
            template,
            eos,
        }
    }
}

/// One request's detokenizer (special tokens are not shown).
pub(crate) struct Stream {
    tokenizer: Arc<Tokenizer>,
    detok: Detokenizer,
}

impl Stream {
    /// A fresh stream over `tokenizer`.
    pub(crate) fn new(tokenizer: Arc<Tokenizer>) -> Self {
        Stream {
            tokenizer,
            detok: Detokenizer::new(true),
        }
    }
}

impl TokenText for Stream {
    fn push(&mut self, id: u32) -> String {
        // An id the tokenizer cannot decode yields no text rather than
        // failing the request: the model produced it, the client gets the rest.
        self.detok.push(&self.tokenizer, id).unwrap_or_default()
    }
}

impl Frontend for CoreFrontend {
    fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, String> {
        self.tokenizer
            .encode(text, add_special)
            .map_err(|e| e.to_string())
    }

    fn render_chat(
        &self,
        messages: &[ChatMessage],
        options: &RenderOptions<'_>,
    ) -> Result<String, String> {
        let template = self
            .template
            .as_ref()
            .ok_or("this model has no chat template; use /v1/completions")?;
        template
            .render_with(messages, options)
            .map_err(|e| e.to_string())
    }

    fn decode(&self, ids: &[u32]) -> Result<String, String> {
        self.tokenizer.decode(ids, false).map_err(|e| e.to_string())
    }

    fn detokenizer(&self) -> Box<dyn TokenText> {
        Box::new(Stream::new(Arc::clone(&self.tokenizer)))
    }

    fn token_str(&self, id: u32) -> String {
        self.tokenizer.decode(&[id], false).unwrap_or_default()
    }

    fn raw_token(&self, id: u32) -> Option<String> {
        self.tokenizer.id_to_token(id)
    }

    fn vocab_size(&self) -> usize {
        self.tokenizer.vocab_size()
    }

    fn eos_ids(&self) -> Vec<u32> {
        self.eos.clone()
    }

    fn bos_eos_tokens(&self) -> (Option<String>, Option<String>) {
        let t = &self.tokenizer;
        (
            t.bos_token().map(str::to_string),
            t.eos_token().map(str::to_string),
        )
    }
}
