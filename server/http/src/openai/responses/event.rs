//! The Responses API's stream events as types: each event's body defined
//! once, serialised with its `type` (the event's name) and, in
//! [`Envelope`], its `sequence_number`.

use serde::Serialize;

use super::body::{OutputItem, OutputText, ResponseObject};

/// Where a content part sits: its item, the item's output index and the
/// part's index in the item.
#[derive(Debug, Clone, Serialize)]
pub struct PartAt {
    /// The item's id.
    pub item_id: String,
    /// The item's place in `output`.
    pub output_index: usize,
    /// The part's place in the item's content.
    pub content_index: usize,
}

/// One event of a response stream.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type")]
pub enum StreamEvent {
    /// The response exists (status `in_progress`, no output).
    #[serde(rename = "response.created")]
    Created {
        /// The response so far.
        response: ResponseObject,
    },
    /// The response is being generated.
    #[serde(rename = "response.in_progress")]
    InProgress {
        /// The response so far.
        response: ResponseObject,
    },
    /// The response ended at a natural stop.
    #[serde(rename = "response.completed")]
    Completed {
        /// The whole response.
        response: ResponseObject,
    },
    /// The response ended at `max_output_tokens`.
    #[serde(rename = "response.incomplete")]
    Incomplete {
        /// The whole response.
        response: ResponseObject,
    },
    /// An output item opened.
    #[serde(rename = "response.output_item.added")]
    ItemAdded {
        /// Its place in `output`.
        output_index: usize,
        /// The item, `in_progress`.
        item: OutputItem,
    },
    /// An output item closed.
    #[serde(rename = "response.output_item.done")]
    ItemDone {
        /// Its place in `output`.
        output_index: usize,
        /// The item, `completed`.
        item: OutputItem,
    },
    /// A message's content part opened.
    #[serde(rename = "response.content_part.added")]
    PartAdded {
        /// Where the part is.
        #[serde(flatten)]
        at: PartAt,
        /// The part, empty.
        part: OutputText,
    },
    /// A message's content part closed.
    #[serde(rename = "response.content_part.done")]
    PartDone {
        /// Where the part is.
        #[serde(flatten)]
        at: PartAt,
        /// The whole part.
        part: OutputText,
    },
    /// More text of a message.
    #[serde(rename = "response.output_text.delta")]
    TextDelta {
        /// Where the text goes.
        #[serde(flatten)]
        at: PartAt,
        /// The new text.
        delta: String,
    },
    /// A message's whole text.
    #[serde(rename = "response.output_text.done")]
    TextDone {
        /// Where the text is.
        #[serde(flatten)]
        at: PartAt,
        /// All of it.
        text: String,
    },
    /// More of a reasoning item's text.
    #[serde(rename = "response.reasoning_text.delta")]
    ReasoningDelta {
        /// Where the text goes.
        #[serde(flatten)]
        at: PartAt,
        /// The new text.
        delta: String,
    },
    /// A reasoning item's whole text.
    #[serde(rename = "response.reasoning_text.done")]
    ReasoningDone {
        /// Where the text is.
        #[serde(flatten)]
        at: PartAt,
        /// All of it.
        text: String,
    },
    /// More of a function call's arguments.
    #[serde(rename = "response.function_call_arguments.delta")]
    ArgumentsDelta {
        /// The call's item id.
        item_id: String,
        /// Its place in `output`.
        output_index: usize,
        /// The new text of the arguments.
        delta: String,
    },
    /// A function call's whole arguments.
    #[serde(rename = "response.function_call_arguments.done")]
    ArgumentsDone {
        /// The call's item id.
        item_id: String,
        /// Its place in `output`.
        output_index: usize,
        /// All of them.
        arguments: String,
    },
    /// The request failed mid-stream; nothing follows.
    #[serde(rename = "error")]
    Error {
        /// Human-readable.
        message: String,
        /// OpenAI's error type.
        code: &'static str,
    },
}

/// An event as sent: the event and its place in the stream.
#[derive(Debug, Serialize)]
pub struct Envelope<'a> {
    /// The event, `type` first.
    #[serde(flatten)]
    pub event: &'a StreamEvent,
    /// Events before this one in the stream.
    pub sequence_number: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_its_type_its_fields_and_its_sequence_number() {
        let at = PartAt {
            item_id: "msg_1".into(),
            output_index: 2,
            content_index: 0,
        };
        let cases = [
            (
                StreamEvent::TextDelta {
                    at: at.clone(),
                    delta: "hi".into(),
                },
                serde_json::json!({"type": "response.output_text.delta", "item_id": "msg_1",
                    "output_index": 2, "content_index": 0, "delta": "hi", "sequence_number": 7}),
            ),
            (
                StreamEvent::ArgumentsDone {
                    item_id: "fc_1".into(),
                    output_index: 1,
                    arguments: "{}".into(),
                },
                serde_json::json!({"type": "response.function_call_arguments.done",
                    "item_id": "fc_1", "output_index": 1, "arguments": "{}", "sequence_number": 7}),
            ),
            (
                StreamEvent::Error {
                    message: "boom".into(),
                    code: "server_error",
                },
                serde_json::json!({"type": "error", "message": "boom", "code": "server_error",
                    "sequence_number": 7}),
            ),
        ];
        for (event, want) in cases {
            let sent = Envelope {
                event: &event,
                sequence_number: 7,
            };
            assert_eq!(serde_json::to_value(&sent).unwrap(), want);
        }
    }
}
