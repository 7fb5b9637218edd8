//! A run of consecutive layers over some of a step's tokens, and which
//! tokens the model's last layers need when they keep no KV: Gemma 4's
//! shared-KV layers write nothing a later step reads, so a token whose
//! logits no one wants need not pass through them (vLLM's fast prefill for
//! KV sharing). Each span keeps its suffix from its first wanted token, so
//! the kept tokens are still whole runs at known positions.

use std::ops::Range;
use std::sync::Arc;

use candle_core::Tensor;

use super::Decoder;
use super::op_by_op::LayerCtx;
use crate::error::Result;
use crate::kv_store::KvStore;
use crate::lora::LoraStep;
use crate::mixer::attention::forward::AttentionStep;
use crate::mixer::attention::paged::StepTables;
use crate::seq_span::SeqSpan;
use crate::state_store::StateStore;

/// What a step's layer runs share whatever tokens they run.
pub(super) struct Run<'a> {
    pub(super) kv: &'a KvStore,
    pub(super) state: &'a StateStore,
    pub(super) lora: Option<&'a LoraStep<'a>>,
    /// Per KV group: the step's slots (read where a layer writes KV; the
    /// layers past a narrowing write none).
    pub(super) slot_index: &'a [Tensor],
}

/// The tokens of a step the last layers run: each span's suffix from its
/// first token whose logits are wanted (spans with none are dropped).
#[derive(Debug, Clone)]
pub(super) struct Kept {
    /// The kept tokens' indices in the step, ascending.
    pub(super) rows: Vec<u32>,
    /// The kept suffixes as spans.
    pub(super) spans: Arc<[SeqSpan]>,
    /// The wanted logits' indices among the kept rows, in the step's order.
    pub(super) logits_for: Vec<usize>,
}

impl Kept {
    /// The kept tokens of `spans` for `logits_for` (indices into the step).
    pub(super) fn of(spans: &[SeqSpan], logits_for: &[usize]) -> Self {
        // Each span's end in the step, then its first wanted token (one
        // pass over the wanted rows, whatever the batch).
        let ends: Vec<usize> = (spans.iter())
            .scan(0, |end, s| {
                *end += s.n_tokens;
                Some(*end)
            })
            .collect();
        let mut first = vec![usize::MAX; spans.len()];
        for &i in logits_for {
            let s = ends.partition_point(|&end| end <= i);
            if let Some(f) = first.get_mut(s) {
                *f = (*f).min(i);
            }
        }
        let (mut rows, mut kept) = (Vec::new(), Vec::new());
        for ((span, &end), &first) in spans.iter().zip(&ends).zip(&first) {
            if first == usize::MAX {
                continue;
            }
            rows.extend((first..end).map(|r| r as u32));
            kept.push(SeqSpan {
                start_pos: span.start_pos + (first + span.n_tokens - end),
                n_tokens: end - first,
                ..span.clone()
            });
        }
        let logits_for = (logits_for.iter())
            .map(|&i| rows.partition_point(|&r| (r as usize) < i))
            .collect();
        Kept {
            rows,
            spans: kept.into(),
            logits_for,
        }
    }

    /// The kept rows of the residual stream `x`, of the per-layer inputs
    /// and of the tokens' positions.
    pub(super) fn select(
        &self,
        x: Tensor,
        per_layer: Option<Tensor>,
        positions: &[u32],
    ) -> Result<(Tensor, Option<Tensor>, Vec<u32>)> {
        let rows = Tensor::new(self.rows.as_slice(), x.device())?;
        let per_layer = per_layer.map(|p| p.index_select(&rows, 0)).transpose()?;
        let positions = self.rows.iter().map(|&r| positions[r as usize]).collect();
        Ok((x.index_select(&rows, 0)?, per_layer, positions))
    }
}

impl Decoder {
    /// Layers `layers` over `x`, the tokens of `spans` at `positions`,
    /// each layer's per-layer inputs from `per_layer` where the model has
    /// them.
    pub(super) fn run_range(
        &self,
        layers: Range<usize>,
        mut x: Tensor,
        run: &Run<'_>,
        (spans, positions): (Arc<[SeqSpan]>, &[u32]),
        per_layer: Option<&Tensor>,
    ) -> Result<Tensor> {
        let pos = Tensor::new(positions, &self.device)?;
        let rope_rows = (self.ropes.iter())
            .map(|r| r.gather(&pos))
            .collect::<Result<Vec<_>>>()?;
        let query_scales = self.query_scales(positions)?;
        let tables = (self.groups.iter().enumerate())
            .map(|(g, group)| {
                let (key, cache) = ((g, group.window), run.kv.cache(g));
                StepTables::for_step(&spans, key, cache, &self.device, self.fused_attention)
            })
            .collect::<Result<Vec<_>>>()?;
        let ctx = LayerCtx {
            attention: AttentionStep {
                kv: run.kv,
                spans: &spans,
                tables: &tables,
                rope_rows: &rope_rows,
                query_scales: &query_scales,
                slot_index: run.slot_index,
                heads: self.heads(),
                eps: self.spec.norms.eps as f32,
                paged: self.fused_attention,
            },
            state: run.state,
            spans: &spans,
            lora: run.lora,
        };
        let fused = self.fused.as_ref().filter(|_| self.use_fused);
        for i in layers {
            let layer = &self.layers[i];
            x = match fused.and_then(|(fl, _)| fl[i].as_ref()) {
                Some(fl) => self.fused_layer_forward(i, (layer, fl), x, &ctx)?,
                None => self.layer_forward(i, layer, &x, &ctx)?,
            };
            x = self.layer_tail((i, layer), x, per_layer)?;
        }
        Ok(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(start_pos: usize, n_tokens: usize) -> SeqSpan {
        SeqSpan {
            tables: vec![vec![7]],
            start_pos,
            n_tokens,
            state: None,
        }
    }

    #[test]
    fn each_span_keeps_its_suffix_from_its_first_wanted_token() {
        // A prefill chunk wanting its last token, a middle chunk wanting
        // none, a decode row, a verify run wanting its last three.
        let spans = [span(0, 5), span(40, 3), span(9, 1), span(20, 4)];
        let got = Kept::of(&spans, &[4, 8, 10, 12, 11]);
        assert_eq!(got.rows, [4, 8, 10, 11, 12]);
        let kept: Vec<(usize, usize)> = got
            .spans
            .iter()
            .map(|s| (s.start_pos, s.n_tokens))
            .collect();
        assert_eq!(kept, [(4, 1), (9, 1), (21, 3)]);
        assert_eq!(got.logits_for, [0, 1, 2, 4, 3]);
        assert!(got.spans.iter().all(|s| s.tables == [vec![7]]));
        let none = Kept::of(&spans, &[]);
        assert!(none.rows.is_empty() && none.spans.is_empty());
    }
}
