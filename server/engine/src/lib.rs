//! The continuous-batching engine: a worker that admits requests FIFO under
//! a sequence cap and a KV block budget, and runs one model step per tick:
//! prompt chunks under a token budget shared round-robin, plus one decode row
//! for every ready sequence. Sans-IO except for [`worker`], the thread that
//! reads the clock.

pub mod admission;
pub mod config;
pub mod constraint;
pub mod error;
pub mod event;
mod job;
mod kv_pools;
pub mod liveness;
pub mod metrics;
pub mod params;
pub mod plan_info;
pub mod pooling;
pub mod queue;
mod ranking;
mod row;
mod row_kv;
pub mod sampler;
pub mod scheduler;
mod speculative;
pub mod status;
pub mod stop;
mod tier;
pub mod worker;

#[cfg(test)]
mod fixtures;

pub use config::EngineConfig;
pub use constraint::TokenConstraint;
pub use error::EngineError;
pub use event::{Event, FinishReason, TokenLogprob, Usage};
pub use job::RequestId;
pub use liveness::Liveness;
pub use metrics::Metrics;
pub use params::{GenerationRequest, SamplingParams, TokenText};
pub use plan_info::PlanInfo;
pub use pooling::{PoolingRequest, PoolingScheduler};
pub use queue::{EngineHandle, Submission};
pub use scheduler::{Scheduler, TickReport};
