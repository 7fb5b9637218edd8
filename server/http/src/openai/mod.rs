//! The OpenAI API's wire side: requests and their checks, errors, response bodies and streams.

pub mod chat_request;
pub mod embedding_response;
pub mod embeddings;
pub mod error;
pub mod fields;
pub mod prepare;
pub mod request;
pub mod rerank;
pub mod response;
pub mod response_schema;
pub mod responses;
pub mod stream;
pub mod structured;
pub mod tokenize;
