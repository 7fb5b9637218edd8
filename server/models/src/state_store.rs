//! The recurrent state of every sequence: a fixed number of slots, each
//! holding one sequence's state in every recurrent layer (the convolution's
//! last inputs and the SSM state), as the KV store holds blocks. A row
//! carries its slot into the forward ([`SeqSpan::state`]); the worker hands
//! slots out and takes them back as it does blocks.
//!
//! A slot holds the state after some number of a sequence's tokens; a span
//! must start exactly there, or at position 0, where the state starts from
//! zero whatever the slot held (a row that takes a slot starts afresh). So a
//! stale or mismatched slot is an error, never a silently wrong answer.

use std::sync::Mutex;

use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};
use crate::mixer::mamba2::step::DecodeStep;
use crate::seq_span::SeqSpan;
use crate::spec::ModelSpec;

/// One recurrent layer's states: convolution `(slots, conv values)` and
/// SSM `(slots, ssm values)`, f32; no SSM tensor for a layer whose state is
/// its convolution's alone (LFM2's short convolution), as no device need
/// allocate an empty one.
#[derive(Debug)]
struct LayerState {
    conv: Tensor,
    ssm: Option<Tensor>,
}

/// Every recurrent layer's states, by slot.
#[derive(Debug)]
pub struct StateStore {
    layers: Vec<LayerState>,
    /// Per model layer: its index in `layers`, for a recurrent one.
    of_layer: Vec<Option<usize>>,
    slots: usize,
    /// Per slot: the tokens of its sequence its state has folded in.
    at: Mutex<Vec<usize>>,
}

impl StateStore {
    /// `slots` slots for every recurrent layer of `spec` (none when it has
    /// no recurrent layer: then spans carry no slot).
    pub fn new(spec: &ModelSpec, slots: usize, device: &Device) -> Result<Self> {
        let mut of_layer = vec![None; spec.layers.len()];
        let mut layers = Vec::new();
        for (i, l) in spec.layers.iter().enumerate() {
            let Some((conv, ssm)) = l.state_values() else {
                continue;
            };
            of_layer[i] = Some(layers.len());
            layers.push(LayerState {
                conv: Tensor::zeros((slots, conv), DType::F32, device)?,
                ssm: (ssm > 0)
                    .then(|| Tensor::zeros((slots, ssm), DType::F32, device))
                    .transpose()?,
            });
        }
        let slots = if layers.is_empty() { 0 } else { slots };
        Ok(StateStore {
            layers,
            of_layer,
            slots,
            at: Mutex::new(vec![0; slots]),
        })
    }

    /// Slots; `None` for a model without recurrent layers.
    pub fn slots(&self) -> Option<usize> {
        self.is_used().then_some(self.slots)
    }

    /// Bytes of every slot's state in every layer, as allocated.
    pub fn bytes(&self) -> u64 {
        let tensors = self
            .layers
            .iter()
            .flat_map(|l| std::iter::once(&l.conv).chain(&l.ssm));
        tensors.map(crate::linear::tensor_bytes).sum()
    }

    /// Whether the model has recurrent layers (then every span needs a slot).
    pub fn is_used(&self) -> bool {
        !self.layers.is_empty()
    }

    fn layer(&self, layer: usize) -> Result<&LayerState> {
        self.of_layer
            .get(layer)
            .copied()
            .flatten()
            .map(|i| &self.layers[i])
            .ok_or_else(|| Error::Input(format!("layer {layer} keeps no recurrent state")))
    }

    /// Checks every span's slot before a step: present, inside the store,
    /// one span a slot, and holding the state of exactly the tokens before
    /// the span (or the span starts at 0).
    pub fn check(&self, spans: &[SeqSpan]) -> Result<()> {
        if !self.is_used() {
            return Ok(());
        }
        let mut at = self.at.lock().map_err(|_| poisoned())?;
        let mut seen = vec![false; self.slots];
        for s in spans {
            let slot = s.state.ok_or_else(|| {
                Error::Input("a row of a model with recurrent layers has no state slot".into())
            })? as usize;
            if slot >= self.slots || std::mem::replace(&mut seen[slot], true) {
                return Err(Error::Input(format!(
                    "state slot {slot} is outside the {} slots or in two rows",
                    self.slots
                )));
            }
            if s.start_pos != 0 && at[slot] != s.start_pos {
                return Err(Error::Input(format!(
                    "state slot {slot} holds {} tokens but its row resumes at {}",
                    describe(at[slot]),
                    s.start_pos
                )));
            }
        }
        // Until the step ends well (`advance`), its slots hold half-written
        // states: a retry of a step that failed midway is refused, not run
        // on them.
        for s in spans {
            if let Some(slot) = s.state.and_then(|i| at.get_mut(i as usize)) {
                *slot = PARTIAL;
            }
        }
        Ok(())
    }

    /// After a step: each span's slot now holds its tokens up to the span's end.
    pub fn advance(&self, spans: &[SeqSpan]) -> Result<()> {
        let mut at = self.at.lock().map_err(|_| poisoned())?;
        for s in spans {
            if let Some(slot) = s.state.and_then(|i| at.get_mut(i as usize)) {
                *slot = s.start_pos + s.n_tokens;
            }
        }
        Ok(())
    }

    /// Layer `layer`'s states of `spans` (each span's slot; zeros for a
    /// span starting at position 0): `(conv (rows, conv values), ssm (rows,
    /// ssm values))`.
    pub fn read(&self, layer: usize, spans: &[SeqSpan]) -> Result<(Tensor, Tensor)> {
        let l = self.layer(layer)?;
        Ok((
            self.pick(&l.conv, spans)?,
            self.pick(ssm_of(l, layer)?, spans)?,
        ))
    }

    /// Layer `layer`'s convolution states of `spans`, as [`Self::read`].
    pub fn read_conv(&self, layer: usize, spans: &[SeqSpan]) -> Result<Tensor> {
        self.pick(&self.layer(layer)?.conv, spans)
    }

    /// Runs `step` on layer `layer`'s SSM states in place (CPU only).
    pub(crate) fn step_ssm(&self, layer: usize, step: &DecodeStep) -> Result<()> {
        Ok(ssm_of(self.layer(layer)?, layer)?.inplace_op1(step)?)
    }

    /// The rows of `t` for `spans`' slots, zeros for a span at position 0.
    fn pick(&self, t: &Tensor, spans: &[SeqSpan]) -> Result<Tensor> {
        let device = t.device();
        let slots: Vec<u32> = spans.iter().map(|s| s.state.unwrap_or(0)).collect();
        let fresh: Vec<u8> = spans.iter().map(|s| u8::from(s.start_pos == 0)).collect();
        let idx = Tensor::new(slots.as_slice(), device)?;
        let fresh = Tensor::new(fresh.as_slice(), device)?.unsqueeze(1)?;
        let held = t.index_select(&idx, 0)?;
        let zeros = held.zeros_like()?;
        Ok(fresh
            .broadcast_as(held.shape())?
            .where_cond(&zeros, &held)?)
    }

    /// Writes layer `layer`'s new states of `spans` (rows as [`Self::read`]
    /// gives them) into their slots: the convolution's, and the SSM's unless
    /// a step already wrote it in place.
    pub fn write(
        &self,
        layer: usize,
        spans: &[SeqSpan],
        conv: &Tensor,
        ssm: Option<&Tensor>,
    ) -> Result<()> {
        let l = self.layer(layer)?;
        for (row, s) in spans.iter().enumerate() {
            let Some(slot) = s.state else { continue };
            let slot = slot as usize;
            l.conv
                .slice_set(&conv.narrow(0, row, 1)?.contiguous()?, 0, slot)?;
            if let Some(ssm) = ssm {
                ssm_of(l, layer)?.slice_set(&ssm.narrow(0, row, 1)?.contiguous()?, 0, slot)?;
            }
        }
        Ok(())
    }
}

/// Layer `layer`'s SSM states, which a convolution-only layer has none of.
fn ssm_of(l: &LayerState, layer: usize) -> Result<&Tensor> {
    l.ssm
        .as_ref()
        .ok_or_else(|| Error::Input(format!("layer {layer} keeps only a convolution state")))
}

/// A slot's position while a step writes it.
const PARTIAL: usize = usize::MAX;

fn describe(at: usize) -> String {
    match at {
        PARTIAL => "a step's partly written state (it failed), not".into(),
        n => n.to_string(),
    }
}

fn poisoned() -> Error {
    Error::Input("the state store's positions were poisoned by a panic".into())
}
