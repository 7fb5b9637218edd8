//! The pooling worker's tick, one batch at a time so tests can drive it:
//! drain the channel, apply cancellations, plan the batch (FIFO, input by
//! input, under the token budget), one forward, hand each finished request
//! its vectors.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ferrox_core::{BlockPool, PoolingModel};

use super::batch::{Slot, plan_batch};
use super::job::PoolJob;
use crate::admission::LineBound;
use crate::job::RequestId;
use crate::metrics::{Latency, Metrics};
use crate::queue::{Door, EngineHandle, Shared};
use crate::{EngineConfig, EngineError, Event, FinishReason};

/// What one pooling tick did, for the log and for tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolingTick {
    /// The batch's inputs: `(request, input index)`, in batch order.
    pub batch: Vec<(RequestId, usize)>,
    /// Tokens in the batch.
    pub tokens: usize,
    /// Requests answered this tick.
    pub finished: Vec<RequestId>,
}

/// The pooling worker's state. The thread loop calls [`PoolingScheduler::tick`].
pub struct PoolingScheduler<M: PoolingModel> {
    model: M,
    shared: Arc<Shared>,
    rx: Receiver<PoolJob>,
    /// Requests not yet answered, in arrival order; the head may be part
    /// done.
    line: VecDeque<PoolJob>,
    /// Cancels for ids not seen yet: their jobs are still in the channel.
    carried: HashSet<RequestId>,
    /// Ids below this have reached the worker.
    next_unseen: RequestId,
    metrics: Arc<Metrics>,
}

impl<M: PoolingModel> PoolingScheduler<M> {
    /// A scheduler over `model` reporting into `metrics`, and the handle
    /// requests come in through. A pooling model has no pool: a config
    /// that names one is refused.
    pub fn new(
        model: M,
        config: EngineConfig,
        metrics: Arc<Metrics>,
        now: Instant,
    ) -> Result<(Self, EngineHandle), EngineError> {
        if !config.pools.is_empty() || config.max_batch_tokens == 0 || config.max_seqs == 0 {
            return Err(EngineError::invalid(
                "config",
                "a pooling engine has no pool, and batches of at least one token and sequence",
            ));
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let shared = Arc::new(Shared {
            tx: Mutex::new((0, Door::Pool(tx))),
            pooling: true,
            line: Arc::new(LineBound::new(config.max_queue)),
            hasher: None,
            in_flight: AtomicUsize::new(0),
            cancels: Mutex::new(Vec::new()),
            draining: AtomicBool::new(false),
            alive: AtomicBool::new(true),
            epoch: now,
            tick_started: AtomicU64::new(0),
            metrics: Arc::clone(&metrics),
            config,
            pool: BlockPool::new(0),
            tiers: Vec::new(),
            tier_queued: Default::default(),
        });
        let scheduler = PoolingScheduler {
            model,
            shared: Arc::clone(&shared),
            rx,
            line: VecDeque::new(),
            carried: HashSet::new(),
            next_unseen: 0,
            metrics,
        };
        scheduler.publish();
        Ok((scheduler, EngineHandle { shared }))
    }

    /// Nothing waiting and nothing running.
    pub fn is_idle(&self) -> bool {
        self.line.is_empty()
    }

    /// Requests the worker holds that are not answered yet.
    pub fn queued(&self) -> usize {
        self.line.len()
    }

    /// Blocks until a job arrives, if and only if idle. False if the channel
    /// is closed.
    pub fn wait_for_work(&mut self) -> bool {
        if !self.is_idle() {
            return true;
        }
        match self.rx.recv() {
            Ok(job) => {
                self.receive(job);
                true
            }
            Err(_) => false,
        }
    }

    /// Marks the worker stopped, so submissions fail instead of hanging.
    pub fn mark_stopped(&self) {
        self.shared.alive.store(false, Ordering::SeqCst);
    }

    /// One tick: at most one batch.
    pub fn tick(&mut self, now: Instant) -> PoolingTick {
        self.shared.stamp_tick(Some(now));
        while let Ok(job) = self.rx.try_recv() {
            self.receive(job);
        }
        self.apply_cancels();
        let mut report = PoolingTick::default();
        let slots = self.checked(self.plan());
        if !slots.is_empty() {
            report.batch = slots
                .iter()
                .map(|s| (self.line[s.job].id, s.input))
                .collect();
            report.tokens = self.start(&slots, now);
            tracing::info!("{}", self.batch_line(&report));
            match self.forward(&slots) {
                Ok(vectors) => self.apply(&slots, vectors),
                Err(why) => self.fail(&slots, &why),
            }
        }
        report.finished = self.flush(now);
        self.publish();
        self.shared.stamp_tick(None);
        report
    }

    fn receive(&mut self, job: PoolJob) {
        self.next_unseen = self.next_unseen.max(job.id + 1);
        self.line.push_back(job);
    }

    /// Cancels at the batch boundary: a cancelled request (or one whose
    /// caller went away) is answered as such and leaves the line.
    fn apply_cancels(&mut self) {
        self.carried.extend(self.shared.take_cancels());
        let (carried, next_unseen) = (&mut self.carried, self.next_unseen);
        let mut kept = VecDeque::with_capacity(self.line.len());
        for job in self.line.drain(..) {
            if !(carried.remove(&job.id) || job.events.is_closed()) {
                kept.push_back(job);
                continue;
            }
            if !job.started {
                self.shared.line.leave();
            }
            self.metrics.finished(FinishReason::Cancelled.as_str());
            let _ = job.events.send(Event::Done {
                reason: FinishReason::Cancelled,
                text: String::new(),
                usage: job.usage(),
            });
            self.shared.ended();
        }
        self.line = kept;
        carried.retain(|id| *id >= next_unseen);
    }

    /// The next batch over the line.
    fn plan(&self) -> Vec<Slot> {
        let lens: Vec<Vec<usize>> = (self.line.iter())
            .map(|j| j.req.inputs.iter().map(Vec::len).collect())
            .collect();
        let line: Vec<(usize, &[usize])> = (self.line.iter().zip(&lens))
            .map(|(j, l)| (j.next_input(), l.as_slice()))
            .collect();
        let c = &self.shared.config;
        plan_batch(&line, c.max_batch_tokens, c.max_seqs)
    }

    /// The slots whose input the model accepts; a request with an input it
    /// refuses ends alone with the reason, and leaves the batch.
    fn checked(&mut self, slots: Vec<Slot>) -> Vec<Slot> {
        let mut refused = HashSet::new();
        for s in &slots {
            let job = &mut self.line[s.job];
            if let Err(e) = self.model.check_input(&job.req.inputs[s.input]) {
                tracing::warn!(id = job.id, error = %e, "the model refused an input");
                let why = format!("input {}: {e}", s.input);
                end_failed(job, EngineError::invalid("input", why), &self.metrics);
                refused.insert(s.job);
            }
        }
        slots
            .into_iter()
            .filter(|s| !refused.contains(&s.job))
            .collect()
    }

    /// Marks the slots' jobs running; returns the batch's tokens.
    fn start(&mut self, slots: &[Slot], now: Instant) -> usize {
        let mut tokens = 0;
        for s in slots {
            let job = &mut self.line[s.job];
            if !job.started {
                job.started = true;
                self.shared.line.leave();
                self.metrics.observe(Latency::Queue, now - job.submitted);
                self.metrics.add_prompt_tokens(job.req.tokens());
            }
            job.in_batch += 1;
            tokens += job.req.inputs[s.input].len();
        }
        tokens
    }

    /// The batch's vectors, one per slot; a failed forward (or a panic in
    /// the model) is tried once more.
    fn forward(&mut self, slots: &[Slot]) -> Result<Vec<Vec<f32>>, String> {
        let seqs: Vec<&[u32]> = (slots.iter())
            .map(|s| self.line[s.job].req.inputs[s.input].as_slice())
            .collect();
        let zeros = vec![0u32; seqs.iter().map(|s| s.len()).max().unwrap_or(0)];
        let types: Vec<&[u32]> = (slots.iter())
            .map(|s| match &self.line[s.job].req.token_types {
                t if t.is_empty() => &zeros[..self.line[s.job].req.inputs[s.input].len()],
                t => t[s.input].as_slice(),
            })
            .collect();
        let typed = slots
            .iter()
            .any(|s| !self.line[s.job].req.token_types.is_empty());
        let types = typed.then_some(types.as_slice());
        let mut why = String::new();
        for attempt in 1..=2 {
            let model = &mut self.model;
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                model.embed_typed(&seqs, types)
            }));
            why = match ran {
                Ok(Ok(v)) if v.len() == seqs.len() => return Ok(v),
                Ok(Ok(v)) => format!("{} vectors for {} inputs", v.len(), seqs.len()),
                Ok(Err(e)) => e.to_string(),
                Err(_) => "the model panicked".to_string(),
            };
            tracing::warn!(attempt, error = %why, "pooling batch failed");
        }
        Err(why)
    }

    /// Hands each slot its vector, in input order.
    fn apply(&mut self, slots: &[Slot], vectors: Vec<Vec<f32>>) {
        for (s, v) in slots.iter().zip(vectors) {
            let job = &mut self.line[s.job];
            job.in_batch -= 1;
            job.vectors.push(v);
        }
    }

    fn fail(&mut self, slots: &[Slot], why: &str) {
        for s in slots {
            let job = &mut self.line[s.job];
            job.in_batch = 0;
            if !job.failed {
                end_failed(job, EngineError::Model(why.to_string()), &self.metrics);
            }
        }
    }

    /// Answers every request whose inputs are all done, and drops those
    /// ended otherwise (failed); returns the answered ids.
    fn flush(&mut self, now: Instant) -> Vec<RequestId> {
        let mut finished = Vec::new();
        let mut kept = VecDeque::with_capacity(self.line.len());
        for mut job in self.line.drain(..) {
            // Failed, or its caller went away during the batch.
            let failed = job.failed || job.events.is_closed();
            if !(job.is_done() || failed) {
                kept.push_back(job);
                continue;
            }
            if !job.started {
                self.shared.line.leave();
            }
            if !failed {
                self.metrics.finished(FinishReason::Stop.as_str());
                self.metrics.observe(Latency::EndToEnd, now - job.submitted);
                let usage = job.usage();
                let data = std::mem::take(&mut job.vectors);
                let _ = job.events.send(Event::Vectors { data, usage });
                finished.push(job.id);
            }
            self.shared.ended();
        }
        self.line = kept;
        finished
    }

    /// The line logged for each batch.
    fn batch_line(&self, t: &PoolingTick) -> String {
        format!(
            "Pooling batch, #seq: {}, #token: {}, token usage: {:.2}, #running-req: {}, \
             #queue-req: {}",
            t.batch.len(),
            t.tokens,
            t.tokens as f64 / self.shared.config.max_batch_tokens.max(1) as f64,
            self.line.iter().filter(|j| j.started).count(),
            self.shared.line.waiting(),
        )
    }

    fn publish(&self) {
        let running = self.line.iter().filter(|j| j.started).count();
        self.metrics
            .set_gauges(self.shared.line.waiting(), running, &[]);
    }
}

/// Ends `job` with `e`: its caller gets the error, and the job leaves the
/// line at this tick's flush.
fn end_failed(job: &mut PoolJob, e: EngineError, metrics: &Metrics) {
    metrics.finished("error");
    let _ = job.events.send(Event::Error(e));
    job.failed = true;
}
