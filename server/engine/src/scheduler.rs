//! The worker tick, one step at a time, so tests can drive it:
//! drain the channel, apply cancellations, flush finished rows, admit (FIFO),
//! one step (prefill chunks under a token budget, round-robin, plus every
//! decoding row, in one model call), flush.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ferrox_core::batch_model::{PrefillChunk, StepLogits};
use ferrox_core::{BatchModel, BlockHasher, BlockPool, DecodeRow, PoolStats};

use crate::admission::{Admitted, LineBound, WaitingLine};
use crate::metrics::{Latency, Metrics};
use crate::queue::{EngineHandle, Job, RequestId, Shared};
use crate::row::{Finish, Row, cancelled};
use crate::status::{BatchGauges, DecodeReporter, PrefillFacts, prefill_line};
use crate::{EngineConfig, EngineError, Event, FinishReason, Usage};
use prefill_plan::plan_prefill;

/// What one tick did, for the log and for tests.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TickReport {
    /// Admitted this tick, counted at admission.
    pub admitted: PrefillFacts,
    /// The prefill status line, when something was admitted.
    pub prefill_line: Option<String>,
    /// The rows that ran a prefill chunk this tick, and each chunk's length,
    /// in batch order.
    pub prefilled: Vec<(RequestId, usize)>,
    /// Decode rows in this tick's step, in batch order.
    pub decoded: Vec<RequestId>,
    /// The decode status line, every `decode_log_interval` steps.
    pub decode_line: Option<String>,
}

/// The batching worker's state. The thread loop calls [`Scheduler::tick`].
pub struct Scheduler<M: BatchModel> {
    model: M,
    pool: BlockPool,
    shared: Arc<Shared>,
    rx: Receiver<Job>,
    waiting: WaitingLine,
    /// Admitted rows by id; batch positions map to these ids.
    rows: BTreeMap<RequestId, Row>,
    /// Round-robin order of rows still prefilling.
    prefill_order: VecDeque<RequestId>,
    /// Cancels for ids not seen yet: their jobs are still in the channel.
    carried: HashSet<RequestId>,
    /// Ids below this have reached the worker.
    next_unseen: RequestId,
    reporter: DecodeReporter,
    metrics: Arc<Metrics>,
}

impl<M: BatchModel> Scheduler<M> {
    /// A scheduler over `model` that reports into `metrics`, and the handle
    /// requests come in through.
    pub fn new(
        model: M,
        config: EngineConfig,
        metrics: Arc<Metrics>,
        now: Instant,
    ) -> (Self, EngineHandle) {
        let (tx, rx) = std::sync::mpsc::channel();
        let line = Arc::new(LineBound::new(config.max_queue));
        let hasher = config
            .prefix_caching
            .then(|| BlockHasher::new(&config.cache_salt, config.block_size));
        let shared = Arc::new(Shared {
            tx: Mutex::new((0, tx)),
            line: Arc::clone(&line),
            hasher,
            in_flight: AtomicUsize::new(0),
            cancels: Mutex::new(Vec::new()),
            draining: AtomicBool::new(false),
            alive: AtomicBool::new(true),
            metrics: Arc::clone(&metrics),
            config: config.clone(),
        });
        let scheduler = Scheduler {
            model,
            pool: BlockPool::new(config.kv_blocks),
            reporter: DecodeReporter::new(config.decode_log_interval, now),
            shared: Arc::clone(&shared),
            rx,
            waiting: WaitingLine::new(line, config.block_size),
            rows: BTreeMap::new(),
            prefill_order: VecDeque::new(),
            carried: HashSet::new(),
            next_unseen: 0,
            metrics,
        };
        scheduler.publish();
        (scheduler, EngineHandle { shared })
    }

    /// Nothing waiting and nothing running.
    pub fn is_idle(&self) -> bool {
        self.rows.is_empty() && self.waiting.is_empty()
    }

    /// Blocks until a job arrives, if and only if idle. False if the channel
    /// is closed (the scheduler holds a sender, so only on teardown).
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

    /// KV blocks reserved now.
    pub fn blocks_used(&self) -> usize {
        self.pool.used()
    }

    /// Where the pool's blocks are now.
    pub fn pool_stats(&self) -> PoolStats {
        self.pool.stats()
    }

    /// Rows admitted (prefilling or decoding).
    pub fn running(&self) -> usize {
        self.rows.len()
    }

    /// Requests the worker holds that are not admitted yet.
    pub fn queued(&self) -> usize {
        self.waiting.len()
    }

    /// One tick.
    pub fn tick(&mut self, now: Instant) -> TickReport {
        let mut report = TickReport::default();
        self.drain_channel();
        self.apply_cancels();
        self.flush(now);
        report.admitted = self.admit(now);
        if report.admitted.new_seqs > 0 {
            let line = prefill_line(&report.admitted, &self.gauges());
            tracing::info!("{line}");
            report.prefill_line = Some(line);
        }
        (report.prefilled, report.decoded) = self.step(now);
        if !report.decoded.is_empty() {
            report.decode_line = self
                .reporter
                .on_step(now, report.decoded.len(), &self.gauges());
            if let Some(line) = &report.decode_line {
                tracing::info!("{line}");
            }
        }
        self.flush(now);
        self.publish();
        report
    }

    fn receive(&mut self, job: Job) {
        self.next_unseen = self.next_unseen.max(job.id + 1);
        self.waiting.push(job);
    }

    fn drain_channel(&mut self) {
        while let Ok(job) = self.rx.try_recv() {
            self.receive(job);
        }
    }

    /// Cancels at the step boundary, in all three states. A cancel for an id
    /// not seen yet is carried until its job arrives; one for an id already
    /// gone is dropped.
    fn apply_cancels(&mut self) {
        self.carried.extend(self.shared.take_cancels());
        let carried = &mut self.carried;
        let next_unseen = self.next_unseen;
        let cancelled_waiting = self
            .waiting
            .remove(|job| carried.remove(&job.id) || job.events.is_closed());
        for job in cancelled_waiting {
            self.metrics.finished(FinishReason::Cancelled.as_str());
            let usage = Usage {
                prompt_tokens: job.req.prompt.len(),
                completion_tokens: 0,
            };
            let _ = job.events.send(Event::Done {
                reason: FinishReason::Cancelled,
                text: String::new(),
                usage,
            });
            self.shared.ended();
        }
        for row in self.rows.values_mut() {
            if carried.remove(&row.id) || row.events.is_closed() {
                row.end(cancelled());
            }
        }
        carried.retain(|id| *id >= next_unseen);
    }

    /// Tells every row's lease what its KV now holds (so computed full
    /// blocks are cached) and draws the block each running row's next token
    /// needs; then reports and drops every ended row, whose drop returns its
    /// blocks.
    fn flush(&mut self, now: Instant) {
        let hasher = self.shared.hasher.as_ref();
        for row in self.rows.values_mut() {
            row.commit_blocks(hasher);
            if row.finish.is_none() {
                row.grow_blocks();
            }
        }
        let ended: Vec<RequestId> = self
            .rows
            .values()
            .filter(|r| r.finish.is_some())
            .map(|r| r.id)
            .collect();
        for id in ended {
            if let Some(mut row) = self.rows.remove(&id) {
                row.report_end(now, &self.metrics);
                self.shared.ended();
            }
        }
        let rows = &self.rows;
        self.prefill_order.retain(|id| rows.contains_key(id));
    }

    /// Strict FIFO: a head that does not fit stops the line. Cached prompt
    /// tokens are counted here, where they are taken from the cache.
    fn admit(&mut self, now: Instant) -> PrefillFacts {
        let mut facts = PrefillFacts::default();
        let max_seqs = self.shared.config.max_seqs;
        let block_size = self.shared.config.block_size;
        while let Ok(Admitted { job, lease }) =
            self.waiting
                .pop_admissible(self.rows.len(), max_seqs, &self.pool)
        {
            self.metrics.observe(Latency::Queue, now - job.submitted);
            let prompt = job.req.prompt.len();
            let cached = lease.cached_blocks() * block_size;
            facts.new_seqs += 1;
            facts.new_tokens += prompt - cached;
            facts.cached_tokens += cached;
            self.metrics.add_prompt_tokens(prompt);
            if self.shared.hasher.is_some() {
                self.metrics.add_prefix_cache(prompt, cached);
            }
            match Row::admit(job, lease, self.model.vocab_size(), block_size) {
                Ok(row) => {
                    self.prefill_order.push_back(row.id);
                    self.rows.insert(row.id, row);
                }
                // The lease went down with the job inside `admit`.
                Err((events, e)) => {
                    self.metrics.finished("error");
                    let _ = events.send(Event::Error(e));
                    self.shared.ended();
                }
            }
        }
        facts
    }

    /// One forward over this tick's prefill chunks (a token budget shared
    /// round-robin) and every decoding row. A row whose last chunk runs now
    /// samples its first token from that chunk and decodes from the next tick.
    fn step(&mut self, now: Instant) -> (Vec<(RequestId, usize)>, Vec<RequestId>) {
        let rows = &self.rows;
        let left = |id| {
            rows.get(&id)
                .filter(|r| r.finish.is_none())
                .map_or(0, |r| r.prompt.len() - r.cursor)
        };
        let chunks = plan_prefill(
            &mut self.prefill_order,
            left,
            self.shared.config.prefill_chunk,
        );
        // Batch position j of the decode rows is `ids[j]`, an id, never an
        // index into a table that may change shape.
        let ids: Vec<RequestId> = self
            .rows
            .values()
            .filter(|r| r.finish.is_none() && !r.is_prefilling() && r.pending.is_some())
            .map(|r| r.id)
            .collect();
        if chunks.is_empty() && ids.is_empty() {
            return (chunks, ids);
        }
        match run_step(&mut self.model, &self.rows, &chunks, &ids) {
            Ok(l) if l.prefill.len() == chunks.len() && l.decode.len() == ids.len() => {
                self.apply(&chunks, &ids, l, now);
            }
            Ok(l) => {
                let why = format!(
                    "{} prefill and {} decode logit rows for {} chunks and {} rows",
                    l.prefill.len(),
                    l.decode.len(),
                    chunks.len(),
                    ids.len()
                );
                self.fail(chunks.iter().map(|c| &c.0).chain(&ids), &why);
            }
            Err(e) => self.fail(chunks.iter().map(|c| &c.0).chain(&ids), &e.to_string()),
        }
        (chunks, ids)
    }

    /// Advances the prefill cursors and samples where the step gave logits.
    fn apply(
        &mut self,
        chunks: &[(RequestId, usize)],
        ids: &[RequestId],
        logits: StepLogits,
        now: Instant,
    ) {
        for (&(id, n), l) in chunks.iter().zip(logits.prefill) {
            let Some(row) = self.rows.get_mut(&id) else {
                continue;
            };
            row.cursor += n;
            match (row.is_prefilling(), l) {
                (true, _) => {}
                (false, Some(l)) => row.take_logits(&l, now, &self.metrics),
                (false, None) => row.end(model_failed("prefill returned no logits")),
            }
        }
        for (id, l) in ids.iter().zip(&logits.decode) {
            if let Some(row) = self.rows.get_mut(id) {
                row.take_logits(l, now, &self.metrics);
            }
        }
    }

    fn fail<'a>(&mut self, ids: impl IntoIterator<Item = &'a RequestId>, why: &str) {
        for id in ids {
            if let Some(row) = self.rows.get_mut(id) {
                row.end(model_failed(why));
            }
        }
    }

    fn gauges(&self) -> BatchGauges {
        BatchGauges {
            running: self.rows.len(),
            queued: self.shared.line.waiting(),
            tokens: self.rows.values().map(Row::kv_tokens).sum(),
            kv_used: self.pool.used(),
            kv_total: self.pool.total(),
        }
    }

    fn publish(&self) {
        let g = self.gauges();
        self.metrics
            .set_gauges(g.queued, g.running, &self.pool.stats());
    }
}

/// Runs `chunks` (prompt chunks by row id and length) and the decode rows
/// `ids` through one [`BatchModel::step`].
fn run_step<M: BatchModel>(
    model: &mut M,
    rows: &BTreeMap<RequestId, Row>,
    chunks: &[(RequestId, usize)],
    ids: &[RequestId],
) -> Result<StepLogits, ferrox_core::Error> {
    let prefill: Vec<PrefillChunk<'_>> = chunks
        .iter()
        .filter_map(|&(id, n)| rows.get(&id).map(|r| (r, n)))
        .map(|(r, n)| PrefillChunk {
            blocks: r.lease.blocks(),
            tokens: &r.prompt[r.cursor..r.cursor + n],
            pos: r.cursor,
            want_logits: r.cursor + n == r.prompt.len(),
        })
        .collect();
    let decode: Vec<DecodeRow<'_>> = ids
        .iter()
        .filter_map(|id| rows.get(id))
        .map(|r| DecodeRow {
            token: r.pending.unwrap_or_default(),
            pos: r.decode_pos(),
            blocks: r.lease.blocks(),
        })
        .collect();
    model.step(&prefill, &decode)
}

fn model_failed(why: impl ToString) -> Finish {
    Finish::Failed(EngineError::Model(why.to_string()))
}

mod prefill_plan;
#[cfg(test)]
mod tests;
