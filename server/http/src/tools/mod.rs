//! Tool calling: tools and tool choice, the grammar of a forced call, and the call readers.

pub mod choice;
pub mod grammar;
pub mod parser;
