//! A request on its way from the door to the worker, and its id.

use std::time::Instant;

use ferrox_core::{BlockHash, BlockHasher};
use tokio::sync::mpsc::UnboundedSender;

use crate::{Event, GenerationRequest};

/// Identifies a request; assigned at submission, increasing in channel order.
pub type RequestId = u64;

/// A request on its way to the worker.
pub(crate) struct Job {
    pub id: RequestId,
    pub req: GenerationRequest,
    /// Blocks it reserves in each pool, by kind.
    pub blocks: Vec<(ferrox_plan::CacheKind, usize)>,
    /// Chain hashes of the prompt's full blocks; empty with the cache off.
    pub hashes: Vec<BlockHash>,
    /// This request's hasher (the server's, salted by its `cache_salt`);
    /// `None` with the cache off.
    pub hasher: Option<BlockHasher>,
    pub submitted: Instant,
    pub events: UnboundedSender<Event>,
}
