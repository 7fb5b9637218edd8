//! Test builders: a deterministic fake model, a fake detokenizer, requests.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ferrox_core::batch_model::{PrefillChunk, StepLogits, Tables, table_of};
use ferrox_core::{BatchModel, DecodeRow, Error, Pool, RELEASED};
use ferrox_plan::CacheKind;

use crate::admission::check_fits;
use crate::job::{Job, RequestId};
use crate::{
    EngineConfig, Event, FinishReason, GenerationRequest, SamplingParams, TokenConstraint,
    TokenLogprob, TokenText, Usage,
};

/// Vocabulary of the fake model.
pub const VOCAB: usize = 32;
/// The fake model's end token.
pub const EOS: u32 = 0;

/// A call the fake model saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// One prefill chunk: first block of the sequence, tokens, position.
    Prefill { seq: u32, len: usize, pos: usize },
    /// One decode step over this many rows.
    Decode { rows: usize },
    /// One mixed step: its prefill chunks, then this many decode rows.
    Step { prefill: Vec<Chunk>, decode: usize },
}

/// One run's read of the KV: the position its chunk (or row) started at,
/// and its whole context.
pub type Read = (usize, Vec<u32>);

/// A prefill chunk in a mixed step: first block of the sequence, tokens,
/// position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub seq: u32,
    pub len: usize,
    pub pos: usize,
}

/// A model whose next token is always `(last + 1) % VOCAB`, over a paged "KV"
/// that stores token ids in block slots, one store per pool, each table found
/// by its kind: it fails on a position whose earlier slots in the block table
/// hold nothing, or past the blocks given, and logs every context it attended
/// to (the tokens of positions `0..=last`, in its first attention pool). A
/// window pool's layers read only their window (positions `last - window +
/// 1..=last`): a released block there is an error, and what they read must
/// be what the first pool holds. A state pool's slot must hold the tokens
/// before a row's position, or the row starts at 0.
pub struct FakeModel {
    pub block_size: usize,
    /// Logit of the predicted token; the others are 0.
    pub peak: f32,
    /// Slots by (pool, block).
    kv: HashMap<(CacheKind, u32), Vec<Option<u32>>>,
    pub calls: Arc<Mutex<Vec<Call>>>,
    /// Each run's whole context, in order.
    pub contexts: Arc<Mutex<Vec<Vec<u32>>>>,
    /// Each run's context with the position its chunk (or row) started
    /// at: what it read of the KV is the context before that position.
    pub reads: Arc<Mutex<Vec<Read>>>,
    /// Every step with decode rows fails.
    pub fail_decode: bool,
    /// The next this many steps fail.
    pub fail_next: usize,
    /// The next this many steps panic.
    pub panic_next: usize,
    /// A token this model cannot run: its input check refuses the row, and a
    /// step that carries it fails whole.
    pub poison: Option<u32>,
    /// Each step sleeps this long first.
    pub stall: std::time::Duration,
    /// Called in each mixed step, before it runs (a client going away in
    /// the middle of a step).
    pub during_step: Option<Box<dyn FnMut() + Send>>,
    /// Once set, the next tick panics outside the step (the worker dies).
    pub die: Arc<AtomicBool>,
    /// The pools it claims to hold, by kind (the engine's must match).
    pub pools: Vec<Pool>,
    /// Per state slot: the tokens its "state" has folded in; a row must
    /// resume there or at 0.
    slot_at: HashMap<u32, usize>,
}

impl FakeModel {
    /// A model of `block_size`-token blocks, as many as [`config`]'s pool.
    pub fn new(block_size: usize) -> Self {
        FakeModel {
            block_size,
            pools: config().pools,
            slot_at: HashMap::new(),
            peak: 100.0,
            kv: HashMap::new(),
            calls: Arc::new(Mutex::new(Vec::new())),
            contexts: Arc::new(Mutex::new(Vec::new())),
            reads: Arc::new(Mutex::new(Vec::new())),
            fail_decode: false,
            fail_next: 0,
            panic_next: 0,
            poison: None,
            stall: std::time::Duration::ZERO,
            during_step: None,
            die: Arc::new(AtomicBool::new(false)),
        }
    }

    fn slot(
        &mut self,
        pool: CacheKind,
        blocks: &[u32],
        pos: usize,
    ) -> Result<&mut Option<u32>, Error> {
        let bs = self.block_size;
        let size = self
            .pools
            .iter()
            .find(|p| p.kind == pool)
            .map_or(0, |p| p.blocks);
        let block = *blocks
            .get(pos / bs)
            .ok_or_else(|| Error::Forward(format!("position {pos} past the sequence's blocks")))?;
        if block == RELEASED {
            return Err(Error::Forward(format!(
                "position {pos} of pool {pool} is in a released block"
            )));
        }
        if block as usize >= size {
            return Err(Error::Forward(format!(
                "block {block} outside pool {pool} of {size}"
            )));
        }
        let slots = self
            .kv
            .entry((pool, block))
            .or_insert_with(|| vec![None; bs]);
        Ok(&mut slots[pos % bs])
    }

    /// What pool `pool`'s layers see of the sequence for `tokens` at `pos`,
    /// after writing them: from the window's start (or 0) to the last token.
    fn see(
        &mut self,
        pool: CacheKind,
        blocks: &[u32],
        tokens: &[u32],
        pos: usize,
    ) -> Result<Vec<u32>, Error> {
        let from = match pool.window() {
            Some(w) => (pos + 1).saturating_sub(w as usize),
            None => 0,
        };
        let mut seen = Vec::with_capacity(pos - from + tokens.len());
        for p in from..pos {
            let t = self.slot(pool, blocks, p)?.ok_or_else(|| {
                Error::Forward(format!("pos {pos} but pool {pool} has nothing at {p}"))
            })?;
            seen.push(t);
        }
        for (i, &t) in tokens.iter().enumerate() {
            *self.slot(pool, blocks, pos + i)? = Some(t);
            seen.push(t);
        }
        Ok(seen)
    }

    /// A recurrent model's row: its slot (its state table) must hold the
    /// tokens before `pos`, or the row starts at 0; then it holds these too.
    fn state(&mut self, tables: Tables<'_>, n: usize, pos: usize) -> Result<(), Error> {
        if !self.pools.iter().any(|p| p.kind == CacheKind::State) {
            return Ok(());
        }
        let Some(&[slot]) = table_of(tables, CacheKind::State) else {
            return Err(Error::Forward("a row with no state slot".into()));
        };
        let at = self.slot_at.entry(slot).or_insert(0);
        if pos != 0 && *at != pos {
            return Err(Error::Forward(format!(
                "state slot {slot} holds {at} tokens, the row resumes at {pos}"
            )));
        }
        *at = pos + n;
        Ok(())
    }

    fn run(&mut self, tables: Tables<'_>, tokens: &[u32], pos: usize) -> Result<Vec<f32>, Error> {
        self.run_from(tables, tokens, pos, pos)
    }

    /// [`FakeModel::run`] for a run inside a chunk that started at `start`.
    fn run_from(
        &mut self,
        tables: Tables<'_>,
        tokens: &[u32],
        pos: usize,
        start: usize,
    ) -> Result<Vec<f32>, Error> {
        if self.poison.is_some_and(|p| tokens.contains(&p)) {
            return Err(Error::Forward("poisoned input".into()));
        }
        self.state(tables, tokens.len(), pos)?;
        let mut attention = Vec::new();
        for pool in self.pools.iter().filter(|p| p.kind.holds_tokens()) {
            let blocks = table_of(tables, pool.kind)
                .ok_or_else(|| Error::Forward(format!("no table for the {} pool", pool.kind)))?;
            attention.push((pool.kind, blocks));
        }
        let (&(first, blocks), rest) = attention.split_first().ok_or(Error::Forward(
            "the fake model needs an attention pool".into(),
        ))?;
        let context = self.see(first, blocks, tokens, pos)?;
        for &(pool, blocks) in rest {
            let seen = self.see(pool, blocks, tokens, pos)?;
            if !context.ends_with(&seen) {
                return Err(Error::Forward(format!(
                    "pool {pool} holds {seen:?}, the first pool {context:?}"
                )));
            }
        }
        let last = *context.last().ok_or(Error::Forward("no tokens".into()))?;
        self.reads.lock().unwrap().push((start, context.clone()));
        self.contexts.lock().unwrap().push(context);
        let mut logits = vec![0.0; VOCAB];
        logits[(last as usize + 1) % VOCAB] = self.peak;
        Ok(logits)
    }
}

impl BatchModel for FakeModel {
    /// A block's slots, 4 bytes each (`u32::MAX`: nothing).
    fn read_block(&self, kind: CacheKind, block: u32) -> Result<Vec<u8>, Error> {
        let slots = self.kv.get(&(kind, block));
        let slot = |i: usize| slots.and_then(|s| s[i]).unwrap_or(u32::MAX);
        Ok((0..self.block_size)
            .flat_map(|i| slot(i).to_le_bytes())
            .collect())
    }

    fn write_block(&mut self, kind: CacheKind, block: u32, bytes: &[u8]) -> Result<(), Error> {
        if bytes.len() != 4 * self.block_size {
            return Err(Error::Forward(format!("a block of {} bytes", bytes.len())));
        }
        let slots = bytes
            .chunks_exact(4)
            .map(|c| Some(u32::from_le_bytes([c[0], c[1], c[2], c[3]])).filter(|&t| t != u32::MAX))
            .collect();
        self.kv.insert((kind, block), slots);
        Ok(())
    }

    fn vocab_size(&self) -> usize {
        // The worker asks after every step, outside the step's own guard.
        assert!(!self.die.load(Ordering::SeqCst), "injected worker death");
        VOCAB
    }

    fn block_size(&self) -> usize {
        self.block_size
    }

    fn cache_pools(&self) -> Vec<Pool> {
        self.pools.clone()
    }

    fn check_input(&self, tables: Tables<'_>, tokens: &[u32], pos: usize) -> Result<(), Error> {
        if self.poison.is_some_and(|p| tokens.contains(&p)) {
            return Err(Error::Forward(
                "this model cannot run the poison token".into(),
            ));
        }
        let pools = &self.pools;
        ferrox_core::batch_model::check_input(VOCAB, self.block_size, pools, tables, tokens, pos)
    }

    fn prefill(
        &mut self,
        tables: Tables<'_>,
        tokens: &[u32],
        pos: usize,
        want_logits: bool,
    ) -> Result<Option<Vec<f32>>, Error> {
        self.calls.lock().unwrap().push(Call::Prefill {
            seq: first_block(tables),
            len: tokens.len(),
            pos,
        });
        let logits = self.run(tables, tokens, pos)?;
        Ok(want_logits.then_some(logits))
    }

    fn decode(&mut self, rows: &[DecodeRow<'_>]) -> Result<Vec<Vec<f32>>, Error> {
        self.calls
            .lock()
            .unwrap()
            .push(Call::Decode { rows: rows.len() });
        if self.fail_decode {
            return Err(Error::Forward("injected".into()));
        }
        rows.iter()
            .map(|r| self.run(r.tables, &[r.token], r.pos))
            .collect()
    }

    /// Records the whole step as one call; fails it if `fail_decode` and it
    /// has decode rows.
    fn step(
        &mut self,
        prefill: &[PrefillChunk<'_>],
        decode: &[DecodeRow<'_>],
    ) -> Result<StepLogits, Error> {
        let chunks = prefill.iter().map(|c| Chunk {
            seq: first_block(c.tables),
            len: c.tokens.len(),
            pos: c.pos,
        });
        self.calls.lock().unwrap().push(Call::Step {
            prefill: chunks.collect(),
            decode: decode.len(),
        });
        std::thread::sleep(self.stall);
        if let Some(hook) = &mut self.during_step {
            hook();
        }
        if self.fail_decode && !decode.is_empty() {
            return Err(Error::Forward("injected".into()));
        }
        if self.fail_next > 0 {
            self.fail_next -= 1;
            return Err(Error::Forward("injected once".into()));
        }
        if self.panic_next > 0 {
            self.panic_next -= 1;
            panic!("injected panic");
        }
        let mut out = StepLogits::default();
        for c in prefill {
            let mut all = Vec::new();
            if c.all_logits {
                for (i, t) in c.tokens.iter().enumerate() {
                    let one = std::slice::from_ref(t);
                    all.push(self.run_from(c.tables, one, c.pos + i, c.pos)?);
                }
            }
            let logits = match all.last() {
                Some(last) => last.clone(),
                None => self.run(c.tables, c.tokens, c.pos)?,
            };
            out.prefill.push(c.want_logits.then_some(logits));
            out.prompt.push(all);
        }
        out.decode = decode
            .iter()
            .map(|r| self.run(r.tables, &[r.token], r.pos))
            .collect::<Result<_, Error>>()?;
        Ok(out)
    }
}

/// The first block of a sequence's first table: which sequence a call is for.
fn first_block(tables: Tables<'_>) -> u32 {
    let attention = tables.iter().find(|t| t.kind.holds_tokens());
    attention
        .and_then(|t| t.blocks.first())
        .copied()
        .unwrap_or(u32::MAX)
}

/// Token `i` reads as the letter `'a' + i % 26`.
pub struct Letters;

impl TokenText for Letters {
    fn push(&mut self, id: u32) -> String {
        char::from(b'a' + (id % 26) as u8).to_string()
    }

    fn fresh(&self) -> Box<dyn TokenText> {
        Box::new(Letters)
    }
}

/// The letters of `ids`.
pub fn letters(ids: impl IntoIterator<Item = u32>) -> String {
    ids.into_iter().map(|i| Letters.push(i)).collect()
}

/// A small engine: blocks of 4 tokens, 32 blocks, 4 rows, chunks of 4, the
/// prefix cache on.
pub fn config() -> EngineConfig {
    EngineConfig {
        max_seqs: 4,
        max_queue: 8,
        prefill_chunk: 4,
        max_model_len: 64,
        block_size: 4,
        pools: pools(&[(CacheKind::Full, 32)]),
        decode_log_interval: 1,
        prefix_caching: true,
        cache_salt: "fake".into(),
        max_loras: 2,
        speculative: None,
        max_batch_tokens: 16384,
        kv_offload: Vec::new(),
    }
}

/// Waits until `done` holds (another thread's work), for at most 10 s.
pub fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !done() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "{what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Pools of these kinds and sizes.
pub fn pools(sizes: &[(CacheKind, usize)]) -> Vec<Pool> {
    let pool = |&(kind, blocks): &(CacheKind, usize)| Pool { kind, blocks };
    sizes.iter().map(pool).collect()
}

/// A config's pools, read and set by kind.
pub trait ConfigPools {
    /// Blocks of the full-attention pool (0 without one).
    fn kv_blocks(&self) -> usize;
    /// Sets the pool of `kind` to `blocks` (adding it, in kind order).
    fn set_pool(&mut self, kind: CacheKind, blocks: usize);
}

impl ConfigPools for EngineConfig {
    fn kv_blocks(&self) -> usize {
        self.pool(CacheKind::Full).map_or(0, |p| p.blocks)
    }

    fn set_pool(&mut self, kind: CacheKind, blocks: usize) {
        self.pools.retain(|p| p.kind != kind);
        self.pools.push(Pool { kind, blocks });
        self.pools.sort_by_key(|p| p.kind);
    }
}

/// `req` as the door would queue it under `config` (no hashes; its events
/// go nowhere).
pub fn job(id: RequestId, req: GenerationRequest, config: &EngineConfig) -> Job {
    let blocks = check_fits(req.prompt.len(), req.max_tokens, config).expect("fits");
    Job {
        id,
        req,
        blocks,
        hashes: Vec::new(),
        hasher: None,
        submitted: Instant::now(),
        events: tokio::sync::mpsc::unbounded_channel().0,
    }
}

/// A greedy request with the model's end set `[EOS]`.
pub fn request(prompt: &[u32], max_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        prompt: prompt.to_vec(),
        max_tokens,
        sampling: SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        stop: Vec::new(),
        include_stop_str: false,
        min_tokens: 0,
        cache_salt: None,
        request_id: None,
        stop_token_ids: Vec::new(),
        eos_token_ids: vec![EOS],
        ignore_eos: false,
        text: Box::new(Letters),
        constraint: None,
        adapter: None,
    }
}

/// Everything a request received, gathered.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Outcome {
    pub ids: Vec<u32>,
    pub text: String,
    pub end: Option<(FinishReason, Usage)>,
    pub error: Option<String>,
    pub prompt_logprobs: Option<Vec<Option<TokenLogprob>>>,
}

impl Outcome {
    /// Folds events into the outcome.
    pub fn absorb(&mut self, events: impl IntoIterator<Item = Event>) {
        for e in events {
            match e {
                Event::Token { id, text, .. } => {
                    self.ids.push(id);
                    self.text.push_str(&text);
                }
                Event::Done {
                    reason,
                    text,
                    usage,
                } => {
                    self.text.push_str(&text);
                    self.end = Some((reason, usage));
                }
                Event::Error(e) => self.error = Some(e.to_string()),
                Event::Vectors { .. } => panic!("a generation answered with vectors"),
                Event::PromptLogprobs(lp) => {
                    assert!(self.ids.is_empty(), "prompt logprobs after a token");
                    assert!(self.prompt_logprobs.replace(lp).is_none(), "sent twice");
                }
            }
        }
    }
}

/// A constraint that allows, at step `i`, only the ids of `steps[i]`, and
/// is complete after the last step; it can be made to break at a step.
#[derive(Debug, Clone)]
pub struct AllowSteps {
    steps: Vec<Vec<u32>>,
    at: usize,
    fail_mask_at: Option<usize>,
    fail_advance_at: Option<usize>,
}

impl AllowSteps {
    pub fn new(steps: Vec<Vec<u32>>) -> Self {
        AllowSteps {
            steps,
            at: 0,
            fail_mask_at: None,
            fail_advance_at: None,
        }
    }

    /// Allows anything, but its mask fails at step `i`.
    pub fn failing_mask_at(i: usize) -> Self {
        let mut c = AllowSteps::new(vec![(1..VOCAB as u32).collect(); 8]);
        c.fail_mask_at = Some(i);
        c
    }

    /// Allows anything, but advancing fails at step `i`.
    pub fn failing_advance_at(i: usize) -> Self {
        let mut c = AllowSteps::new(vec![(1..VOCAB as u32).collect(); 8]);
        c.fail_advance_at = Some(i);
        c
    }
}

impl TokenConstraint for AllowSteps {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        if self.fail_mask_at == Some(self.at) {
            return Err("mask broke".into());
        }
        let allowed = self.steps.get(self.at).ok_or("past the end")?;
        for (id, l) in logits.iter_mut().enumerate() {
            if !allowed.contains(&(id as u32)) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    fn advance(&mut self, id: u32) -> Result<(), String> {
        let allowed = self.steps.get(self.at).ok_or("past the end")?;
        if self.fail_advance_at == Some(self.at) || !allowed.contains(&id) {
            return Err(format!("{id} was not allowed"));
        }
        self.at += 1;
        Ok(())
    }

    fn allowed_prefix(&mut self, tokens: &[u32]) -> usize {
        let steps = self.steps.iter().skip(self.at);
        tokens
            .iter()
            .zip(steps)
            .take_while(|(t, allowed)| allowed.contains(t))
            .count()
    }

    fn is_finished(&self) -> bool {
        self.at >= self.steps.len()
    }

    fn fork(&self) -> Box<dyn TokenConstraint> {
        Box::new(self.clone())
    }
}
