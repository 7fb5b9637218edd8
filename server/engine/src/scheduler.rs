//! The worker tick, one step at a time, so tests can drive it:
//! drain the channel, apply cancellations, flush finished rows, admit (FIFO),
//! one prefill chunk, one batched decode step, flush.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ferrox_core::{BatchModel, BlockPool, DecodeRow};

use crate::admission::{Admit, admit_head};
use crate::metrics::{Latency, Metrics};
use crate::queue::{EngineHandle, Job, RequestId, Shared};
use crate::row::{Finish, Row, cancelled};
use crate::status::{BatchGauges, DecodeReporter, PrefillFacts, prefill_line};
use crate::{EngineConfig, EngineError, Event, FinishReason, Usage};

/// What one tick did, for the log and for tests.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TickReport {
    /// Admitted this tick, counted at admission.
    pub admitted: PrefillFacts,
    /// The prefill status line, when something was admitted.
    pub prefill_line: Option<String>,
    /// The row that ran a prefill chunk, and the chunk's length.
    pub prefilled: Option<(RequestId, usize)>,
    /// Rows in this tick's decode step, in batch order.
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
    waiting: VecDeque<Job>,
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
    /// A scheduler over `model`, and the handle requests come in through.
    pub fn new(model: M, config: EngineConfig, now: Instant) -> (Self, EngineHandle) {
        let (tx, rx) = std::sync::mpsc::channel();
        let metrics = Arc::new(Metrics::default());
        let shared = Arc::new(Shared {
            tx: Mutex::new((0, tx)),
            waiting: AtomicUsize::new(0),
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
            waiting: VecDeque::new(),
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

    /// KV blocks leased now.
    pub fn blocks_used(&self) -> usize {
        self.pool.used()
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
        report.prefilled = self.prefill_chunk(now);
        report.decoded = self.decode_step(now);
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
        self.waiting.push_back(job);
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
        let mut cancelled_waiting = Vec::new();
        self.waiting.retain(|job| {
            let cancel = carried.remove(&job.id) || job.events.is_closed();
            if cancel {
                cancelled_waiting.push((job.events.clone(), job.req.prompt.len()));
            }
            !cancel
        });
        for (events, prompt_tokens) in cancelled_waiting {
            self.shared.waiting.fetch_sub(1, Ordering::SeqCst);
            self.metrics.finished(FinishReason::Cancelled.as_str());
            let usage = Usage {
                prompt_tokens,
                completion_tokens: 0,
            };
            let _ = events.send(Event::Done {
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

    /// Reports and drops every ended row; the drop returns its blocks.
    fn flush(&mut self, now: Instant) {
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

    /// Strict FIFO: a head that does not fit stops the line.
    fn admit(&mut self, now: Instant) -> PrefillFacts {
        let mut facts = PrefillFacts::default();
        let max_seqs = self.shared.config.max_seqs;
        while let Some(head) = self.waiting.front() {
            if admit_head(self.rows.len(), max_seqs, head.blocks, self.pool.free()) != Admit::Yes {
                break;
            }
            let Ok(lease) = self.pool.allocate(head.blocks) else {
                break;
            };
            let Some(job) = self.waiting.pop_front() else {
                break;
            };
            self.shared.waiting.fetch_sub(1, Ordering::SeqCst);
            self.metrics.observe(Latency::Queue, now - job.submitted);
            facts.new_seqs += 1;
            facts.new_tokens += job.req.prompt.len();
            self.metrics.add_prompt_tokens(job.req.prompt.len());
            match Row::admit(job, lease, self.model.vocab_size()) {
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

    /// One bounded chunk of the next prompt in round-robin order.
    fn prefill_chunk(&mut self, now: Instant) -> Option<(RequestId, usize)> {
        let id = self.prefill_order.pop_front()?;
        let row = self.rows.get_mut(&id)?;
        let start = row.cursor;
        let end = (start + self.shared.config.prefill_chunk.max(1)).min(row.prompt.len());
        let last = end == row.prompt.len();
        let result = self
            .model
            .prefill(row.lease.blocks(), &row.prompt[start..end], start, last);
        match result {
            Ok(logits) => {
                row.cursor = end;
                match (last, logits) {
                    (false, _) => self.prefill_order.push_back(id),
                    (true, Some(l)) => row.take_logits(&l, now, &self.metrics),
                    (true, None) => row.end(model_failed("prefill returned no logits")),
                }
            }
            Err(e) => row.end(model_failed(e)),
        }
        Some((id, end - start))
    }

    /// One batched forward over every decoding row; batch position j is
    /// `ids[j]`, an id, never an index into a table that may change shape.
    fn decode_step(&mut self, now: Instant) -> Vec<RequestId> {
        let ids: Vec<RequestId> = self
            .rows
            .values()
            .filter(|r| r.finish.is_none() && !r.is_prefilling() && r.pending.is_some())
            .map(|r| r.id)
            .collect();
        if ids.is_empty() {
            return ids;
        }
        let batch: Vec<DecodeRow<'_>> = ids
            .iter()
            .filter_map(|id| self.rows.get(id))
            .map(|r| DecodeRow {
                token: r.pending.unwrap_or_default(),
                pos: r.decode_pos(),
                blocks: r.lease.blocks(),
            })
            .collect();
        let result = self.model.decode(&batch);
        drop(batch);
        match result {
            Ok(logits) if logits.len() == ids.len() => {
                for (id, l) in ids.iter().zip(&logits) {
                    if let Some(row) = self.rows.get_mut(id) {
                        row.take_logits(l, now, &self.metrics);
                    }
                }
            }
            Ok(logits) => self.fail(
                &ids,
                &format!("{} logit rows for {}", logits.len(), ids.len()),
            ),
            Err(e) => self.fail(&ids, &e.to_string()),
        }
        ids
    }

    fn fail(&mut self, ids: &[RequestId], why: &str) {
        for id in ids {
            if let Some(row) = self.rows.get_mut(id) {
                row.end(model_failed(why));
            }
        }
    }

    fn gauges(&self) -> BatchGauges {
        BatchGauges {
            running: self.rows.len(),
            queued: self.shared.waiting.load(Ordering::SeqCst),
            tokens: self.rows.values().map(Row::kv_tokens).sum(),
            kv_used: self.pool.used(),
            kv_total: self.pool.total(),
        }
    }

    fn publish(&self) {
        let g = self.gauges();
        self.metrics
            .set_gauges(g.queued, g.running, g.kv_used, g.kv_total);
    }
}

fn model_failed(why: impl ToString) -> Finish {
    Finish::Failed(EngineError::Model(why.to_string()))
}

#[cfg(test)]
mod tests;
