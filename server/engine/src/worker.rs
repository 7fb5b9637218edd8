//! The worker thread: the imperative shell around [`Scheduler`]. It reads the
//! clock and blocks only when there is nothing at all to do.

use std::sync::Arc;
use std::time::Instant;

use ferrox_core::{BatchModel, PoolingModel};

use crate::pooling::PoolingScheduler;
use crate::scheduler::Scheduler;
use crate::{EngineConfig, EngineHandle, Metrics};

/// Starts the worker thread over `model`; returns the handle to submit to.
pub fn spawn<M: BatchModel + 'static>(
    model: M,
    config: EngineConfig,
) -> std::io::Result<(EngineHandle, std::thread::JoinHandle<()>)> {
    spawn_with_draft(model, None, config)
}

/// As [`spawn`], with a draft model proposing the draft tokens (see
/// [`Scheduler::set_draft`]; refused where it cannot).
pub fn spawn_with_draft<M: BatchModel + 'static>(
    model: M,
    draft: Option<Box<dyn BatchModel>>,
    config: EngineConfig,
) -> std::io::Result<(EngineHandle, std::thread::JoinHandle<()>)> {
    let metrics = Metrics::new().map_err(std::io::Error::other)?;
    let (mut scheduler, handle) = Scheduler::new(model, config, Arc::new(metrics), Instant::now())
        .map_err(std::io::Error::other)?;
    if let Some(draft) = draft {
        scheduler.set_draft(draft).map_err(std::io::Error::other)?;
    }
    let thread = std::thread::Builder::new()
        .name("ferrox-worker".into())
        .spawn(move || {
            // However the loop ends, panics included, submissions must then
            // fail fast rather than wait on a worker that is gone.
            let result =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&mut scheduler)));
            scheduler.mark_stopped();
            if result.is_err() {
                tracing::error!("the batching worker panicked; the server is no longer ready");
            }
        })?;
    Ok((handle, thread))
}

fn run<M: BatchModel>(scheduler: &mut Scheduler<M>) {
    while scheduler.wait_for_work() {
        scheduler.tick(Instant::now());
    }
}

/// Starts the pooling worker thread over `model` (an embedding model);
/// returns the handle to submit to.
pub fn spawn_pooling<M: PoolingModel + 'static>(
    model: M,
    config: EngineConfig,
) -> std::io::Result<(EngineHandle, std::thread::JoinHandle<()>)> {
    let metrics = Metrics::new().map_err(std::io::Error::other)?;
    let (mut scheduler, handle) =
        PoolingScheduler::new(model, config, Arc::new(metrics), Instant::now())
            .map_err(std::io::Error::other)?;
    let thread = std::thread::Builder::new()
        .name("ferrox-pooling".into())
        .spawn(move || {
            let run = || {
                while scheduler.wait_for_work() {
                    scheduler.tick(Instant::now());
                }
            };
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run));
            scheduler.mark_stopped();
            if result.is_err() {
                tracing::error!("the pooling worker panicked; the server is no longer ready");
            }
        })?;
    Ok((handle, thread))
}
