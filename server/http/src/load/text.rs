//! The real model's text side: ferrox-core's tokenizer, chat template,
//! incremental detokenizer and end-of-generation set behind [`Frontend`].

use std::sync::{Arc, OnceLock};

use ferrox_core::{ChatMessage, ChatTemplate, Detokenizer, RenderOptions, Tokenizer};
use ferrox_engine::{TokenConstraint, TokenText};
use ferrox_grammar::{GrammarSpec, Grammars, Vocab};

use super::pair_prompt::PairFormat;
use crate::serve::frontend::{Frontend, TextSpec};

/// Tokenizer, optional chat template and end ids of one model, and the
/// grammar compiler over its vocabulary.
pub struct CoreFrontend {
    tokenizer: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    eos: Vec<u32>,
    /// Why not, where this vocabulary cannot drive a grammar.
    grammars: Result<Grammars, String>,
    /// Made on first ask: routers ask, a server alone never does.
    spec: OnceLock<Result<TextSpec, String>>,
    /// How a query and a document become one sequence.
    pairs: PairFormat,
}

impl CoreFrontend {
    /// Wraps the model's text parts and builds the grammar compiler.
    pub fn new(tokenizer: Tokenizer, template: Option<ChatTemplate>, eos: Vec<u32>) -> Self {
        let grammars = grammars(&tokenizer, &eos);
        if let Err(e) = &grammars {
            tracing::warn!("structured outputs are off: {e}");
        }
        CoreFrontend {
            tokenizer: Arc::new(tokenizer),
            template,
            eos,
            grammars,
            spec: OnceLock::new(),
            pairs: PairFormat::default(),
        }
    }

    /// The same, pairing texts as `pairs` says.
    pub fn with_pairs(mut self, pairs: PairFormat) -> Self {
        self.pairs = pairs;
        self
    }
}

/// The grammar compiler over `tokenizer`'s vocabulary.
pub fn grammars(tokenizer: &Tokenizer, eos: &[u32]) -> Result<Grammars, String> {
    let bytes = tokenizer.token_bytes();
    let vocab = Vocab {
        tokens: bytes.tokens,
        special: bytes.special,
        eos: eos.to_vec(),
    };
    Grammars::new(vocab).map_err(|e| e.to_string())
}

/// One request's detokenizer (special tokens shown only when asked).
pub(crate) struct Stream {
    tokenizer: Arc<Tokenizer>,
    skip_special_tokens: bool,
    detok: Detokenizer,
}

impl Stream {
    /// A fresh stream over `tokenizer`.
    pub(crate) fn new(tokenizer: Arc<Tokenizer>, skip_special_tokens: bool) -> Self {
        Stream {
            tokenizer,
            skip_special_tokens,
            detok: Detokenizer::new(skip_special_tokens),
        }
    }
}

impl TokenText for Stream {
    fn push(&mut self, id: u32) -> String {
        // An id the tokenizer cannot decode yields no text rather than
        // failing the request: the model produced it, the client gets the rest.
        self.detok.push(&self.tokenizer, id).unwrap_or_default()
    }

    fn fresh(&self) -> Box<dyn TokenText> {
        Box::new(Stream::new(
            Arc::clone(&self.tokenizer),
            self.skip_special_tokens,
        ))
    }
}

impl Frontend for CoreFrontend {
    fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, String> {
        ferrox_prompt::text_side::encode_with(&self.tokenizer, text, add_special)
    }

    fn encode_truncated(&self, text: &str, max: usize) -> Result<Vec<u32>, String> {
        (self.tokenizer.encode_truncated(text, max)).map_err(|e| e.to_string())
    }

    fn encode_pair(&self, a: &str, b: &str) -> Result<(Vec<u32>, Vec<u32>), String> {
        (self.pairs).encode((&self.tokenizer, self.template.as_ref()), a, b)
    }

    fn render_chat(
        &self,
        messages: &[ChatMessage],
        options: &RenderOptions<'_>,
    ) -> Result<String, String> {
        ferrox_prompt::text_side::render_with(self.template.as_ref(), messages, options)
    }

    fn decode(&self, ids: &[u32]) -> Result<String, String> {
        self.tokenizer.decode(ids, false).map_err(|e| e.to_string())
    }

    fn detokenizer(&self, skip_special_tokens: bool) -> Box<dyn TokenText> {
        Box::new(Stream::new(
            Arc::clone(&self.tokenizer),
            skip_special_tokens,
        ))
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

    fn text_spec(&self) -> Result<TextSpec, String> {
        self.spec
            .get_or_init(|| {
                let tokenizer = self.tokenizer.to_spec().map_err(|e| e.to_string())?;
                let t = self.template.as_ref();
                let (bos, eos) = t.map(|t| t.special_tokens()).unwrap_or_default();
                Ok(TextSpec {
                    tokenizer,
                    chat_template: t.map(|t| t.source().to_string()),
                    template_tokens: (bos.map(str::to_string), eos.map(str::to_string)),
                })
            })
            .clone()
    }

    fn constraint(&self, spec: &GrammarSpec) -> Result<Box<dyn TokenConstraint>, String> {
        let grammars = self.grammars.as_ref().map_err(String::clone)?;
        let matcher = grammars.compile(spec).map_err(|e| e.to_string())?;
        Ok(Box::new(matcher))
    }
}
