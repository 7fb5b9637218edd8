//! The batched matmul over a [`QMatrix`]: tasks of (weight rows x activation
//! rows) on rayon's pool, tiles inside each task, results written straight
//! into the caller's buffers (or added to them, for a residual).

use rayon::prelude::*;

use crate::Error;
use crate::dot::{Kernel, Tile};
use crate::qact::QActs;
use crate::qmatrix::QMatrix;
use crate::quant_type::GROUP;

/// Most output parts one call may split its rows into.
pub const MAX_PARTS: usize = 4;

/// Activation rows per task (prefill chunks): the panel's quantised rows
/// (~1.6 bytes a column with their block sums) stay in L2 while the task's
/// weight rows pass, and the whole matrix is read once a panel, so a large
/// batch of short rows takes larger panels.
fn act_panel(batch: usize, cols: usize) -> usize {
    match batch {
        0..=64 => batch,
        257.. if cols <= 4096 => 64,
        _ => 32,
    }
}

/// An output part: rows `start..start+len` of the matrix, written `[batch][len]`.
#[derive(Clone, Copy)]
struct Part {
    start: usize,
    len: usize,
    ptr: *mut f32,
}

/// The output parts of one call, shared by its tasks.
struct Parts {
    parts: [Part; MAX_PARTS],
    count: usize,
    batch: usize,
    add: bool,
}

// SAFETY: every task writes a disjoint set of (row, batch) cells (its own
// rows x its own activation rows), and the buffers outlive the parallel call.
unsafe impl Sync for Parts {}

impl Parts {
    /// Writes (or adds) a tile's results `res[j][r]` for matrix rows
    /// `g * GROUP + r` (those below `rows`) and activation rows `n..n+aa`:
    /// a group inside one part is 8 contiguous cells per activation row.
    ///
    /// # Safety
    /// `n + aa <= batch`, and no other thread touches these cells.
    unsafe fn put_tile(&self, g: usize, (n, aa): (usize, usize), res: &Tile) {
        let last = &self.parts[self.count - 1];
        let row0 = g * GROUP;
        let live = GROUP.min((last.start + last.len).saturating_sub(row0));
        let p = self.part_of(row0);
        if row0 + live > p.start + p.len {
            // The group straddles parts: cell by cell.
            for r in 0..live {
                // SAFETY: as the caller guarantees, for one row.
                unsafe { self.put_row(row0 + r, (n, aa), res, r) };
            }
            return;
        }
        for (j, res_act) in res.iter().enumerate().take(aa) {
            debug_assert!(n + j < self.batch);
            // SAFETY: rows `row0..row0+live` lie in part `p`, whose buffer
            // holds `batch * len` values laid out `[batch][len]`.
            let cells = unsafe {
                std::slice::from_raw_parts_mut(p.ptr.add((n + j) * p.len + (row0 - p.start)), live)
            };
            if self.add {
                cells.iter_mut().zip(res_act).for_each(|(c, &v)| *c += v);
            } else {
                cells.copy_from_slice(&res_act[..live]);
            }
        }
    }

    /// The part holding matrix row `row` (the parts cover `0..rows` in order).
    fn part_of(&self, row: usize) -> &Part {
        let parts = &self.parts[..self.count];
        parts
            .iter()
            .find(|p| row < p.start + p.len)
            .unwrap_or(&parts[self.count - 1])
    }

    /// [`Self::put_tile`] for one matrix row `row`, the tile's row `r`.
    ///
    /// # Safety
    /// As [`Self::put_tile`], and `row` is below the matrix's rows.
    unsafe fn put_row(&self, row: usize, (n, aa): (usize, usize), res: &Tile, r: usize) {
        let p = self.part_of(row);
        for (j, res_act) in res.iter().enumerate().take(aa) {
            // SAFETY: `row` lies in part `p`, whose buffer holds `batch * len` values.
            unsafe {
                let cell = p.ptr.add((n + j) * p.len + (row - p.start));
                *cell = if self.add {
                    *cell + res_act[r]
                } else {
                    res_act[r]
                };
            }
        }
    }
}

impl QMatrix {
    /// `out[n*rows + m] = sum_k x[n*cols + k] * W[m][k]` for `n in 0..batch`.
    ///
    /// Activations are quantised to 8 bits per 32-block first (llama.cpp's
    /// method), so results carry ~1e-2 relative error against f32 math.
    pub fn matmul(&self, x: &[f32], batch: usize, out: &mut [f32]) -> Result<(), Error> {
        if batch == 0 && x.is_empty() && out.is_empty() {
            return Ok(());
        }
        let mut acts = QActs::new();
        acts.quantize(x, batch).map_err(|_| Error::Length {
            what: "matmul input",
            expected: batch.saturating_mul(self.cols()),
            got: x.len(),
        })?;
        self.matmul_acts(&acts, &mut [out], false)
    }

    /// The matmul of already quantised activations. Output rows are split
    /// over `parts` in order: part `k` takes the next `parts[k].len() / batch`
    /// rows, laid out `[batch][len]` (one part is the plain `[batch][rows]`).
    /// With `add`, results are added to what the parts hold (a residual).
    pub fn matmul_acts(
        &self,
        acts: &QActs,
        parts: &mut [&mut [f32]],
        add: bool,
    ) -> Result<(), Error> {
        self.matmul_acts_with(Kernel::detect(), acts, parts, add)
    }

    /// [`Self::matmul_acts`] on a chosen kernel (one of [`Kernel::available`]).
    pub fn matmul_acts_with(
        &self,
        kernel: Kernel,
        acts: &QActs,
        parts: &mut [&mut [f32]],
        add: bool,
    ) -> Result<(), Error> {
        if !kernel.supported() {
            return Err(Error::Unsupported(kernel));
        }
        let parts = self.parts(acts, parts, add)?;
        let (groups, batch) = (self.groups(), acts.batch());
        let rc = chunk_groups(groups, batch);
        let ap = act_panel(batch, self.cols());
        let (nrc, nap) = (groups.div_ceil(rc), batch.div_ceil(ap));
        let task = |t: usize| {
            let (m0, n0) = ((t % nrc) * rc, (t / nrc) * ap);
            self.task(
                kernel,
                acts,
                &parts,
                (m0, (m0 + rc).min(groups)),
                (n0, (n0 + ap).min(batch)),
            );
        };
        if nrc * nap == 1 {
            task(0);
        } else {
            (0..nrc * nap).into_par_iter().for_each(task);
        }
        Ok(())
    }

    /// Checks the shapes and turns `parts` into raw row ranges.
    fn parts(&self, acts: &QActs, parts: &mut [&mut [f32]], add: bool) -> Result<Parts, Error> {
        let batch = acts.batch();
        if acts.cols() != self.cols() {
            return Err(Error::Length {
                what: "matmul input",
                expected: batch.saturating_mul(self.cols()),
                got: batch.saturating_mul(acts.cols()),
            });
        }
        let bad = |got: usize| Error::Length {
            what: "matmul output",
            expected: batch.saturating_mul(self.rows()),
            got,
        };
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if parts.is_empty() || parts.len() > MAX_PARTS || batch == 0 {
            return Err(bad(total));
        }
        let empty = Part {
            start: 0,
            len: 0,
            ptr: std::ptr::null_mut(),
        };
        let mut out = Parts {
            parts: [empty; MAX_PARTS],
            count: parts.len(),
            batch,
            add,
        };
        let mut start = 0;
        for (slot, p) in out.parts.iter_mut().zip(parts.iter_mut()) {
            if !p.len().is_multiple_of(batch) {
                return Err(bad(total));
            }
            let len = p.len() / batch;
            *slot = Part {
                start,
                len,
                ptr: p.as_mut_ptr(),
            };
            start += len;
        }
        if start != self.rows() {
            return Err(bad(total));
        }
        Ok(out)
    }

    /// One task: row groups `g0..g1` against activation rows `n0..n1`.
    fn task(
        &self,
        kernel: Kernel,
        acts: &QActs,
        out: &Parts,
        groups: (usize, usize),
        batch: (usize, usize),
    ) {
        kernel.tiles(self, groups, acts, batch, &mut |g, n, res| {
            // SAFETY: `Kernel::tiles` hands out tiles inside `rows` x
            // `batch`, which this task alone owns.
            unsafe { out.put_tile(g, n, res) }
        });
    }
}

/// Row groups per task: enough tasks to keep every thread busy (even at
/// batch 1 on small matrices), few enough that scheduling stays cheap;
/// whole panels (an even count), so 512-bit tiles never split one.
fn chunk_groups(groups: usize, batch: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let max = if batch >= 16 { 4 } else { 8 };
    groups
        .div_ceil(threads * 4)
        .clamp(1, max)
        .next_multiple_of(2)
}

#[cfg(test)]
#[path = "matmul_tests.rs"]
mod tests;
