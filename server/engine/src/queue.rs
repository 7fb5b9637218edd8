//! The door: submission, the bounded waiting line, cancellation and drain.
//!
//! The HTTP layer holds an [`EngineHandle`]; each accepted request becomes a
//! [`Submission`] whose drop before the end is a cancel.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ferrox_core::{AdapterRef, BlockHasher, BlockPool, KvEventsPage};
use ferrox_plan::KvTier;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::admission::{LineBound, check_fits};
use crate::job::{Job, RequestId};
use crate::metrics::Metrics;
use crate::pooling::{PoolJob, PoolingRequest, check_pooling, check_token_types};
use crate::{EngineConfig, EngineError, Event, GenerationRequest, Liveness};

/// Where submitted requests go: the generation worker's channel, or the
/// pooling worker's.
pub(crate) enum Door {
    /// Generation requests.
    Generate(Sender<Job>),
    /// Pooling requests (an embedding model).
    Pool(Sender<PoolJob>),
}

/// The state the handle and the worker share.
pub(crate) struct Shared {
    /// Next id and the sender, locked together so ids reach the worker in order.
    pub tx: Mutex<(RequestId, Door)>,
    /// The door is the pooling worker's (read without taking the lock).
    pub pooling: bool,
    /// Submitted and not yet admitted (channel plus the worker's line).
    pub line: Arc<LineBound>,
    /// Hashes prompts for the prefix cache; `None` with the cache off.
    pub hasher: Option<BlockHasher>,
    /// Submitted and not yet ended: counted up at submission and down only
    /// when the worker sends the request's last event.
    pub in_flight: AtomicUsize,
    /// Cancels not yet seen by the worker.
    pub cancels: Mutex<Vec<RequestId>>,
    pub draining: AtomicBool,
    /// False once the worker thread has stopped, for whatever reason.
    pub alive: AtomicBool,
    /// The clock origin of `tick_started`.
    pub epoch: Instant,
    /// Start of the tick in progress, in nanoseconds since `epoch`, plus one;
    /// 0 between ticks.
    pub tick_started: AtomicU64,
    pub config: EngineConfig,
    pub metrics: Arc<Metrics>,
    /// The worker's pool (it locks itself), read for its event log.
    pub pool: BlockPool,
    /// The lower KV tiers, highest first (none without `--kv-offload`).
    pub tiers: Vec<Arc<crate::tier::Tier>>,
    /// Bytes of block copies the tiers' writer has not written yet.
    pub tier_queued: Arc<AtomicU64>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    /// Whether the worker behind the door is a pooling one.
    pub fn is_pooling(&self) -> bool {
        self.pooling
    }

    pub fn take_cancels(&self) -> Vec<RequestId> {
        std::mem::take(&mut *lock(&self.cancels))
    }

    /// Called once per request, right after its last event.
    pub fn ended(&self) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    /// Stamps the start of a tick (`None`: the tick ended).
    pub fn stamp_tick(&self, started: Option<Instant>) {
        let stamp = started.map_or(0, |t| nanos(t.saturating_duration_since(self.epoch)) + 1);
        self.tick_started.store(stamp, Ordering::SeqCst);
    }
}

/// Nanoseconds, saturating (u64 nanoseconds last 584 years).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX - 1)
}

/// The HTTP layer's way into the engine. Cheap to clone.
#[derive(Clone)]
pub struct EngineHandle {
    pub(crate) shared: Arc<Shared>,
}

impl EngineHandle {
    /// Queues a request, or refuses it at once with the reason.
    pub fn submit(&self, req: GenerationRequest, now: Instant) -> Result<Submission, EngineError> {
        let result = self.try_submit(req, now);
        if let Err(e) = &result {
            self.shared.metrics.rejected(reject_reason(e));
        }
        result
    }

    fn try_submit(&self, req: GenerationRequest, now: Instant) -> Result<Submission, EngineError> {
        let s = &self.shared;
        if s.draining.load(Ordering::SeqCst) {
            return Err(EngineError::Draining);
        }
        if !s.alive.load(Ordering::SeqCst) {
            return Err(EngineError::WorkerGone);
        }
        if s.is_pooling() {
            return Err(EngineError::invalid(
                "model",
                "this engine runs a pooling model, which generates no text",
            ));
        }
        req.validate()?;
        let blocks = check_fits(req.prompt.len(), req.max_tokens, &s.config)?;
        s.line.enter()?;
        // Hashed here, on the caller's thread, not on the worker's.
        let adapter = req.adapter.as_ref().map(AdapterRef::key);
        let hasher = (s.hasher.as_ref()).map(|h| h.for_request(adapter, req.cache_salt.as_deref()));
        let hashes = hasher
            .as_ref()
            .map_or_else(Vec::new, |h| h.chain(&req.prompt));
        let (events_tx, events_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut tx = lock(&s.tx);
        let id = tx.0;
        tx.0 += 1;
        let job = Job {
            id,
            req,
            blocks,
            hashes,
            hasher,
            submitted: now,
            events: events_tx,
        };
        s.in_flight.fetch_add(1, Ordering::SeqCst);
        let adapter = job.req.adapter.as_ref().map(|a| a.name().to_string());
        let sent = match &tx.1 {
            Door::Generate(sender) => sender.send(job).is_ok(),
            Door::Pool(_) => false,
        };
        if !sent {
            s.line.leave();
            s.in_flight.fetch_sub(1, Ordering::SeqCst);
            return Err(EngineError::WorkerGone);
        }
        if let Some(name) = adapter {
            s.metrics.lora_request(&name);
        }
        Ok(Submission {
            id,
            events: events_rx,
            shared: Arc::clone(s),
            ended: false,
        })
    }

    /// Queues a pooling request (an embedding model's), or refuses it at
    /// once with the reason: the inputs must be some, none empty, each
    /// within the longest sequence and one batch's tokens.
    pub fn submit_pooling(
        &self,
        req: PoolingRequest,
        now: Instant,
    ) -> Result<Submission, EngineError> {
        let result = self.try_submit_pooling(req, now);
        if let Err(e) = &result {
            self.shared.metrics.rejected(reject_reason(e));
        }
        result
    }

    fn try_submit_pooling(
        &self,
        req: PoolingRequest,
        now: Instant,
    ) -> Result<Submission, EngineError> {
        let s = &self.shared;
        if s.draining.load(Ordering::SeqCst) {
            return Err(EngineError::Draining);
        }
        if !s.alive.load(Ordering::SeqCst) {
            return Err(EngineError::WorkerGone);
        }
        if !s.is_pooling() {
            return Err(EngineError::invalid(
                "model",
                "this engine runs a generating model, which pools no vectors",
            ));
        }
        check_pooling(&req.inputs, &s.config)?;
        check_token_types(&req)?;
        s.line.enter()?;
        let (events_tx, events_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut tx = lock(&s.tx);
        let id = tx.0;
        tx.0 += 1;
        let job = PoolJob::new(id, req, now, events_tx);
        s.in_flight.fetch_add(1, Ordering::SeqCst);
        let sent = match &tx.1 {
            Door::Pool(sender) => sender.send(job).is_ok(),
            Door::Generate(_) => false,
        };
        if !sent {
            s.line.leave();
            s.in_flight.fetch_sub(1, Ordering::SeqCst);
            return Err(EngineError::WorkerGone);
        }
        Ok(Submission {
            id,
            events: events_rx,
            shared: Arc::clone(s),
            ended: false,
        })
    }

    /// Whether this engine runs a pooling model (embeddings), not a
    /// generating one.
    pub fn is_pooling(&self) -> bool {
        self.shared.is_pooling()
    }

    /// Asks the worker to stop request `id` at its next step boundary; a
    /// cancel that arrives before its job is kept until the job does.
    pub fn cancel(&self, id: RequestId) {
        lock(&self.shared.cancels).push(id);
    }

    /// Refuses new work from now on.
    pub fn start_draining(&self) {
        self.shared.draining.store(true, Ordering::SeqCst);
    }

    /// True once draining began.
    pub fn is_draining(&self) -> bool {
        self.shared.draining.load(Ordering::SeqCst)
    }

    /// True while the worker thread runs.
    pub fn is_alive(&self) -> bool {
        self.shared.alive.load(Ordering::SeqCst)
    }

    /// Whether the worker lives at `now`: its thread runs and no tick has run
    /// longer than `bound`.
    pub fn liveness(&self, now: Instant, bound: Duration) -> Liveness {
        let s = &self.shared;
        let stamp = s.tick_started.load(Ordering::SeqCst);
        let started = (stamp > 0).then(|| Duration::from_nanos(stamp - 1));
        let now = now.saturating_duration_since(s.epoch);
        Liveness::judge(self.is_alive(), started, now, bound)
    }

    /// Requests submitted whose last event has not been sent yet.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::SeqCst)
    }

    /// The prefix cache's hashes stored and evicted since `since`, for a
    /// reader of pool `epoch` (a router); see `ferrox_core::KvEventLog`.
    pub fn kv_events(&self, since: u64, epoch: u64) -> KvEventsPage {
        self.shared.pool.kv_events(since, epoch)
    }

    /// What lower tier `tier` stored and evicted since `since`, for a
    /// reader of its log `epoch`; an empty page when the server has no such
    /// tier (the device pool's is [`EngineHandle::kv_events`]).
    pub fn tier_events(&self, tier: KvTier, since: u64, epoch: u64) -> KvEventsPage {
        let mut tiers = self.shared.tiers.iter();
        match tiers.find(|t| t.kind == tier) {
            Some(t) => t.page(since, epoch),
            None if tier == KvTier::Device => self.kv_events(since, epoch),
            None => KvEventsPage::default(),
        }
    }

    /// Bytes of block copies not yet written to the lower tiers: a drain
    /// waits for them, so a conversation's last blocks survive scale to zero.
    pub fn tier_writes_pending(&self) -> u64 {
        self.shared.tier_queued.load(Ordering::Relaxed)
    }

    /// Each lower tier: blocks held and the most it holds.
    pub fn tier_blocks(&self) -> Vec<(KvTier, usize, usize)> {
        let tiers = self.shared.tiers.iter();
        tiers
            .map(|t| {
                let (held, most) = t.blocks();
                (t.kind, held, most)
            })
            .collect()
    }

    /// The hasher prompts are chained with; `None` with the cache off.
    pub fn block_hasher(&self) -> Option<&BlockHasher> {
        self.shared.hasher.as_ref()
    }

    /// The engine's limits.
    pub fn config(&self) -> &EngineConfig {
        &self.shared.config
    }

    /// The shared metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }
}

/// The metrics label of a refusal.
fn reject_reason(e: &EngineError) -> &'static str {
    match e {
        EngineError::TooLong { .. } => "too_long",
        EngineError::QueueFull { .. } => "queue_full",
        EngineError::Draining | EngineError::WorkerGone => "draining",
        EngineError::Invalid { .. }
        | EngineError::Model(_)
        | EngineError::PoolMismatch { .. }
        | EngineError::Config(_) => "invalid",
    }
}

/// One accepted request: its events, in order. Dropping it before the last
/// event cancels the request.
pub struct Submission {
    id: RequestId,
    events: UnboundedReceiver<Event>,
    shared: Arc<Shared>,
    ended: bool,
}

impl Submission {
    /// This request's id.
    pub fn id(&self) -> RequestId {
        self.id
    }

    /// The next event; `None` after the last one or if the worker died.
    pub async fn next(&mut self) -> Option<Event> {
        let e = self.events.recv().await;
        self.note(e)
    }

    /// The next event, blocking the calling (non-async) thread.
    pub fn blocking_next(&mut self) -> Option<Event> {
        let e = self.events.blocking_recv();
        self.note(e)
    }

    /// The next event if one is ready (for tests that drive the worker).
    pub fn try_next(&mut self) -> Option<Event> {
        let e = self.events.try_recv().ok();
        self.note(e)
    }

    fn note(&mut self, e: Option<Event>) -> Option<Event> {
        if matches!(
            e,
            Some(Event::Done { .. } | Event::Vectors { .. } | Event::Error(_))
        ) {
            self.ended = true;
        }
        e
    }

    /// Asks the worker to stop this request at its next step boundary.
    pub fn cancel(&mut self) {
        if !self.ended {
            lock(&self.shared.cancels).push(self.id);
        }
    }
}

impl Drop for Submission {
    fn drop(&mut self) {
        self.cancel();
    }
}
