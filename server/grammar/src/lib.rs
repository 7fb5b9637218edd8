//! Structured outputs. A [`GrammarSpec`] (JSON mode, a JSON schema, a Lark
//! grammar, a regex, a fixed choice) is compiled by llguidance, once per
//! request, against the model's vocabulary into a [`GrammarMatcher`]: the engine's
//! [`ferrox_engine::TokenConstraint`] for one row, which masks the tokens the
//! grammar does not allow next and ends the row when the output is complete.
//!
//! [`Grammars`] is made once at start from the tokenizer's [`Vocab`]; it holds
//! the token trie and llguidance's limits, so a hostile schema fails to
//! compile with a clear error instead of running long.

pub mod error;
pub mod grammars;
pub mod matcher;
pub mod spec;

pub use error::GrammarError;
pub use grammars::{Grammars, Vocab};
pub use matcher::GrammarMatcher;
pub use spec::GrammarSpec;

#[cfg(test)]
mod fixtures;
