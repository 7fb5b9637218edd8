//! Reasoning read out of the model's text, apart from the answer: tagged
//! blocks (Qwen3's and DeepSeek-R1's `<think>…</think>`, Gemma 4's thought
//! channel, Mistral's `[THINK]`) and gpt-oss's harmony channels (whose tool
//! calls are in the same markup). One state machine per family, fed
//! the text as it arrives, streamed or whole alike.

pub mod answer;
pub mod choice;
pub mod harmony;
pub mod piece;
pub mod split;
pub mod think;

#[cfg(test)]
mod templates;
#[cfg(test)]
mod tests;
