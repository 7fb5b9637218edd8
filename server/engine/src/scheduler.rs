//! The worker tick, one step at a time, so tests can drive it:
//! drain the channel, apply cancellations, flush finished rows, admit (FIFO),
//! one step (prefill chunks under a token budget, round-robin, plus every
//! decoding row, in one model call), flush.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ferrox_core::{AdapterRef, BatchModel, BlockHasher, PoolStats};
use ferrox_plan::CacheKind;

use crate::admission::{AdapterCap, Admitted, LineBound, WaitingLine};
use crate::job::{Job, RequestId};
use crate::kv_pools::KvPools;
use crate::metrics::{Latency, Metrics};
use crate::queue::{Door, EngineHandle, Shared};
use crate::row::{Row, cancelled};
use crate::row_kv::RowKv;
use crate::speculative::{DraftModel, Speculation};
use crate::status::{
    BatchGauges, DecodeReporter, MAX_LINE_IDS, PoolGauge, PrefillFacts, prefill_line,
};
use crate::tier::Offload;
use crate::{EngineConfig, EngineError, Event, FinishReason, Usage};
use step_batch::spell_pools;
pub use verify::Verified;

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
    /// Decoding rows in this tick's step (those verifying drafts first),
    /// in batch order.
    pub decoded: Vec<RequestId>,
    /// What each row verifying drafts in this tick's step accepted.
    pub verified: Vec<Verified>,
    /// Tokens the step ran (prompt chunks, pending and draft tokens).
    pub tokens: usize,
    /// The decode status line, every `decode_log_interval` steps.
    pub decode_line: Option<String>,
}

/// The batching worker's state. The thread loop calls [`Scheduler::tick`].
pub struct Scheduler<M: BatchModel> {
    model: M,
    pools: KvPools,
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
    /// Speculative decoding, when configured and the model allows it.
    spec: Option<Speculation>,
    /// The draft model that proposes, when one was given; else n-gram.
    draft: Option<DraftModel>,
    /// The lower KV tiers, when configured and the prefix cache runs.
    offload: Option<Offload>,
}

impl<M: BatchModel> Scheduler<M> {
    /// A scheduler over `model` that reports into `metrics`, and the handle
    /// requests come in through. The pools are the model's KV cache: a config
    /// that disagrees with the model's geometry is refused.
    pub fn new(
        model: M,
        config: EngineConfig,
        metrics: Arc<Metrics>,
        now: Instant,
    ) -> Result<(Self, EngineHandle), EngineError> {
        let (model_pools, model_block_size) = (model.cache_pools(), model.block_size());
        if (&model_pools, model_block_size) != (&config.pools, config.block_size) {
            return Err(EngineError::PoolMismatch {
                model_pools: spell_pools(&model_pools),
                model_block_size,
                pools: spell_pools(&config.pools),
                block_size: config.block_size,
            });
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let line = Arc::new(LineBound::new(config.max_queue));
        if let Some(why) = config
            .prefix_cache_off_reason()
            .filter(|_| config.prefix_caching)
        {
            tracing::warn!("prefix caching is off: {why}");
        }
        let hasher = config
            .prefix_cache_on()
            .then(|| BlockHasher::new(&config.cache_salt, config.block_size));
        let spec = speculation(&config, &metrics);
        let kv_epoch = rand::random::<u64>() >> 11;
        let pools = KvPools::new(&model_pools, kv_epoch);
        let offload = tiering::open(&model, &config, kv_epoch, &metrics)?;
        let shared = Arc::new(Shared {
            tx: Mutex::new((0, Door::Generate(tx))),
            pooling: false,
            line: Arc::clone(&line),
            hasher,
            in_flight: AtomicUsize::new(0),
            cancels: Mutex::new(Vec::new()),
            draining: AtomicBool::new(false),
            alive: AtomicBool::new(true),
            epoch: now,
            tick_started: AtomicU64::new(0),
            metrics: Arc::clone(&metrics),
            config: config.clone(),
            pool: pools.full().clone(),
            tiers: offload.as_ref().map(Offload::tiers).unwrap_or_default(),
            tier_queued: offload.as_ref().map(Offload::queued).unwrap_or_default(),
        });
        let scheduler = Scheduler {
            model,
            pools,
            reporter: DecodeReporter::new(config.decode_log_interval, now)
                .speculating(spec.is_some()),
            spec,
            draft: None,
            offload,
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
        Ok((scheduler, EngineHandle { shared }))
    }

    /// Proposes draft tokens with `model` (its own cache pool, full
    /// attention, the target's vocabulary) instead of n-gram lookup.
    /// Refused where speculation is off (not asked for, or the target's
    /// pools do not allow it) and for a draft the target cannot verify.
    pub fn set_draft(&mut self, model: Box<dyn BatchModel>) -> Result<(), EngineError> {
        if self.spec.is_none() {
            let why = (self.shared.config.speculation_off_reason())
                .unwrap_or("--speculative-config was not given");
            return Err(EngineError::Config(format!(
                "a draft model was given, but speculative decoding is off: {why}"
            )));
        }
        let draft = DraftModel::new(model, self.model.vocab_size())?;
        tracing::info!(
            blocks = draft.stats().total,
            "speculative decoding by a draft model, where it pays"
        );
        self.draft = Some(draft);
        Ok(())
    }

    /// Where the draft model's pool's blocks are, if one drafts.
    pub fn draft_stats(&self) -> Option<PoolStats> {
        self.draft.as_ref().map(DraftModel::stats)
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
        if let Some(spec) = &mut self.spec {
            spec.idle();
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

    /// KV blocks reserved now, over every pool.
    pub fn blocks_used(&self) -> usize {
        self.pools.used()
    }

    /// Where the full-attention pool's blocks are now (an empty pool's
    /// figures for a model without one).
    pub fn pool_stats(&self) -> PoolStats {
        self.pools.full().stats()
    }

    /// Each pool, by kind, and where its blocks are now.
    pub fn pools_stats(&self) -> Vec<(CacheKind, PoolStats)> {
        self.pools.stats()
    }

    /// Where the blocks (or slots) of the pool of `kind` are now.
    pub fn stats_of(&self, kind: CacheKind) -> Option<PoolStats> {
        self.pools.stats_of(kind)
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
        self.shared.stamp_tick(Some(now));
        if let Some(spec) = &mut self.spec {
            spec.tick_began(now);
        }
        let mut report = TickReport::default();
        self.drain_channel();
        self.apply_cancels();
        self.flush(now);
        report.admitted = self.admit(now);
        self.finish_loads(None);
        if report.admitted.new_seqs > 0 {
            let line = prefill_line(&report.admitted, &self.gauges());
            tracing::info!("{line}");
            report.prefill_line = Some(line);
        }
        let (batch, verified) = self.step(now);
        if batch.is_empty() {
            // Only reads outstanding: wait for one rather than spin.
            self.finish_loads(Some(std::time::Duration::from_millis(20)));
        }
        report.tokens = batch.tokens();
        report.decoded = batch.decoding();
        report.prefilled = batch.chunks;
        report.verified = verified;
        if let Some(spec) = &mut self.spec {
            let prompt_tokens = report.prefilled.iter().map(|c| c.1).sum();
            spec.step_ran(now, report.tokens, prompt_tokens);
            for v in &report.verified {
                spec.record(v.accepted, v.drafted);
            }
        }
        // The draft KV past what the target accepted goes back now.
        if let Some(draft) = &mut self.draft {
            for v in &report.verified {
                if let Some(row) = self.rows.get(&v.id) {
                    draft.sync(v.id, row.history());
                }
            }
        }
        if !report.decoded.is_empty() {
            let accepted: usize = report.verified.iter().map(|v| v.accepted).sum();
            self.reporter.on_verified(report.verified.len(), accepted);
            report.decode_line =
                self.reporter
                    .on_step(now, report.decoded.len() + accepted, &self.gauges());
            if let Some(line) = &report.decode_line {
                tracing::info!("{line}");
            }
        }
        self.flush(now);
        self.publish();
        self.shared.stamp_tick(None);
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
                cached_tokens: 0,
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
        for row in self.rows.values_mut() {
            row.commit_blocks();
            if row.finish.is_none() {
                row.grow_blocks();
            }
        }
        self.offer_blocks();
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
        if let Some(draft) = &mut self.draft {
            draft.retain(|id| rows.contains_key(&id));
        }
    }

    /// Strict FIFO: a head that does not fit stops the line. Cached prompt
    /// tokens are counted here, where they are taken from the cache.
    fn admit(&mut self, now: Instant) -> PrefillFacts {
        let mut facts = PrefillFacts::default();
        let (max_seqs, max_loras) = (self.shared.config.max_seqs, self.shared.config.max_loras);
        let block_size = self.shared.config.block_size;
        let mut adapters = self.running_adapters();
        while let Ok(Admitted { job, leases }) = self.waiting.pop_admissible(
            self.rows.len(),
            max_seqs,
            AdapterCap {
                running: &adapters,
                max: max_loras,
            },
            &self.pools,
        ) {
            if let Some(a) = &job.req.adapter {
                adapters.insert(a.key().to_string());
            }
            self.metrics.observe(Latency::Queue, now - job.submitted);
            let prompt = job.req.prompt.len();
            let kv = RowKv::new(leases, block_size);
            let cached = kv.cached_blocks() * block_size;
            facts.new_seqs += 1;
            if let Some(id) =
                (job.req.request_id.as_ref()).filter(|_| facts.ids.len() < MAX_LINE_IDS)
            {
                facts.ids.push(id.clone());
            }
            facts.new_tokens += prompt - cached;
            facts.cached_tokens += cached;
            self.metrics.add_prompt_tokens(prompt);
            if self.shared.hasher.is_some() {
                self.metrics.add_prefix_cache(prompt, cached);
            }
            match Row::admit(job, kv, self.model.vocab_size(), block_size) {
                Ok(mut row) => {
                    if !self.start_load(&mut row) {
                        self.prefill_order.push_back(row.id);
                    }
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

    /// The LoRA adapters (by key) the admitted rows run with.
    fn running_adapters(&self) -> HashSet<String> {
        let adapters = self.rows.values().filter_map(|r| r.adapter.as_ref());
        adapters.map(|a| a.key().to_string()).collect()
    }

    fn gauges(&self) -> BatchGauges {
        BatchGauges {
            running: self.rows.len(),
            queued: self.shared.line.waiting(),
            tokens: self.rows.values().map(Row::kv_tokens).sum(),
            pools: self
                .pools
                .stats()
                .into_iter()
                .map(|(kind, s)| PoolGauge {
                    kind,
                    used: s.reserved,
                    total: s.total,
                })
                .collect(),
        }
    }

    fn publish(&self) {
        let g = self.gauges();
        self.metrics
            .set_gauges(g.queued, g.running, &self.pools.stats());
        let names = |a: Option<&AdapterRef>| a.map(|a| a.name().to_string());
        let running = self.rows.values().filter_map(|r| names(r.adapter.as_ref()));
        let waiting = self.waiting.adapters().filter_map(names);
        self.metrics
            .set_lora_info(running.collect(), waiting.collect());
    }
}

/// The worker's speculative decoding: `None` when not asked for, or when
/// the model's pools do not allow it (logged with the reason).
fn speculation(config: &EngineConfig, metrics: &Metrics) -> Option<Speculation> {
    let asked = config.speculative?;
    if let Some(why) = config.speculation_off_reason() {
        tracing::warn!("speculative decoding is off: {why}");
        return None;
    }
    metrics.enable_spec(asked.num_speculative_tokens as usize);
    tracing::info!(
        k = asked.num_speculative_tokens,
        lookup_min = asked.prompt_lookup_min,
        lookup_max = asked.prompt_lookup_max,
        "speculative decoding by n-gram prompt lookup, where it pays"
    );
    Some(Speculation::new(asked))
}

mod prefill_plan;
mod speculate;
mod step;
mod step_batch;
#[cfg(test)]
mod tests;
mod tiering;
mod verify;
