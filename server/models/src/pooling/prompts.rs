//! sentence-transformers' prompts (`config_sentence_transformers.json`:
//! `prompts`, a name to a text put before each input, and
//! `default_prompt_name`, the one used when a request names none), as
//! EmbeddingGemma's `query` and `document`. A prompt is text: prepended
//! to the input before tokenizing, as sentence-transformers does, so its
//! tokens are pooled and counted with the input's.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::error::{Error, Result};

/// The prompts a model names.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Prompts {
    /// Each prompt's text by name.
    pub named: BTreeMap<String, String>,
    /// The prompt used when a request names none.
    pub default: Option<String>,
}

/// The keys of `config_sentence_transformers.json` read here.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PromptConfig {
    prompts: BTreeMap<String, String>,
    default_prompt_name: Option<String>,
}

impl Prompts {
    /// The prompts of `config_sentence_transformers.json`'s text `text`;
    /// `pooled`: the Pooling module keeps the prompt's tokens
    /// (`include_prompt`, true unless said).
    pub fn parse(text: &str, pooled: bool) -> Result<Self> {
        let c: PromptConfig = serde_json::from_str(text)
            .map_err(|e| Error::Config(format!("config_sentence_transformers.json: {e}")))?;
        // An empty default is sentence-transformers' "none".
        let default = c.default_prompt_name.filter(|n| !n.is_empty());
        if let Some(name) = default.as_ref().filter(|n| !c.prompts.contains_key(*n)) {
            return Err(Error::Config(format!(
                "config_sentence_transformers.json: default_prompt_name {name:?} is not one of \
                 its prompts"
            )));
        }
        if !pooled && !c.prompts.is_empty() {
            // Its vectors leave the prompt's tokens out of the pooling,
            // which is not served: no prompt is offered rather than a
            // vector pooled otherwise than trained.
            if let Some(name) = default {
                return Err(Error::Config(format!(
                    "the default prompt {name:?} is left out of the pooling (include_prompt: \
                     false), which is not served"
                )));
            }
            return Ok(Prompts::default());
        }
        Ok(Prompts {
            named: c.prompts,
            default,
        })
    }

    /// The text before each input when a request names `name` (or names
    /// none: the default's, if any); the error names the known ones.
    pub fn text(&self, name: Option<&str>) -> std::result::Result<Option<&str>, String> {
        let Some(name) = name.or(self.default.as_deref()) else {
            return Ok(None);
        };
        match self.named.get(name) {
            Some(text) => Ok(Some(text)),
            None if self.named.is_empty() => {
                Err(format!("prompt_name {name:?}: the model names no prompts"))
            }
            None => Err(format!(
                "prompt_name {name:?} is not one of the model's prompts ({})",
                self.names().join(", ")
            )),
        }
    }

    /// Every prompt's name, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.named.keys().map(String::as_str).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GEMMA: &str = r#"{"prompts": {"query": "task: search result | query: ",
        "document": "title: none | text: "}, "default_prompt_name": null}"#;

    #[test]
    fn a_named_prompt_is_its_text_and_an_unknown_one_names_the_known() {
        let p = Prompts::parse(GEMMA, true).unwrap();
        assert_eq!(p.text(None), Ok(None));
        assert_eq!(
            p.text(Some("query")),
            Ok(Some("task: search result | query: "))
        );
        let err = p.text(Some("passage")).unwrap_err();
        assert!(
            err.contains("\"passage\"") && err.contains("document, query"),
            "{err}"
        );
        let none = Prompts::parse("{}", true).unwrap();
        assert!(
            none.text(Some("query"))
                .unwrap_err()
                .contains("names no prompts")
        );
    }

    #[test]
    fn the_default_prompt_applies_when_none_is_named() {
        let text = GEMMA.replace("null", "\"document\"");
        let p = Prompts::parse(&text, true).unwrap();
        assert_eq!(p.text(None), Ok(Some("title: none | text: ")));
        assert_eq!(
            p.text(Some("query")),
            Ok(Some("task: search result | query: "))
        );
        let empty = Prompts::parse(&GEMMA.replace("null", "\"\""), true).unwrap();
        assert_eq!(empty.text(None), Ok(None));
        let bad = Prompts::parse(&GEMMA.replace("null", "\"x\""), true).unwrap_err();
        assert!(bad.to_string().contains("not one of its prompts"), "{bad}");
    }

    #[test]
    fn prompts_left_out_of_the_pooling_are_not_offered() {
        let p = Prompts::parse(GEMMA, false).unwrap();
        assert!(p.named.is_empty());
        let text = GEMMA.replace("null", "\"query\"");
        assert!(Prompts::parse(&text, false).is_err());
    }
}
