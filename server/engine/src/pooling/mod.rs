//! The pooling worker, beside the generation one: an embedding request is
//! one forward of each of its inputs, no decode, nothing held after it.
//! Requests wait in the same bounded line (429/503 at the door), are
//! admitted strictly FIFO, input by input, into batches of at most
//! `max_batch_tokens` tokens and `max_seqs` sequences, and are cancelled at
//! the batch boundary. A sibling of [`crate::Scheduler`], not a mode of
//! it: a pooling model has no pool, no row that lives past a step, no
//! sampling and no prefix cache, and the generation tick stays as it was.

mod batch;
mod job;
mod request;
mod scheduler;

pub(crate) use job::PoolJob;
pub use request::{PoolingRequest, check_pooling, check_token_types};
pub use scheduler::{PoolingScheduler, PoolingTick};

#[cfg(test)]
mod tests;
