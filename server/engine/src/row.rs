//! One admitted request: its KV lease, where its prompt is, what it generated,
//! and how it ends. Dropping a row is the one place its blocks go back.

use std::time::Instant;

use ferrox_core::{AdapterRef, BlockHash, BlockHasher};
use tokio::sync::mpsc::UnboundedSender;

use crate::EngineError;
use crate::constraint::TokenConstraint;
use crate::event::{Event, FinishReason, TokenLogprob, Usage};
use crate::job::{Job, RequestId};
use crate::metrics::{Latency, Metrics};
use crate::params::TokenText;
use crate::row_kv::RowKv;
use crate::sampler::{Sampled, Sampler, logprob_of};
use crate::speculative::{Acceptance, ROW_KEEP};
use crate::stop::{StopMatcher, StopStep};

/// How a row ended, decided during the tick and reported at flush.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Finish {
    /// Ended normally (or cancelled); `tail` is text released at the end.
    Done { reason: FinishReason, tail: String },
    /// Failed.
    Failed(EngineError),
}

/// A request that holds KV blocks: prefilling, then decoding.
pub(crate) struct Row {
    pub id: RequestId,
    /// Its leases, one per pool, held for the row's whole life; returned
    /// when the row is dropped (a window's blocks as it moves on).
    pub kv: RowKv,
    pub prompt: Vec<u32>,
    /// Prompt tokens already in the KV (from the cache or computed).
    pub cursor: usize,
    /// Prompt tokens the prefix cache held at admission.
    cached: usize,
    /// The last sampled token, not yet fed to the model (decoding rows).
    pub pending: Option<u32>,
    pub generated: usize,
    /// Every sampled token, in order.
    output: Vec<u32>,
    /// Chain hashes of the sequence's full blocks known so far: the
    /// prompt's from submission, then each block as it fills.
    hashes: Vec<BlockHash>,
    /// Extends `hashes` as blocks fill; `None` with the cache off.
    hasher: Option<BlockHasher>,
    block_size: usize,
    pub max_tokens: usize,
    sampler: Sampler,
    /// Alternatives per prompt token and the entries so far, for a request
    /// that asked for its prompt's logprobs; sent once the prompt is in.
    prompt_logprobs: Option<(usize, Vec<Option<TokenLogprob>>)>,
    stop: StopMatcher,
    text: Box<dyn TokenText>,
    /// What the output must match, if anything.
    constraint: Option<Box<dyn TokenConstraint>>,
    stop_token_ids: Vec<u32>,
    eos_token_ids: Vec<u32>,
    /// Tokens before which no end counts (`min_tokens`).
    min_tokens: usize,
    /// `allowed_token_ids` as a vocabulary-wide flag row, if given.
    allowed: Option<Vec<bool>>,
    /// `bad_words`, tokenized.
    bad_words: Vec<Vec<u32>>,
    pub events: UnboundedSender<Event>,
    /// The LoRA adapter every step of this row runs with.
    pub adapter: Option<AdapterRef>,
    /// Whether it may verify draft tokens (the request did not opt out).
    speculates: bool,
    /// How often its draft tokens were accepted.
    pub acceptance: Acceptance,
    /// Where its last n-gram draft was read from: the end of the occurrence
    /// and the history's length then, so the next lookup follows the copy.
    pub copying: Option<(usize, usize)>,
    submitted: Instant,
    last_token_at: Option<Instant>,
    pub finish: Option<Finish>,
    /// Waiting for blocks a lower KV tier is reading back; not prefilling yet.
    pub loading: bool,
    /// Leading full blocks already offered to the lower tiers.
    pub offered: usize,
}

impl Row {
    /// Turns an admitted job into a row whose prompt is in the KV as far as
    /// the lease's cached blocks reach, or refuses a prompt this model cannot
    /// take (a token outside its vocabulary). On refusal the leases are
    /// dropped with the returned error's caller.
    pub fn admit(
        job: Job,
        kv: RowKv,
        vocab_size: usize,
        block_size: usize,
    ) -> Result<Row, (UnboundedSender<Event>, EngineError)> {
        let mut req = job.req;
        if let Some(&bad) = req.prompt.iter().find(|&&t| t as usize >= vocab_size) {
            let e = EngineError::invalid(
                "prompt",
                format!("token id {bad} is outside the vocabulary (size {vocab_size})"),
            );
            return Err((job.events, e));
        }
        let s = &req.sampling;
        let named: [(&str, Vec<u32>); 3] = [
            ("logit_bias", s.logit_bias.iter().map(|b| b.0).collect()),
            (
                "allowed_token_ids",
                s.allowed_token_ids.clone().unwrap_or_default(),
            ),
            ("bad_words", s.bad_words.iter().flatten().copied().collect()),
        ];
        for (param, ids) in named {
            if let Some(bad) = ids.into_iter().find(|&t| t as usize >= vocab_size) {
                let e = EngineError::invalid(
                    param,
                    format!("token id {bad} is outside the vocabulary (size {vocab_size})"),
                );
                return Err((job.events, e));
            }
        }
        let allowed = req.sampling.allowed_token_ids.take().map(|ids| {
            let mut row = vec![false; vocab_size];
            for id in ids {
                row[id as usize] = true;
            }
            row
        });
        let bad_words = std::mem::take(&mut req.sampling.bad_words);
        let speculates = !req.sampling.disable_spec_decode;
        let eos = if req.ignore_eos {
            Vec::new()
        } else {
            req.eos_token_ids
        };
        Ok(Row {
            id: job.id,
            cursor: kv.cached_blocks() * block_size,
            cached: kv.cached_blocks() * block_size,
            kv,
            prompt_logprobs: req
                .sampling
                .prompt_logprobs
                .map(|k| (k, Vec::with_capacity(req.prompt.len()))),
            sampler: Sampler::new(req.sampling, &req.prompt),
            prompt: req.prompt,
            pending: None,
            generated: 0,
            output: Vec::new(),
            adapter: req.adapter.take(),
            speculates,
            acceptance: Acceptance::new(ROW_KEEP),
            copying: None,
            hashes: job.hashes,
            hasher: job.hasher,
            block_size,
            max_tokens: req.max_tokens,
            stop: StopMatcher::new(&req.stop, req.include_stop_str),
            min_tokens: req.min_tokens,
            allowed,
            bad_words,
            text: req.text,
            constraint: req.constraint,
            stop_token_ids: req.stop_token_ids,
            eos_token_ids: eos,
            events: job.events,
            submitted: job.submitted,
            last_token_at: None,
            finish: None,
            loading: false,
            offered: 0,
        })
    }

    /// Chain hashes of the full blocks known so far.
    pub fn hashes(&self) -> &[BlockHash] {
        &self.hashes
    }

    /// Leading prompt blocks that may come from a cache (as admission
    /// counts them).
    pub fn cacheable_blocks(&self) -> usize {
        let all_logits = self.prompt_logprobs.is_some();
        crate::admission::cacheable_blocks(self.prompt.len(), all_logits, self.block_size)
    }

    /// Full blocks the KV holds under a known hash (committed).
    pub fn full_blocks(&self) -> usize {
        (self.kv_tokens() / self.block_size).min(self.hashes.len())
    }

    /// Takes `blocks` more leading prompt blocks as in the KV, read back
    /// from a lower tier: they count as cached, not computed.
    pub fn took_loaded(&mut self, blocks: usize) {
        let tokens = blocks * self.block_size;
        self.cursor += tokens;
        self.cached += tokens;
    }

    /// True when every prompt token's logits are wanted.
    pub fn wants_prompt_logits(&self) -> bool {
        self.prompt_logprobs.is_some()
    }

    /// Records the logprobs of the prompt tokens that follow the chunk
    /// starting at `start`, given the logits after each of its tokens; once
    /// the prompt is in, sends them (the first token gets `None`).
    pub fn take_prompt_logits(&mut self, start: usize, rows: &[Vec<f32>]) {
        let Some((k, entries)) = self.prompt_logprobs.as_mut() else {
            return;
        };
        if entries.is_empty() {
            entries.push(None);
        }
        for (i, logits) in rows.iter().enumerate() {
            // The logits after token p predict token p + 1.
            if let Some(&next) = self.prompt.get(start + i + 1) {
                entries.push(Some(logprob_of(logits, next, *k)));
            }
        }
        if entries.len() == self.prompt.len() {
            let entries = std::mem::take(entries);
            self.prompt_logprobs = None;
            if self.events.send(Event::PromptLogprobs(entries)).is_err() {
                self.end(cancelled());
            }
        }
    }

    /// True while prompt tokens remain to be prefilled.
    pub fn is_prefilling(&self) -> bool {
        self.cursor < self.prompt.len()
    }

    /// Tokens this row has in the KV cache.
    pub fn kv_tokens(&self) -> usize {
        self.cursor
            + self
                .generated
                .saturating_sub(usize::from(self.pending.is_some()))
    }

    /// Token `i` of the sequence: prompt, then output.
    fn token(&self, i: usize) -> u32 {
        match i.checked_sub(self.prompt.len()) {
            None => self.prompt[i],
            Some(j) => self.output[j],
        }
    }

    /// Tells the lease what the KV now holds: every block written to, and
    /// (with the cache on) every full block under its chain hash, so it is
    /// shared from the next admission on and stays cached after the row.
    pub fn commit_blocks(&mut self) {
        let in_kv = self.kv_tokens();
        let full = if let Some(h) = &self.hasher {
            let mut hashes = std::mem::take(&mut self.hashes);
            h.extend(&mut hashes, |i| self.token(i), in_kv);
            self.hashes = hashes;
            (in_kv / self.block_size).min(self.hashes.len())
        } else {
            0
        };
        self.kv
            .commit(in_kv.div_ceil(self.block_size), &self.hashes[..full]);
    }

    /// Draws from the full-attention leases' reservations the block the next
    /// token goes into, if it starts one; a row past its reservation fails.
    pub fn grow_blocks(&mut self) {
        if let Err(e) = self.kv.grow(self.prompt.len() + self.generated) {
            self.end(Finish::Failed(EngineError::Model(e.to_string())));
        }
    }

    /// The position the pending token is fed at.
    pub fn decode_pos(&self) -> usize {
        self.prompt.len() + self.generated - 1
    }

    /// The sequence so far: the prompt, then the output (whose last token
    /// is the pending one).
    pub fn history(&self) -> (&[u32], &[u32]) {
        (&self.prompt, &self.output)
    }

    /// Draft tokens a step may verify for this row: none if it opted out,
    /// else as many as leave room for the model's own next token within
    /// `max_tokens` (so its blocks are always inside its reservation).
    pub fn draft_room(&self) -> usize {
        if !self.speculates {
            return 0;
        }
        self.max_tokens.saturating_sub(self.generated + 1)
    }

    /// Gives back the blocks a verification drew past the row's place now:
    /// its tokens in the KV and the pending one's position. What rejected
    /// draft tokens wrote inside the blocks kept is overwritten later and
    /// never read before (attention reads only positions before a token's).
    pub fn release_rejected(&mut self) {
        self.kv.truncate(self.prompt.len() + self.generated);
    }

    /// Usage so far.
    pub fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt.len(),
            completion_tokens: self.generated,
            cached_tokens: self.cached,
        }
    }

    /// Marks the row ended, unless it already is.
    pub fn end(&mut self, finish: Finish) {
        if self.finish.is_none() {
            self.finish = Some(finish);
        }
    }

    /// Cuts `drafts` (tokens after the pending one) to the prefix the
    /// row's grammar allows; without a grammar, all of them.
    pub fn grammar_cut(&mut self, drafts: &mut Vec<u32>) {
        if let Some(c) = self.constraint.as_mut() {
            let allowed = c.allowed_prefix(drafts);
            drafts.truncate(allowed);
        }
    }

    /// Samples from `logits` and applies the token: text, stops, length.
    pub fn take_logits(&mut self, logits: &[f32], now: Instant, metrics: &Metrics) {
        let masked = self.token_masks(logits);
        let Some(constraint) = self.constraint.as_mut() else {
            let sampled = match &masked {
                Some(masked) => self.sampler.sample_masked(logits, masked),
                None => self.sampler.sample(logits),
            };
            self.accept(sampled, now, metrics);
            return;
        };
        let mut masked = masked.unwrap_or_else(|| logits.to_vec());
        let sampled = constraint
            .mask(&mut masked)
            .map(|()| self.sampler.sample_masked(logits, &masked))
            .and_then(|s| constraint.advance(s.id).map(|()| s));
        match sampled {
            Ok(s) => self.accept(s, now, metrics),
            Err(e) => {
                let why = format!("structured output: {e}");
                return self.end(Finish::Failed(EngineError::Model(why)));
            }
        }
        // The grammar is complete: the row ends as if on a stop.
        if self.constraint.as_ref().is_some_and(|c| c.is_finished()) {
            let tail = self.stop.finish();
            self.end(Finish::Done {
                reason: FinishReason::Stop,
                tail,
            });
        }
    }

    /// `logits` with the request's own token masks (the end tokens before
    /// `min_tokens`, `allowed_token_ids`, `bad_words`) at negative
    /// infinity; `None`, and no copy, when none applies this step. A
    /// grammar's mask goes on top; `logit_bias` is added by the sampler.
    fn token_masks(&self, logits: &[f32]) -> Option<Vec<f32>> {
        let early = self.generated < self.min_tokens;
        if !early && self.allowed.is_none() && self.bad_words.is_empty() {
            return None;
        }
        let mut masked = logits.to_vec();
        if early {
            mask_ids(&mut masked, &self.eos_token_ids, &self.stop_token_ids);
        }
        if let Some(allowed) = &self.allowed {
            for (l, &ok) in masked.iter_mut().zip(allowed) {
                if !ok {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        for word in &self.bad_words {
            if let Some((&last, before)) = word.split_last()
                && self.output.ends_with(before)
            {
                mask_ids(&mut masked, &[last], &[]);
            }
        }
        Some(masked)
    }

    fn accept(&mut self, sampled: Sampled, now: Instant, metrics: &Metrics) {
        let id = sampled.id;
        self.generated += 1;
        self.pending = Some(id);
        self.output.push(id);
        metrics.add_generation_tokens(1);
        match self.last_token_at {
            None => metrics.observe(Latency::TimeToFirstToken, now - self.submitted),
            Some(t) => metrics.observe(Latency::InterToken, now - t),
        }
        self.last_token_at = Some(now);
        // An end token is not text: it ends the output and releases whatever
        // was held back, since that turned out not to be a stop.
        if self.eos_token_ids.contains(&id) || self.stop_token_ids.contains(&id) {
            let tail = self.stop.finish();
            self.end(Finish::Done {
                reason: FinishReason::Stop,
                tail,
            });
            return;
        }
        let piece = self.text.push(id);
        // Before `min_tokens` a stop string is text like any other.
        let step = if self.generated < self.min_tokens {
            StopStep::Emit(self.stop.push_unmatched(&piece))
        } else {
            self.stop.push(&piece)
        };
        let (text, matched) = match step {
            StopStep::Emit(t) => (t, false),
            StopStep::Matched(t) => (t, true),
        };
        let event = Event::Token {
            id,
            text,
            logprob: sampled.logprob,
        };
        if self.events.send(event).is_err() {
            self.end(cancelled());
        } else if matched {
            self.end(Finish::Done {
                reason: FinishReason::Stop,
                tail: String::new(),
            });
        } else if self.generated >= self.max_tokens {
            let tail = self.stop.finish();
            self.end(Finish::Done {
                reason: FinishReason::Length,
                tail,
            });
        }
    }

    /// Sends the last event and records the end; the caller then drops the
    /// row, which returns its blocks.
    pub fn report_end(&mut self, now: Instant, metrics: &Metrics) {
        let usage = self.usage();
        let event = match self.finish.take().unwrap_or_else(cancelled) {
            Finish::Done { reason, tail } => {
                metrics.finished(reason.as_str());
                Event::Done {
                    reason,
                    text: tail,
                    usage,
                }
            }
            Finish::Failed(e) => {
                metrics.finished("error");
                Event::Error(e)
            }
        };
        metrics.observe(Latency::EndToEnd, now - self.submitted);
        let _ = self.events.send(event);
    }
}

/// The finish of a request whose caller went away.
/// Sets the end tokens' logits to negative infinity (before `min_tokens`).
fn mask_ids(logits: &mut [f32], eos: &[u32], stops: &[u32]) {
    for &id in eos.iter().chain(stops) {
        if let Some(l) = logits.get_mut(id as usize) {
            *l = f32::NEG_INFINITY;
        }
    }
}

pub(crate) fn cancelled() -> Finish {
    Finish::Done {
        reason: FinishReason::Cancelled,
        tail: String::new(),
    }
}
