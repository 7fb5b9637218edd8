//! The prompt as the server builds it, shared with the router so both
//! compute the same tokens and so the same chained block hashes:
//! [`message`] and [`template_args`] are the OpenAI request's parts,
//! [`text_side`] renders and tokenizes them, [`tool_prompt`] describes tools
//! for templates that do not, and [`prefix_spec`] is what a server publishes
//! for a router to do all of it.

pub mod error;
pub mod message;
pub mod prefix_spec;
pub mod template_args;
pub mod text_side;
pub mod tool_prompt;

pub use error::PromptError;
pub use message::{Content, ContentPart, FunctionCall, Message, ToolCall};
pub use prefix_spec::{ChatPrompt, PrefixSpec, Prompter};
pub use template_args::{TemplateArgs, template_kwargs};
pub use text_side::{TextSide, chat_prompt, truncated};
pub use tool_prompt::with_tool_prompt;
