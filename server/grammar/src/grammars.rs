//! The compiler, made once at start from the model's vocabulary.

use std::sync::Arc;

use llguidance::ParserFactory;
use llguidance::api::ParserLimits;
use llguidance::toktrie::{ApproximateTokEnv, InferenceCapabilities, TokEnv, TokRxInfo, TokTrie};

use crate::{GrammarError, GrammarMatcher, GrammarSpec};

/// The model's vocabulary as a grammar sees it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Vocab {
    /// The bytes token `id` spells, at index `id` (empty: never allowed,
    /// except as an end token).
    pub tokens: Vec<Vec<u8>>,
    /// Control tokens and their text (`<|im_end|>`), which a Lark grammar
    /// may name; they never match text.
    pub special: Vec<(u32, String)>,
    /// The model's end-of-generation ids: allowed once the output is
    /// complete, when the grammar lets it end there.
    pub eos: Vec<u32>,
}

/// Compiles [`GrammarSpec`]s for one model. Cheap to share.
#[derive(Clone)]
pub struct Grammars {
    factory: Arc<ParserFactory>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("vocab_size", &self.vocab_size())
            .finish_non_exhaustive()
    }
}

/// llguidance's limits, spelled out: each bounds the work of one compile or
/// one mask, so no schema makes a request (or the worker) hang.
pub fn limits() -> ParserLimits {
    ParserLimits {
        // About 20 ms of lexer construction at compile time.
        initial_lexer_fuel: 1_000_000,
        // About 15 ms for one token mask; a mask past it fails the row.
        step_lexer_fuel: 200_000,
        step_max_items: 50_000,
        max_items_in_row: 2_000,
        max_lexer_states: 250_000,
        // Symbols in the compiled grammar: a few megabytes of schema.
        max_grammar_size: 500_000,
        precompute_large_lexemes: true,
        // Errors go to clients: no grammar dump, no token trace.
        verbose_errors: false,
    }
}

impl Grammars {
    /// The compiler for `vocab`; refuses a vocabulary it cannot use.
    pub fn new(vocab: Vocab) -> Result<Self, GrammarError> {
        let env = tok_env(vocab)?;
        let caps = InferenceCapabilities::default();
        let mut factory = ParserFactory::new(&env, caps, &[])
            .map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        factory.quiet();
        *factory.limits_mut() = limits();
        Ok(Grammars {
            factory: Arc::new(factory),
        })
    }

    /// Tokens the grammar knows; the model's logits may be longer (padding
    /// ids), and those are never allowed.
    pub fn vocab_size(&self) -> usize {
        self.factory.tok_env().tok_trie().vocab_size()
    }

    /// Compiles `spec` into a fresh matcher, its first mask computed, so an
    /// error (unsupported feature, bad grammar, a limit hit) is the
    /// client's, here, and not the worker's later.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<GrammarMatcher, GrammarError> {
        let grammar = spec.to_llguidance()?;
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| GrammarError::Compile(e.to_string()))?;
        GrammarMatcher::start(llguidance::Matcher::new(Ok(parser)))
    }
}

/// The token trie and its environment: ids spelled as bytes, control
/// tokens behind llguidance's marker byte, the end set.
fn tok_env(vocab: Vocab) -> Result<TokEnv, GrammarError> {
    let bad = |m: String| GrammarError::Vocabulary(m);
    let mut words = vocab.tokens;
    let size = u32::try_from(words.len()).map_err(|_| bad("too many tokens".into()))?;
    for (id, text) in &vocab.special {
        let word = words
            .get_mut(*id as usize)
            .ok_or_else(|| bad(format!("special token {id} is outside the vocabulary")))?;
        *word = [&[TokTrie::SPECIAL_TOKEN_MARKER], text.as_bytes()].concat();
    }
    if let Some(&id) = vocab.eos.iter().find(|&&id| id >= size) {
        return Err(bad(format!("end token {id} is outside the vocabulary")));
    }
    let Some(&first_eos) = vocab.eos.first() else {
        return Err(bad("the model has no end-of-generation token".into()));
    };
    let info = TokRxInfo::new(size, first_eos);
    let trie = TokTrie::from(&info, &words).with_eos_tokens(&vocab.eos);
    Ok(Arc::new(ApproximateTokEnv::new(trie)))
}

#[cfg(test)]
mod tests;
