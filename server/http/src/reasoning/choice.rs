//! `--reasoning-parser` (vLLM's names) and the family it settles on for the
//! served model's chat template.

use std::str::FromStr;

/// A family of reasoning markup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningFamily {
    /// `<think>…</think>`; `open`: the block is open before the output
    /// (DeepSeek-R1's template writes `<think>`), else the model opens it
    /// (Qwen3) unless the prompt ends in `<think>`.
    Think {
        /// Text before `</think>` is reasoning even with no opening tag.
        open: bool,
    },
    /// gpt-oss's harmony channels (and its tool calls).
    Harmony,
}

/// `--reasoning-parser`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningChoice {
    /// From the chat template: harmony's markup, else `<think>`, else none.
    Auto,
    /// This family.
    Family(ReasoningFamily),
    /// Reasoning stays in the answer's text.
    Off,
}

impl FromStr for ReasoningChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(ReasoningChoice::Auto),
            "qwen3" => Ok(ReasoningChoice::Family(ReasoningFamily::Think {
                open: false,
            })),
            "deepseek-r1" | "deepseek_r1" => Ok(ReasoningChoice::Family(ReasoningFamily::Think {
                open: true,
            })),
            "gpt-oss" | "openai_gptoss" | "harmony" => {
                Ok(ReasoningChoice::Family(ReasoningFamily::Harmony))
            }
            "none" => Ok(ReasoningChoice::Off),
            other => Err(format!(
                "`{other}` is not a reasoning parser (auto, qwen3, deepseek-r1, gpt-oss or none)"
            )),
        }
    }
}

impl ReasoningChoice {
    /// The family for a model whose chat template is `template`.
    pub fn resolve(self, template: Option<&str>) -> Option<ReasoningFamily> {
        match self {
            ReasoningChoice::Auto => detect(template.unwrap_or_default()),
            ReasoningChoice::Family(f) => Some(f),
            ReasoningChoice::Off => None,
        }
    }
}

/// The family a chat template's model reasons in: harmony's channels
/// (gpt-oss), `<think>` blocks (Qwen3, DeepSeek-R1 and their distills;
/// whether the block is already open is read from each prompt), or none.
pub fn detect(template: &str) -> Option<ReasoningFamily> {
    if template.contains("<|channel|>") {
        Some(ReasoningFamily::Harmony)
    } else if template.contains("<think>") {
        Some(ReasoningFamily::Think { open: false })
    } else {
        None
    }
}

/// Whether a prompt's rendered end leaves a `<think>` block open (the
/// template opened it for the model).
pub fn opens_think(prompt_tail: &str) -> bool {
    prompt_tail.trim_end().ends_with("<think>")
}

/// How one request's answer is split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningShape {
    /// The markup.
    pub family: ReasoningFamily,
    /// The prompt opened a `<think>` block.
    pub open: bool,
    /// Send the reasoning (`include_reasoning`, default true); it is read
    /// out of the answer either way.
    pub include: bool,
}

impl ReasoningShape {
    /// How the answer to `prompt` is split: `open` when the rendered
    /// prompt ends in `<think>` (the template opened the block for the
    /// model), read from its last few tokens.
    pub fn new(
        family: ReasoningFamily,
        prompt: &[u32],
        include: bool,
        f: &dyn crate::serve::frontend::Frontend,
    ) -> Self {
        let tail = &prompt[prompt.len().saturating_sub(8)..];
        ReasoningShape {
            family,
            open: f.decode(tail).is_ok_and(|t| opens_think(&t)),
            include,
        }
    }
}
