//! Server-sent events for `stream: true`. Dropping the stream (the client
//! went away) drops the `Submission`, which cancels the request.

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event as Sse, Sse as SseBody};
use axum::response::{IntoResponse, Response};
use ferrox_engine::{Event, Submission, Usage};
use futures::Stream;

use crate::error::ApiError;
use crate::frontend::Frontend;
use crate::response::{Envelope, Logprobs};

/// Where one stream is.
struct Cursor {
    sub: Submission,
    env: Envelope,
    frontend: Arc<dyn Frontend>,
    include_usage: bool,
    logprobs: bool,
    first: bool,
    /// Frames ready to send before reading the next event.
    ready: Vec<String>,
    done: bool,
    offset: usize,
}

/// Answers with an SSE stream of this submission's events.
pub fn respond(
    sub: Submission,
    env: Envelope,
    frontend: Arc<dyn Frontend>,
    include_usage: bool,
    logprobs: bool,
) -> Response {
    let cursor = Cursor {
        sub,
        env,
        frontend,
        include_usage,
        logprobs,
        first: true,
        ready: Vec::new(),
        done: false,
        offset: 0,
    };
    SseBody::new(frames(cursor)).into_response()
}

fn frames(cursor: Cursor) -> impl Stream<Item = Result<Sse, Infallible>> {
    futures::stream::unfold(cursor, |mut c| async move {
        loop {
            if !c.ready.is_empty() {
                let frame = c.ready.remove(0);
                return Some((Ok(Sse::default().data(frame)), c));
            }
            if c.done {
                return None;
            }
            match c.sub.next().await {
                Some(event) => c.absorb(event),
                None => c.fail(ApiError::Engine(ferrox_engine::EngineError::WorkerGone)),
            }
        }
    })
}

impl Cursor {
    fn absorb(&mut self, event: Event) {
        match event {
            Event::Token { text, logprob, .. } => {
                let lp = match (self.logprobs, logprob) {
                    (true, Some(t)) => {
                        let one = Logprobs {
                            tokens: vec![(t, self.offset)],
                        };
                        Some(self.env.logprobs(&one, self.frontend.as_ref()))
                    }
                    _ => None,
                };
                self.offset += text.len();
                if !text.is_empty() || lp.is_some() || self.first {
                    self.push(&text, None, lp);
                }
            }
            Event::Done {
                reason,
                text,
                usage,
            } => {
                if !text.is_empty() {
                    self.push(&text, None, None);
                }
                self.push("", Some(reason.as_str()), None);
                self.finish(usage);
            }
            Event::Error(e) => self.fail(ApiError::Engine(e)),
        }
    }

    fn push(&mut self, text: &str, finish: Option<&str>, lp: Option<serde_json::Value>) {
        let chunk = self.env.chunk(text, self.first, finish, lp);
        self.first = false;
        self.ready.push(chunk.to_string());
    }

    fn finish(&mut self, usage: Usage) {
        if self.include_usage {
            self.ready.push(self.env.usage_chunk(usage).to_string());
        }
        self.ready.push("[DONE]".into());
        self.done = true;
    }

    fn fail(&mut self, e: ApiError) {
        self.ready
            .push(serde_json::to_string(&e.body()).unwrap_or_default());
        self.ready.push("[DONE]".into());
        self.done = true;
    }
}
