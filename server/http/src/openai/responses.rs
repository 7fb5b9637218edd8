//! `POST /v1/responses`, OpenAI's Responses API (what the OpenAI Agents SDK
//! and several coding agents speak), served by translating the request into
//! a chat request: the same template, tool calls and structured outputs.
//! No response store: `store: true` and `previous_response_id` are refused.

pub mod body;
pub mod event;
pub mod request;
pub mod stream;
