//! Adapters' weights on an accelerator: at most `--max-loras` of them,
//! least recently used replaced. The host copy (the adapter itself) stays
//! the source; an upload is a few megabytes, done at the step that first
//! needs it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use candle_core::{Device, Tensor};

use super::{LoraAdapter, Target};
use crate::error::Result;

/// One adapter's pairs on a device: `A^T` `(in, rank)`, `B^T` `(rank, out)`
/// and the scale, by layer and target.
#[derive(Debug)]
pub(crate) struct DeviceAdapter {
    pairs: Vec<[Option<(Tensor, Tensor, f64)>; 7]>,
}

impl DeviceAdapter {
    fn upload(a: &LoraAdapter, device: &Device) -> Result<Self> {
        let mut pairs = Vec::with_capacity(a.layers());
        for layer in 0..a.layers() {
            let mut row: [Option<(Tensor, Tensor, f64)>; 7] = Default::default();
            for t in Target::ALL {
                let Some(p) = a.pair(layer, t) else { continue };
                let (out, cols) = p.dims();
                let wide = |w: &[half::f16], shape: (usize, usize)| {
                    Tensor::from_slice(w, shape, device)?.to_dtype(candle_core::DType::F32)
                };
                let a_t = wide(p.a(), (p.rank(), cols))?.t()?.contiguous()?;
                let b_t = wide(p.b_t(), (p.rank(), out))?;
                row[t.index()] = Some((a_t, b_t, f64::from(p.scale())));
            }
            pairs.push(row);
        }
        Ok(DeviceAdapter { pairs })
    }

    /// `(A^T, B^T, scale)` of `target` in `layer`.
    pub(crate) fn pair(&self, layer: usize, target: Target) -> Option<&(Tensor, Tensor, f64)> {
        self.pairs.get(layer)?[target.index()].as_ref()
    }
}

/// The adapters held on one device, most recently used first.
#[derive(Debug)]
pub struct DeviceSlots {
    capacity: usize,
    held: Mutex<VecDeque<(u64, Arc<DeviceAdapter>)>>,
}

impl DeviceSlots {
    /// Room for `capacity` adapters (at least one).
    pub fn new(capacity: usize) -> Self {
        DeviceSlots {
            capacity: capacity.max(1),
            held: Mutex::new(VecDeque::new()),
        }
    }

    /// Adapters held now.
    pub fn held(&self) -> usize {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// `a`'s weights on `device`, uploaded if not held; the least recently
    /// used beyond the capacity are dropped (a step never needs more than
    /// `--max-loras`, which admission keeps).
    pub(crate) fn get(&self, a: &LoraAdapter, device: &Device) -> Result<Arc<DeviceAdapter>> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = held.iter().position(|(id, _)| *id == a.id()) {
            let hit = held.remove(i).map(|(_, d)| d);
            if let Some(d) = hit {
                held.push_front((a.id(), Arc::clone(&d)));
                return Ok(d);
            }
        }
        let d = Arc::new(DeviceAdapter::upload(a, device)?);
        held.push_front((a.id(), Arc::clone(&d)));
        held.truncate(self.capacity);
        Ok(d)
    }
}
