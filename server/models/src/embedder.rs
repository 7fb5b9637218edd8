//! A model whose layers keep no cache (an encoder, or a decoder
//! [`pooled`](crate::spec::ModelSpec::pooled)) behind the pooling worker's
//! [`PoolingModel`] interface: a batch of whole sequences is one forward,
//! each sequence's hidden states pooled into one vector (then through the
//! model's Dense modules, if any), nothing kept.

use std::sync::Arc;

use ferrox_core::PoolingModel;
use ferrox_plan::KvDtype;

use crate::decoder::{Decoder, Step};
use crate::error::{Error, Result};
use crate::kv_store::KvStore;
use crate::pooling::Pooling;
use crate::pooling::dense::Dense;
use crate::pooling::head::ScoreHead;
use crate::seq_span::SeqSpan;
use crate::state_store::StateStore;

/// A pooling model: the decoder, its pooling, and the empty stores a
/// step of a model without a cache runs against.
#[derive(Debug)]
pub struct Embedder {
    decoder: Decoder,
    pooling: Pooling,
    kv: KvStore,
    state: StateStore,
    /// A cross-encoder's score head: each "vector" is its one score.
    head: Option<ScoreHead>,
    /// sentence-transformers' Dense modules, in order, after the pooling.
    dense: Vec<Dense>,
}

impl Embedder {
    /// Wraps `decoder`, whose layers must keep no cache, pooling by
    /// `pooling`.
    pub fn new(decoder: Decoder, pooling: Pooling) -> Result<Self> {
        if decoder.spec().keeps_cache() {
            return Err(Error::Config(
                "a pooling model's layers must keep no cache: run its spec pooled".into(),
            ));
        }
        let kv = decoder.kv_store(&[], 1, KvDtype::F32)?;
        let state = decoder.state_store(0)?;
        Ok(Embedder {
            decoder,
            pooling,
            kv,
            state,
            head: None,
            dense: Vec::new(),
        })
    }

    /// The same model with `dense` applied to each pooled vector, in order.
    pub fn with_dense(mut self, dense: Vec<Dense>) -> Self {
        self.dense = dense;
        self
    }

    /// The width of a vector: the last Dense module's, else the model's;
    /// one for a scorer.
    pub fn dim(&self) -> usize {
        match (&self.head, self.dense.last()) {
            (Some(_), _) => 1,
            (None, Some(d)) => d.out_features(),
            (None, None) => self.decoder.spec().hidden,
        }
    }

    /// The same model scoring: each sequence's pooled state through `head`,
    /// one score (a one-element vector) a sequence.
    pub fn with_head(mut self, head: ScoreHead) -> Self {
        self.head = Some(head);
        self
    }

    /// Whether it scores (a cross-encoder) rather than embeds.
    pub fn scores(&self) -> bool {
        self.head.is_some()
    }

    /// The decoder.
    pub fn decoder(&self) -> &Decoder {
        &self.decoder
    }

    /// The decoder, mutably (to serve a shorter context).
    pub fn decoder_mut(&mut self) -> &mut Decoder {
        &mut self.decoder
    }

    /// How it pools.
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// One vector per sequence (see [`PoolingModel::embed`]).
    pub fn vectors(&self, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        self.vectors_typed(seqs, None)
    }

    /// One vector per sequence, each token of sequence `i` of type
    /// `types[i][j]` (a pair's second text is type 1; type 0 for all when
    /// `None`). A scorer's vector is its one score.
    pub fn vectors_typed(
        &self,
        seqs: &[&[u32]],
        types: Option<&[&[u32]]>,
    ) -> Result<Vec<Vec<f32>>> {
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        let types: Option<Vec<u32>> = types.map(|t| t.concat());
        let tokens: Vec<u32> = seqs.iter().flat_map(|s| s.iter().copied()).collect();
        let spans: Vec<SeqSpan> = seqs
            .iter()
            .map(|s| SeqSpan {
                tables: Vec::new(),
                start_pos: 0,
                n_tokens: s.len(),
                state: None,
            })
            .collect();
        let lens: Vec<usize> = seqs.iter().map(|s| s.len()).collect();
        let step = Step {
            tokens: &tokens,
            spans: Arc::from(spans),
            logits_for: &[],
            lora: None,
            token_types: types.as_deref(),
        };
        let run = || {
            let hidden = self.decoder.hidden(&self.kv, &self.state, &step)?;
            let pooled = self.pooling.pool(&hidden, &lens)?;
            self.dense.iter().try_fold(pooled, |x, d| d.forward(&x))
        };
        // On CPU on a warm pool worker, as a decoder step (see `PagedModel`).
        let pooled = match self.decoder.device().is_cpu() {
            true => crate::warm_pool::on_warm_pool(run)?,
            false => run()?,
        };
        match &self.head {
            Some(head) => Ok(head.scores(&pooled)?.into_iter().map(|s| vec![s]).collect()),
            None => Ok(pooled.to_vec2::<f32>()?),
        }
    }
}

impl PoolingModel for Embedder {
    fn vocab_size(&self) -> usize {
        self.decoder.spec().vocab
    }

    fn max_len(&self) -> usize {
        self.decoder.context()
    }

    fn embed(&mut self, seqs: &[&[u32]]) -> std::result::Result<Vec<Vec<f32>>, ferrox_core::Error> {
        self.vectors(seqs)
            .map_err(|e| ferrox_core::Error::Forward(e.to_string()))
    }

    fn embed_typed(
        &mut self,
        seqs: &[&[u32]],
        types: Option<&[&[u32]]>,
    ) -> std::result::Result<Vec<Vec<f32>>, ferrox_core::Error> {
        self.vectors_typed(seqs, types)
            .map_err(|e| ferrox_core::Error::Forward(e.to_string()))
    }
}
