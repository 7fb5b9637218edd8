//! The chat template's request fields (vLLM's) and the extra variables a
//! request passes to the template.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::error::PromptError;

/// The chat template's request fields (vLLM's), read by chat and
/// `/tokenize` alike.
#[derive(Debug, Clone, Default, Deserialize, Serialize, utoipa::ToSchema)]
pub struct TemplateArgs {
    /// Open the assistant's turn (default: true; false with
    /// `continue_final_message`).
    pub add_generation_prompt: Option<bool>,
    /// Continue the last message instead of opening a new turn.
    pub continue_final_message: Option<bool>,
    /// More variables for the template, e.g. `{"enable_thinking": false}`
    /// (what they do is the template's business).
    pub chat_template_kwargs: Option<Map<String, Value>>,
}

impl TemplateArgs {
    /// (add_generation_prompt, continue_final_message); both true is a 400,
    /// as in vLLM.
    pub fn turn(&self) -> Result<(bool, bool), PromptError> {
        let cont = self.continue_final_message == Some(true);
        let add = self.add_generation_prompt.unwrap_or(!cont);
        if add && cont {
            return Err(PromptError::invalid(
                "continue_final_message",
                "continue_final_message and add_generation_prompt cannot both be true",
            ));
        }
        Ok((add, cont))
    }

    /// True when any field is set (they go with messages only).
    pub fn any(&self) -> bool {
        self.add_generation_prompt.is_some()
            || self.continue_final_message.is_some()
            || self.chat_template_kwargs.is_some()
    }
}

/// The template's extra variables: `chat_template_kwargs`, with
/// `reasoning_effort` and `verbosity` where given and not already there.
pub fn template_kwargs(
    kwargs: Option<&Map<String, Value>>,
    reasoning_effort: Option<&str>,
    verbosity: Option<&str>,
) -> Option<Map<String, Value>> {
    let mut kwargs = kwargs.cloned().unwrap_or_default();
    for (name, value) in [
        ("reasoning_effort", reasoning_effort),
        ("verbosity", verbosity),
    ] {
        if let Some(v) = value {
            kwargs.entry(name).or_insert_with(|| json!(v));
        }
    }
    (!kwargs.is_empty()).then_some(kwargs)
}
