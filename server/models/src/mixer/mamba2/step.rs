//! One recurrence step of Mamba-2's SSM for decode rows, in place in the
//! state store on CPU: `h = exp(dt A) h + dt x B^T`, `y = h C`, each row's
//! state read and written once. The state is what a hybrid's decode step
//! touches most after the weights (Granite-4.0-H-Micro's: 2 MiB a row a
//! layer); the block form gathers, copies and scatters it several times.

use std::sync::Mutex;

use candle_core::{CpuStorage, InplaceOp1, Layout};
use rayon::prelude::*;

use super::spec::SsmSpec;

/// One step's inputs for `rows` decode rows (f32, row-major).
pub(crate) struct DecodeStep {
    /// Each row's slot, and whether it starts afresh (state taken as zero).
    pub slots: Vec<(usize, bool)>,
    pub spec: SsmSpec,
    /// Time steps after softplus and clamp, `(rows, heads)`.
    pub dt: Vec<f32>,
    /// Each head's (negative) rate.
    pub a: Vec<f32>,
    /// `(rows, heads, head_dim)`.
    pub x: Vec<f32>,
    /// `(rows, groups, state)`.
    pub b: Vec<f32>,
    /// `(rows, groups, state)`.
    pub c: Vec<f32>,
    /// The output, `(rows, heads, head_dim)`, filled by the step.
    pub y: Mutex<Vec<f32>>,
}

/// One head of one row: its state `(head_dim, state)` and its outputs.
struct Task<'a> {
    row: usize,
    head: usize,
    h: &'a mut [f32],
    y: &'a mut [f32],
}

impl DecodeStep {
    fn head(&self, t: Task<'_>) {
        let s = &self.spec;
        let (n, g) = (s.state, t.head / (s.heads / s.groups));
        let at = t.row * s.heads + t.head;
        let dt = self.dt[at];
        let keep = (!self.slots[t.row].1).then(|| (dt * self.a[t.head]).exp());
        let group = (t.row * s.groups + g) * n;
        let (b, c) = (&self.b[group..group + n], &self.c[group..group + n]);
        let x = &self.x[at * s.head_dim..(at + 1) * s.head_dim];
        for ((h, y), &x) in t.h.chunks_exact_mut(n).zip(t.y.iter_mut()).zip(x) {
            *y = channel(h, keep, dt * x, b, c);
        }
    }
}

/// One channel's state row: `h = keep h + xdt b` (`h = xdt b` afresh),
/// returns `h . c`; eight lanes so it vectorises.
fn channel(h: &mut [f32], keep: Option<f32>, xdt: f32, b: &[f32], c: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let lanes = h.len() / 8 * 8;
    let (h8, rest) = h.split_at_mut(lanes);
    for (i, hc) in h8.chunks_exact_mut(8).enumerate() {
        let (bc, cc) = (&b[i * 8..i * 8 + 8], &c[i * 8..i * 8 + 8]);
        for l in 0..8 {
            let v = match keep {
                Some(k) => hc[l] * k + xdt * bc[l],
                None => xdt * bc[l],
            };
            hc[l] = v;
            acc[l] += v * cc[l];
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for (j, hv) in rest.iter_mut().enumerate() {
        let v = keep.map_or(0.0, |k| *hv * k) + xdt * b[lanes + j];
        *hv = v;
        sum += v * c[lanes + j];
    }
    sum
}

impl InplaceOp1 for DecodeStep {
    fn name(&self) -> &'static str {
        "mamba2-decode-step"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let CpuStorage::F32(all) = storage else {
            candle_core::bail!("the recurrent state is not f32");
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("the recurrent state is not contiguous");
        };
        let s = &self.spec;
        let (per_head, per_slot) = (s.head_dim * s.state, s.heads * s.head_dim * s.state);
        let mut by_slot: Vec<Option<&mut [f32]>> =
            all[start..end].chunks_mut(per_slot).map(Some).collect();
        let mut y = vec![0f32; self.slots.len() * s.heads * s.head_dim];
        let mut tasks = Vec::with_capacity(self.slots.len() * s.heads);
        for ((row, &(slot, _)), y) in self
            .slots
            .iter()
            .enumerate()
            .zip(y.chunks_mut(s.heads * s.head_dim))
        {
            let Some(h) = by_slot.get_mut(slot).and_then(Option::take) else {
                candle_core::bail!("state slot {slot} is out of range or taken twice in a step");
            };
            let heads = h.chunks_mut(per_head).zip(y.chunks_mut(s.head_dim));
            tasks.extend(
                heads
                    .enumerate()
                    .map(|(head, (h, y))| Task { row, head, h, y }),
            );
        }
        tasks.into_par_iter().for_each(|t| self.head(t));
        *self
            .y
            .lock()
            .map_err(|_| candle_core::Error::Msg("poisoned".into()))? = y;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_step_is_the_recurrence_at_every_width() {
        // Widths around the 8 lanes, kept and afresh.
        for n in [1, 7, 8, 9, 16, 20] {
            let b: Vec<f32> = (0..n).map(|i| 0.5 - i as f32 * 0.1).collect();
            let c: Vec<f32> = (0..n).map(|i| 0.2 * i as f32 - 0.3).collect();
            for keep in [Some(0.75), None] {
                let mut h: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 1.0).collect();
                let want: Vec<f32> = h
                    .iter()
                    .zip(&b)
                    .map(|(&h, &b)| keep.map_or(0.0, |k| h * k) + 1.5 * b)
                    .collect();
                let y = channel(&mut h, keep, 1.5, &b, &c);
                let dot: f32 = want.iter().zip(&c).map(|(h, c)| h * c).sum();
                assert_eq!(h, want, "n {n} keep {keep:?}");
                assert!((y - dot).abs() < 1e-5, "n {n}: {y} vs {dot}");
            }
        }
    }
}
