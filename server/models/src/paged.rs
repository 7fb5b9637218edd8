//! The decoder and its paged KV cache behind the worker's `BatchModel` interface.

use std::sync::Arc;

use ferrox_core::{BatchModel, DecodeRow};

use crate::attention::SeqSpan;
use crate::error::{Error, Result};
use crate::kv_cache::KvCache;
use crate::llama::{Llama, Step};

/// A decoder with a KV pool of a fixed number of blocks.
#[derive(Debug)]
pub struct PagedModel {
    llama: Llama,
    cache: KvCache,
}

impl PagedModel {
    /// Wraps `llama` with a pool of `num_blocks` blocks of `block_size` tokens.
    pub fn new(llama: Llama, num_blocks: usize, block_size: usize) -> Result<Self> {
        let cache = llama.kv_cache(num_blocks, block_size)?;
        Ok(PagedModel { llama, cache })
    }

    /// The decoder.
    pub fn llama(&self) -> &Llama {
        &self.llama
    }

    /// The decoder, mutably (to switch attention paths in tests).
    pub fn llama_mut(&mut self) -> &mut Llama {
        &mut self.llama
    }

    /// Blocks in the pool.
    pub fn num_blocks(&self) -> usize {
        self.cache.num_blocks()
    }

    fn run(
        &self,
        tokens: &[u32],
        spans: Vec<SeqSpan>,
        logits_for: &[usize],
    ) -> Result<Vec<Vec<f32>>> {
        let step = Step {
            tokens,
            spans: Arc::from(spans),
            logits_for,
        };
        match self.llama.forward(&self.cache, &step)? {
            Some(logits) => Ok(logits.to_vec2::<f32>()?),
            None => Ok(Vec::new()),
        }
    }

    fn prefill_chunk(
        &self,
        blocks: &[u32],
        tokens: &[u32],
        pos: usize,
        want: bool,
    ) -> Result<Option<Vec<f32>>> {
        if tokens.is_empty() {
            return Err(Error::Input("empty prefill chunk".into()));
        }
        let span = SeqSpan {
            blocks: blocks.to_vec(),
            start_pos: pos,
            n_tokens: tokens.len(),
        };
        let last = [tokens.len() - 1];
        let logits_for: &[usize] = if want { &last } else { &[] };
        Ok(self.run(tokens, vec![span], logits_for)?.pop())
    }

    fn decode_rows(&self, rows: &[DecodeRow<'_>]) -> Result<Vec<Vec<f32>>> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let tokens: Vec<u32> = rows.iter().map(|r| r.token).collect();
        let spans = rows
            .iter()
            .map(|r| SeqSpan {
                blocks: r.blocks.to_vec(),
                start_pos: r.pos,
                n_tokens: 1,
            })
            .collect();
        let all: Vec<usize> = (0..rows.len()).collect();
        self.run(&tokens, spans, &all)
    }
}

impl BatchModel for PagedModel {
    fn vocab_size(&self) -> usize {
        self.llama.config().vocab
    }

    fn block_size(&self) -> usize {
        self.cache.block_size()
    }

    fn prefill(
        &mut self,
        blocks: &[u32],
        tokens: &[u32],
        pos: usize,
        want_logits: bool,
    ) -> std::result::Result<Option<Vec<f32>>, ferrox_core::Error> {
        Ok(self.prefill_chunk(blocks, tokens, pos, want_logits)?)
    }

    fn decode(
        &mut self,
        rows: &[DecodeRow<'_>],
    ) -> std::result::Result<Vec<Vec<f32>>, ferrox_core::Error> {
        Ok(self.decode_rows(rows)?)
    }
}
