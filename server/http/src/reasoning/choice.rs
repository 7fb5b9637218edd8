//! `--reasoning-parser` (vLLM's names) and the family it settles on for the
//! served model's chat template.

use std::str::FromStr;

/// The tags around a reasoning block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tags {
    /// What opens the block.
    pub open: &'static str,
    /// What closes it.
    pub close: &'static str,
    /// The tags are special tokens: the reader needs the text with them.
    pub special: bool,
}

/// `<think>…</think>` (Qwen3, DeepSeek-R1 and V3.1, GLM-4.5, SmolLM3,
/// Nemotron-H, Kimi K2).
pub const THINK: Tags = Tags {
    open: "<think>",
    close: "</think>",
    special: false,
};

/// Gemma 4's thought channel: `<|channel>thought…<channel|>`.
pub const GEMMA4: Tags = Tags {
    open: "<|channel>thought",
    close: "<channel|>",
    special: true,
};

/// Mistral's reasoning models (Magistral, Ministral 3 Reasoning):
/// `[THINK]…[/THINK]`, control tokens.
pub const MISTRAL: Tags = Tags {
    open: "[THINK]",
    close: "[/THINK]",
    special: true,
};

/// A family of reasoning markup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningFamily {
    /// A tagged block; `open`: the block is open before the output
    /// (DeepSeek-R1's template writes `<think>`), else the model opens it
    /// (Qwen3) unless the prompt ends in the opening tag.
    Think {
        /// Text before the closing tag is reasoning even with no opening tag.
        open: bool,
        /// The block's tags.
        tags: Tags,
    },
    /// gpt-oss's harmony channels (and its tool calls).
    Harmony,
}

impl ReasoningFamily {
    /// Whether the markup is special tokens, which the answer's text must
    /// then keep for the reader.
    pub fn special(self) -> bool {
        match self {
            ReasoningFamily::Think { tags, .. } => tags.special,
            ReasoningFamily::Harmony => true,
        }
    }
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
        let think = |open, tags| {
            Ok(ReasoningChoice::Family(ReasoningFamily::Think {
                open,
                tags,
            }))
        };
        match s {
            "auto" => Ok(ReasoningChoice::Auto),
            "qwen3" | "glm45" | "deepseek_v3" | "deepseek-v3" => think(false, THINK),
            "deepseek-r1" | "deepseek_r1" => think(true, THINK),
            "mistral" => think(false, MISTRAL),
            "gemma4" => think(false, GEMMA4),
            "gpt-oss" | "openai_gptoss" | "harmony" => {
                Ok(ReasoningChoice::Family(ReasoningFamily::Harmony))
            }
            "none" => Ok(ReasoningChoice::Off),
            other => Err(format!(
                "`{other}` is not a reasoning parser (auto, qwen3, glm45, deepseek_v3, \
                 deepseek-r1, mistral, gemma4, gpt-oss or none)"
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
/// (gpt-oss), Gemma 4's thought channel, Mistral's `[THINK]`, `<think>`
/// blocks (Qwen3, DeepSeek-R1 and their distills; whether the block is
/// already open is read from each prompt), or none.
pub fn detect(template: &str) -> Option<ReasoningFamily> {
    if template.contains("<|channel|>") {
        return Some(ReasoningFamily::Harmony);
    }
    [GEMMA4, MISTRAL, THINK]
        .into_iter()
        .find(|tags| template.contains(tags.open))
        .map(|tags| ReasoningFamily::Think { open: false, tags })
}

/// Whether a prompt's rendered end leaves a block of `tags` open (the
/// template opened it for the model).
pub fn opens_think(prompt_tail: &str, tags: Tags) -> bool {
    prompt_tail.trim_end().ends_with(tags.open)
}

/// How one request's answer is split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningShape {
    /// The markup.
    pub family: ReasoningFamily,
    /// The prompt opened the block.
    pub open: bool,
    /// Send the reasoning (`include_reasoning`, default true); it is read
    /// out of the answer either way.
    pub include: bool,
}

impl ReasoningShape {
    /// How the answer to `prompt` is split: `open` when the rendered
    /// prompt ends in the opening tag (the template opened the block for
    /// the model), read from its last few tokens.
    pub fn new(
        family: ReasoningFamily,
        prompt: &[u32],
        include: bool,
        f: &dyn crate::serve::frontend::Frontend,
    ) -> Self {
        let tail = &prompt[prompt.len().saturating_sub(8)..];
        ReasoningShape {
            family,
            open: match family {
                ReasoningFamily::Think { tags, .. } => {
                    f.decode(tail).is_ok_and(|t| opens_think(&t, tags))
                }
                ReasoningFamily::Harmony => false,
            },
            include,
        }
    }
}
