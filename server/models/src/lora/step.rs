//! The adapters of one forward pass, grouped, and the update the decoder
//! adds after each targeted projection (see the module's docs for the hook).

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

use super::device::{DeviceAdapter, DeviceSlots};
use super::kernel::{Scratch, delta_rows};
use super::{LoraAdapter, LoraPair, Target};
use crate::error::{Error, Result};

/// The op-by-op LoRA hook: `(targets, input, output)` to the output plus
/// each row's adapter update.
pub(crate) type LoraHook<'a> = dyn Fn(&[Target], &Tensor, Tensor) -> Result<Tensor> + 'a;

/// The rows of one adapter in a step.
struct Group<'a> {
    adapter: &'a LoraAdapter,
    /// Token rows of the step, ascending.
    rows: Vec<u32>,
    /// The weights and row index on an accelerator, when the step runs there.
    on_device: Option<(Arc<DeviceAdapter>, Tensor)>,
}

/// A step's rows grouped by adapter; built once per step.
pub struct LoraStep<'a> {
    groups: Vec<Group<'a>>,
    /// Each token row's group (`NONE`: the base model alone).
    row_group: Vec<u32>,
}

const NONE: u32 = u32::MAX;

/// Rows of one adapter a task computes: its weights are widened once for
/// them all; more tasks share the cores.
const TASK_ROWS: usize = 32;

impl std::fmt::Debug for LoraStep<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.groups.iter().map(|g| g.adapter.name()).collect();
        f.debug_struct("LoraStep")
            .field("adapters", &names)
            .field("tokens", &self.tokens())
            .finish()
    }
}

impl<'a> LoraStep<'a> {
    /// The step of `spans`, each a run of token rows with its adapter, in
    /// step order; `None` when no span has an adapter (nothing to add).
    pub fn new(spans: impl IntoIterator<Item = (Option<&'a LoraAdapter>, usize)>) -> Option<Self> {
        let mut groups: Vec<Group<'a>> = Vec::new();
        let mut row_group = Vec::new();
        for (adapter, n) in spans {
            let g = match adapter {
                None => NONE,
                Some(a) => {
                    let i = match groups.iter().position(|g| g.adapter.id() == a.id()) {
                        Some(i) => i,
                        None => {
                            groups.push(Group {
                                adapter: a,
                                rows: Vec::new(),
                                on_device: None,
                            });
                            groups.len() - 1
                        }
                    };
                    let first = row_group.len() as u32;
                    groups[i].rows.extend(first..first + n as u32);
                    i as u32
                }
            };
            row_group.extend(std::iter::repeat_n(g, n));
        }
        (!groups.is_empty()).then_some(LoraStep { groups, row_group })
    }

    /// Holds each group's weights and rows on `device` (through `slots`),
    /// so [`LoraStep::add`] runs there with tensor ops.
    pub fn on_device(mut self, device: &Device, slots: &DeviceSlots) -> Result<Self> {
        for g in &mut self.groups {
            let weights = slots.get(g.adapter, device)?;
            let index = Tensor::new(g.rows.as_slice(), device)?;
            g.on_device = Some((weights, index));
        }
        Ok(self)
    }

    /// Token rows in the step.
    pub fn tokens(&self) -> usize {
        self.row_group.len()
    }

    /// Distinct adapters in the step.
    pub fn adapters(&self) -> usize {
        self.groups.len()
    }

    /// Width of `target`'s output (every adapter of a step shares a base).
    fn width(&self, target: Target) -> usize {
        self.groups[0].adapter.shapes().dims(target).0
    }

    /// The hook on host slices: `out += scale * (x @ A^T) @ B^T` for every
    /// row whose adapter updates `target` in `layer`. `x` is `(tokens, in)`
    /// and `out` `(tokens, out)`, row-major.
    pub fn apply(&self, target: Target, layer: usize, x: &[f32], out: &mut [f32]) -> Result<()> {
        let width = self.width(target);
        self.apply_strided(target, layer, x, out, (width, 0))
    }

    /// As [`LoraStep::apply`], into section `[offset, offset + out)` of
    /// rows `stride` wide.
    fn apply_strided(
        &self,
        target: Target,
        layer: usize,
        x: &[f32],
        out: &mut [f32],
        (stride, offset): (usize, usize),
    ) -> Result<()> {
        let pairs: Vec<_> = self
            .groups
            .iter()
            .map(|g| g.adapter.pair(layer, target))
            .collect();
        if pairs.iter().all(Option::is_none) {
            return Ok(());
        }
        let (width, cols) = self.groups[0].adapter.shapes().dims(target);
        let rows = self.tokens();
        if x.len() != rows * cols || out.len() != rows * stride || offset + width > stride {
            return Err(Error::Input(format!(
                "LoRA {target:?}: {} inputs and {} outputs for {rows} rows of {cols} -> {width}",
                x.len(),
                out.len()
            )));
        }
        // Blocks of a group's rows, each computed into its own part of
        // `delta` (in parallel), then added to the rows' outputs.
        let tasks: Vec<(&LoraPair, &[u32])> = (self.groups.iter().zip(&pairs))
            .filter_map(|(g, p)| p.map(|p| (p, g.rows.as_slice())))
            .flat_map(|(p, rows)| rows.chunks(TASK_ROWS).map(move |r| (p, r)))
            .collect();
        let total: usize = tasks.iter().map(|(_, r)| r.len()).sum();
        let mut delta = vec![0f32; total * width];
        let mut regions = Vec::with_capacity(tasks.len());
        let mut rest = delta.as_mut_slice();
        for (_, rows) in &tasks {
            let (region, tail) = rest.split_at_mut(rows.len() * width);
            regions.push(region);
            rest = tail;
        }
        let row_of = |r: u32| &x[r as usize * cols..(r as usize + 1) * cols];
        (tasks.par_iter().zip(regions))
            .with_min_len(1)
            .for_each_init(Scratch::default, |t, ((p, rows), d)| {
                let xs: Vec<&[f32]> = rows.iter().map(|&r| row_of(r)).collect();
                delta_rows(p, &xs, d, t);
            });
        let rows = tasks.iter().flat_map(|(_, rows)| rows.iter());
        for (&r, d) in rows.zip(delta.chunks_exact(width)) {
            let at = r as usize * stride + offset;
            let o = &mut out[at..at + width];
            o.iter_mut().zip(d).for_each(|(o, d)| *o += d);
        }
        Ok(())
    }

    /// The hook on tensors (the op-by-op path, any device): `out` is the
    /// concatenation of `targets`' outputs for input `x`; returns it with
    /// each adapter's update added to its rows.
    pub fn add(&self, targets: &[Target], layer: usize, x: &Tensor, out: Tensor) -> Result<Tensor> {
        let touched = |g: &Group<'_>| targets.iter().any(|&t| g.adapter.pair(layer, t).is_some());
        if !self.groups.iter().any(touched) {
            return Ok(out);
        }
        if self.groups.iter().all(|g| g.on_device.is_some()) {
            return self.add_on_device(targets, layer, x, out);
        }
        let (rows, stride) = out.dims2()?;
        let (dtype, device) = (out.dtype(), out.device().clone());
        let x = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        let mut o = out.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        let mut offset = 0;
        for &t in targets {
            self.apply_strided(t, layer, &x, &mut o, (stride, offset))?;
            offset += self.width(t);
        }
        Ok(Tensor::from_vec(o, (rows, stride), &device)?.to_dtype(dtype)?)
    }

    /// [`LoraStep::add`] with tensor ops: per group, gather its rows, two
    /// thin matmuls per target, scatter-add back.
    fn add_on_device(
        &self,
        targets: &[Target],
        layer: usize,
        x: &Tensor,
        mut out: Tensor,
    ) -> Result<Tensor> {
        let x = x.to_dtype(DType::F32)?;
        let dtype = out.dtype();
        for g in &self.groups {
            let Some((weights, index)) = &g.on_device else {
                continue;
            };
            if !targets.iter().any(|&t| weights.pair(layer, t).is_some()) {
                continue;
            }
            let xs = x.index_select(index, 0)?;
            let mut parts = Vec::with_capacity(targets.len());
            for &t in targets {
                parts.push(match weights.pair(layer, t) {
                    Some((a_t, b_t, scale)) => (xs.matmul(a_t)?.matmul(b_t)? * *scale)?,
                    None => Tensor::zeros((g.rows.len(), self.width(t)), DType::F32, x.device())?,
                });
            }
            let delta = Tensor::cat(&parts, 1)?.to_dtype(dtype)?;
            out = out.index_add(index, &delta, 0)?;
        }
        Ok(out)
    }
}
