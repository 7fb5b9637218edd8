//! The decoder and its paged cache behind the worker's `BatchModel`
//! interface: one pool per kind of cache its layers keep (the full-attention
//! layers, each sliding window, the recurrent layers' state slots), each of
//! a fixed size; a row's tables are found by their kind.

use std::sync::Arc;

use ferrox_core::batch_model::{PrefillChunk, StepLogits, Tables, table_of};
use ferrox_core::{AdapterRef, BatchModel, DecodeRow, Pool};
use ferrox_plan::{CacheKind, KvDtype, spell_kinds};

use crate::decoder::{Decoder, Step};
use crate::error::{Error, Result};
use crate::kv_store::KvStore;
use crate::lora::{DeviceSlots, LoraAdapter, LoraStep};
use crate::seq_span::SeqSpan;
use crate::state_store::StateStore;

/// A decoder with KV pools of a fixed number of blocks.
#[derive(Debug)]
pub struct PagedModel {
    decoder: Decoder,
    kv: KvStore,
    /// Recurrent states by slot (empty without recurrent layers).
    state: StateStore,
    /// Adapters held on an accelerator (`--max-loras`); unused on CPU.
    lora_slots: DeviceSlots,
}

impl PagedModel {
    /// Wraps `decoder` with a pool of `num_blocks` blocks of `block_size`
    /// tokens for each of its attention kinds, held in `kv_dtype`, and no
    /// state slot ([`PagedModel::set_state_slots`]).
    pub fn new(
        decoder: Decoder,
        num_blocks: usize,
        block_size: usize,
        kv_dtype: KvDtype,
    ) -> Result<Self> {
        let pools: Vec<Pool> = decoder
            .cache_kinds()
            .into_iter()
            .map(|kind| Pool {
                kind,
                blocks: if kind.holds_tokens() { num_blocks } else { 0 },
            })
            .collect();
        Self::with_pools(decoder, &pools, block_size, kv_dtype)
    }

    /// Wraps `decoder` with `pools`, by kind: exactly one for each kind of
    /// cache its layers keep ([`Decoder::cache_kinds`]), blocks of
    /// `block_size` tokens held in `kv_dtype` (a state pool's are slots).
    pub fn with_pools(
        decoder: Decoder,
        pools: &[Pool],
        block_size: usize,
        kv_dtype: KvDtype,
    ) -> Result<Self> {
        let mut given: Vec<CacheKind> = pools.iter().map(|p| p.kind).collect();
        given.sort();
        if given != decoder.cache_kinds() {
            return Err(Error::Input(format!(
                "pools for {} given to a model whose pools are: {}",
                spell_kinds(&given),
                spell_kinds(&decoder.cache_kinds())
            )));
        }
        let kv = decoder.kv_store(pools, block_size, kv_dtype)?;
        let slots = pools.iter().find(|p| p.kind == CacheKind::State);
        Ok(PagedModel {
            state: decoder.state_store(slots.map_or(0, |p| p.blocks))?,
            decoder,
            kv,
            lora_slots: DeviceSlots::new(1),
        })
    }

    /// Holds `slots` recurrent states (one per running sequence; only a
    /// model with recurrent layers keeps any). Drops every state held.
    pub fn set_state_slots(&mut self, slots: usize) -> Result<()> {
        self.state = self.decoder.state_store(slots)?;
        Ok(())
    }

    /// Bytes each pool holds, by kind, as allocated: what the plan's pools
    /// must count.
    pub fn pool_bytes(&self) -> Vec<(CacheKind, u64)> {
        let state = self
            .state
            .is_used()
            .then(|| (CacheKind::State, self.state.bytes()));
        self.kv.bytes().into_iter().chain(state).collect()
    }

    /// Holds up to `n` adapters on an accelerator (`--max-loras`).
    pub fn set_max_loras(&mut self, n: usize) {
        self.lora_slots = DeviceSlots::new(n);
    }

    /// The decoder.
    pub fn decoder(&self) -> &Decoder {
        &self.decoder
    }

    /// The decoder, its pool dropped (after a profile run).
    pub fn into_decoder(self) -> Decoder {
        self.decoder
    }

    /// The decoder, mutably (to switch attention paths in tests).
    pub fn decoder_mut(&mut self) -> &mut Decoder {
        &mut self.decoder
    }

    fn run(
        &self,
        tokens: &[u32],
        spans: Vec<SeqSpan>,
        logits_for: &[usize],
        adapters: &[Option<&LoraAdapter>],
    ) -> Result<Vec<Vec<f32>>> {
        let lora = LoraStep::new(adapters.iter().zip(&spans).map(|(a, s)| (*a, s.n_tokens)));
        let lora = match lora {
            Some(l) if !self.decoder.device().is_cpu() => {
                Some(l.on_device(self.decoder.device(), &self.lora_slots)?)
            }
            other => other,
        };
        let step = Step {
            tokens,
            spans: Arc::from(spans),
            logits_for,
            lora: lora.as_ref(),
            token_types: None,
        };
        // On CPU the whole step runs on a pool worker: each kernel's parallel
        // loop is then joined by a thread that helps with it, instead of a
        // caller parked on a futex and woken per op (hundreds of ops a step
        // at one row), and the other workers stay awake until the step ends
        // (warm_pool.rs). A GPU step stays on the thread that holds its context.
        let forward = || self.decoder.forward(&self.kv, &self.state, &step);
        let logits = if self.decoder.device().is_cpu() {
            crate::warm_pool::on_warm_pool(forward)?
        } else {
            forward()?
        };
        match logits {
            Some(logits) => Ok(logits.to_vec2::<f32>()?),
            None => Ok(Vec::new()),
        }
    }

    /// Prefill chunks then decode rows, in one forward pass; `adapters`
    /// as [`BatchModel::step_with_adapters`] takes them.
    fn mixed(
        &self,
        prefill: &[PrefillChunk<'_>],
        decode: &[DecodeRow<'_>],
        adapters: &[Option<AdapterRef>],
    ) -> Result<StepLogits> {
        if prefill.iter().any(|c| c.tokens.is_empty()) {
            return Err(Error::Input("empty prefill chunk".into()));
        }
        let adapters = lora_adapters(adapters, prefill.len() + decode.len())?;
        let mut tokens = Vec::new();
        let mut spans = Vec::with_capacity(prefill.len() + decode.len());
        let mut logits_for = Vec::new();
        for c in prefill {
            let first = tokens.len();
            tokens.extend_from_slice(c.tokens);
            if c.all_logits {
                logits_for.extend(first..tokens.len());
            } else if c.want_logits {
                logits_for.push(tokens.len() - 1);
            }
            let (tables, state) = self.split_tables(c.tables, c.tokens, c.pos)?;
            spans.push(SeqSpan {
                tables,
                start_pos: c.pos,
                n_tokens: c.tokens.len(),
                state,
            });
        }
        for r in decode {
            logits_for.push(tokens.len());
            tokens.push(r.token);
            let (tables, state) = self.split_tables(r.tables, &[r.token], r.pos)?;
            spans.push(SeqSpan {
                tables,
                start_pos: r.pos,
                n_tokens: 1,
                state,
            });
        }
        if tokens.is_empty() {
            return Ok(StepLogits::default());
        }
        let rows = self.run(&tokens, spans, &logits_for, &adapters)?;
        Ok(split(prefill, rows))
    }
}

impl PagedModel {
    /// A row's tables, checked for `tokens` at `pos` and found by kind:
    /// each KV group's, owned by the step, and its state slot (a model with
    /// recurrent layers).
    fn split_tables(
        &self,
        tables: Tables<'_>,
        tokens: &[u32],
        pos: usize,
    ) -> Result<(Vec<Vec<u32>>, Option<u32>)> {
        self.check_input(tables, tokens, pos)?;
        let kv = (0..self.kv.groups())
            .map(|g| {
                table_of(tables, self.kv.kind(g))
                    .map(<[u32]>::to_vec)
                    .unwrap_or_default()
            })
            .collect();
        let slot = table_of(tables, CacheKind::State).and_then(|t| t.first().copied());
        Ok((kv, slot.filter(|_| self.state.is_used())))
    }
}

/// Each row's adapter weights (`rows` of them; none when `adapters` is
/// empty), refusing a step that names an adapter of another kind.
fn lora_adapters(
    adapters: &[Option<AdapterRef>],
    rows: usize,
) -> Result<Vec<Option<&LoraAdapter>>> {
    if adapters.is_empty() {
        return Ok(vec![None; rows]);
    }
    if adapters.len() != rows {
        return Err(Error::Input(format!(
            "{} adapters for a step of {rows} rows",
            adapters.len()
        )));
    }
    adapters
        .iter()
        .map(|a| match a {
            None => Ok(None),
            Some(a) => a.weights::<LoraAdapter>().map(Some).ok_or_else(|| {
                Error::Input(format!("adapter {:?} is not a loaded LoRA", a.name()))
            }),
        })
        .collect()
}

/// Splits logit rows (every token's for a chunk that wanted all, the last
/// one's for a chunk that wanted that, then one per decode row) back to
/// their chunks and rows.
fn split(prefill: &[PrefillChunk<'_>], rows: Vec<Vec<f32>>) -> StepLogits {
    let mut rows = rows.into_iter();
    let mut out = StepLogits::default();
    for c in prefill {
        if c.all_logits {
            let all: Vec<Vec<f32>> = rows.by_ref().take(c.tokens.len()).collect();
            out.prefill
                .push(c.want_logits.then(|| all.last().cloned()).flatten());
            out.prompt.push(all);
        } else {
            out.prefill
                .push(if c.want_logits { rows.next() } else { None });
            out.prompt.push(Vec::new());
        }
    }
    out.decode = rows.collect();
    out
}

impl BatchModel for PagedModel {
    fn vocab_size(&self) -> usize {
        self.decoder.spec().vocab
    }

    fn block_size(&self) -> usize {
        self.kv.block_size()
    }

    fn cache_pools(&self) -> Vec<Pool> {
        let slots = self.state.slots().map(|blocks| Pool {
            kind: CacheKind::State,
            blocks,
        });
        self.kv.pools().into_iter().chain(slots).collect()
    }

    fn read_block(
        &self,
        kind: CacheKind,
        block: u32,
    ) -> std::result::Result<Vec<u8>, ferrox_core::Error> {
        Ok(self.kv.read_block(kind, block as usize)?)
    }

    fn write_block(
        &mut self,
        kind: CacheKind,
        block: u32,
        bytes: &[u8],
    ) -> std::result::Result<(), ferrox_core::Error> {
        Ok(self.kv.write_block(kind, block as usize, bytes)?)
    }

    fn prefill(
        &mut self,
        tables: Tables<'_>,
        tokens: &[u32],
        pos: usize,
        want_logits: bool,
    ) -> std::result::Result<Option<Vec<f32>>, ferrox_core::Error> {
        let chunk = PrefillChunk {
            tables,
            tokens,
            pos,
            want_logits,
            all_logits: false,
        };
        Ok(self.mixed(&[chunk], &[], &[])?.prefill.pop().flatten())
    }

    fn decode(
        &mut self,
        rows: &[DecodeRow<'_>],
    ) -> std::result::Result<Vec<Vec<f32>>, ferrox_core::Error> {
        Ok(self.mixed(&[], rows, &[])?.decode)
    }

    fn step(
        &mut self,
        prefill: &[PrefillChunk<'_>],
        decode: &[DecodeRow<'_>],
    ) -> std::result::Result<StepLogits, ferrox_core::Error> {
        Ok(self.mixed(prefill, decode, &[])?)
    }

    fn step_with_adapters(
        &mut self,
        prefill: &[PrefillChunk<'_>],
        decode: &[DecodeRow<'_>],
        adapters: &[Option<AdapterRef>],
    ) -> std::result::Result<StepLogits, ferrox_core::Error> {
        Ok(self.mixed(prefill, decode, adapters)?)
    }
}
