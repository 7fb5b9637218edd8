//! A pooling request inside the worker: its inputs, the vectors done so
//! far, and the channel its one answer goes to.

use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::request::PoolingRequest;
use crate::job::RequestId;
use crate::{Event, Usage};

/// A pooling request on its way through the worker.
pub(crate) struct PoolJob {
    pub id: RequestId,
    pub req: PoolingRequest,
    /// The vectors of the first `vectors.len()` inputs.
    pub vectors: Vec<Vec<f32>>,
    /// Inputs in the batch now running (after those done).
    pub in_batch: usize,
    pub submitted: Instant,
    /// Whether it has left the waiting line (its first input batched).
    pub started: bool,
    /// Whether it ended with an error (sent); it leaves at the next flush.
    pub failed: bool,
    pub events: UnboundedSender<Event>,
}

impl PoolJob {
    /// A job for `req`, submitted `now`.
    pub fn new(
        id: RequestId,
        req: PoolingRequest,
        now: Instant,
        events: UnboundedSender<Event>,
    ) -> Self {
        PoolJob {
            id,
            req,
            vectors: Vec::new(),
            in_batch: 0,
            submitted: now,
            started: false,
            failed: false,
            events,
        }
    }

    /// Inputs not yet done nor running.
    pub fn next_input(&self) -> usize {
        self.vectors.len() + self.in_batch
    }

    /// Whether every input has its vector.
    pub fn is_done(&self) -> bool {
        self.vectors.len() == self.req.inputs.len()
    }

    /// Its token counts: every input's tokens are prompt tokens.
    pub fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.req.tokens(),
            completion_tokens: 0,
            cached_tokens: 0,
        }
    }
}
