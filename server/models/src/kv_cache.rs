//! The paged KV cache of one KV group: one K and one V tensor per layer of
//! the group (K alone for latent attention, whose one vector a token is
//! both), of `num_blocks * block_size` token slots, in the KV dtype the
//! plan counts. Which blocks belong to which sequence is the caller's
//! business (ferrox-core's `BlockLease`); this only stores and addresses
//! slots. A windowed group's tables hold `RELEASED` where the window has
//! left; addressing such a position is an error, never a stray slot.

use candle_core::{DType, Device, Tensor};
use ferrox_plan::KvDtype;

use crate::error::{Error, Result};

/// The candle dtype a KV cache is held in.
pub fn kv_candle_dtype(dtype: KvDtype) -> Result<DType> {
    match dtype {
        KvDtype::F32 => Ok(DType::F32),
        KvDtype::F16 => Ok(DType::F16),
        KvDtype::Bf16 => Ok(DType::BF16),
        KvDtype::Fp8 => Err(Error::Input(
            "an fp8 KV cache is not supported; use f16, bf16 or f32".into(),
        )),
    }
}

/// Zeros whose memory is really allocated now. On CPU a plain `zeros` may
/// come from `calloc` and only be mapped when first written; the pool is
/// touched at start instead, so the memory the plan counts is held from the
/// first second (a plan that does not fit fails at start, not under load).
fn resident_zeros(
    shape: (usize, usize),
    dtype: DType,
    device: &Device,
) -> candle_core::Result<Tensor> {
    fn touched<T: candle_core::WithDType>(n: usize, zero: T) -> Vec<T> {
        // `resize` writes every element (a `vec![0; n]` may not).
        let mut v = Vec::with_capacity(n);
        v.resize(n, zero);
        v
    }
    let n = shape.0 * shape.1;
    match (device.is_cpu(), dtype) {
        (true, DType::F32) => Tensor::from_vec(touched(n, 0f32), shape, device),
        (true, DType::F16) => Tensor::from_vec(touched(n, half::f16::ZERO), shape, device),
        (true, DType::BF16) => Tensor::from_vec(touched(n, half::bf16::ZERO), shape, device),
        _ => Tensor::zeros(shape, dtype, device),
    }
}

/// K and V slots for every layer.
#[derive(Debug)]
pub struct KvCache {
    k: Vec<Tensor>,
    /// Empty for a K-only (latent) cache.
    v: Vec<Tensor>,
    block_size: usize,
    num_blocks: usize,
    kv_dim: usize,
}

impl KvCache {
    /// Allocates `num_blocks` blocks of `block_size` slots for `layers`
    /// layers, held in `dtype`; V too where `values` (not for a latent
    /// cache, whose one vector a token is read as both).
    pub fn new(
        layers: usize,
        (num_blocks, block_size): (usize, usize),
        (kv_dim, values): (usize, bool),
        dtype: KvDtype,
        device: &Device,
    ) -> Result<Self> {
        if block_size == 0 || num_blocks == 0 {
            return Err(Error::Input(
                "KV cache needs at least one block of one slot".into(),
            ));
        }
        let slots = num_blocks
            .checked_mul(block_size)
            .ok_or_else(|| Error::Input("KV cache size overflows".into()))?;
        let dtype = kv_candle_dtype(dtype)?;
        let zeros = || resident_zeros((slots, kv_dim), dtype, device);
        let k = (0..layers)
            .map(|_| zeros())
            .collect::<candle_core::Result<_>>()?;
        let v = (0..if values { layers } else { 0 })
            .map(|_| zeros())
            .collect::<candle_core::Result<_>>()?;
        Ok(KvCache {
            k,
            v,
            block_size,
            num_blocks,
            kv_dim,
        })
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks per layer.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Bytes of every layer's K and V, as allocated.
    pub fn bytes(&self) -> u64 {
        let all = self.k.iter().chain(&self.v);
        all.map(crate::linear::tensor_bytes).sum()
    }

    /// The element type K and V are held in.
    pub fn dtype(&self) -> DType {
        self.k.first().map_or(DType::F32, Tensor::dtype)
    }

    /// Layer `layer`'s K and V tensors, `(slots, kv_dim)` (K twice in a
    /// K-only cache).
    pub fn layer(&self, layer: usize) -> (&Tensor, &Tensor) {
        (&self.k[layer], self.v.get(layer).unwrap_or(&self.k[layer]))
    }

    /// Whether V is kept beside K (not in a latent cache).
    pub fn has_values(&self) -> bool {
        !self.v.is_empty()
    }

    /// Every tensor held, K then V a layer, in layer order.
    fn tensors(&self) -> impl Iterator<Item = &Tensor> {
        let v = |i: usize| self.v.get(i);
        self.k
            .iter()
            .enumerate()
            .flat_map(move |(i, k)| std::iter::once(k).chain(v(i)))
    }

    /// The slot of position `pos` in a sequence with block table `blocks`.
    pub fn slot(&self, blocks: &[u32], pos: usize) -> Result<usize> {
        let block = *blocks.get(pos / self.block_size).ok_or_else(|| {
            Error::Input(format!(
                "position {pos} is past the sequence's {} blocks of {}",
                blocks.len(),
                self.block_size
            ))
        })?;
        if block == ferrox_core::RELEASED {
            return Err(Error::Input(format!(
                "position {pos} is in a block its window gave back"
            )));
        }
        let block = block as usize;
        if block >= self.num_blocks {
            return Err(Error::Input(format!(
                "block {block} outside the pool of {}",
                self.num_blocks
            )));
        }
        Ok(block * self.block_size + pos % self.block_size)
    }

    /// An index tensor for [`Self::write`]: each slot repeated across `kv_dim`.
    pub fn slot_index(&self, slots: &[usize], device: &Device) -> Result<Tensor> {
        let idx: Vec<u32> = slots
            .iter()
            .flat_map(|&s| std::iter::repeat_n(s as u32, self.kv_dim))
            .collect();
        Ok(Tensor::from_vec(idx, (slots.len(), self.kv_dim), device)?)
    }

    /// Bytes of one block over every layer's K and V: what
    /// [`Self::read_block`] gives and [`Self::write_block`] takes.
    pub fn block_bytes(&self) -> usize {
        (self.k.len() + self.v.len()) * self.block_size * self.kv_dim * self.dtype().size_in_bytes()
    }

    /// Block `block`'s slots of every layer, K then V a layer, in layer
    /// order, as little-endian bytes (a lower KV tier's copy).
    pub fn read_block(&self, block: usize) -> Result<Vec<u8>> {
        let start = self.block_start(block)?;
        let mut out = Vec::with_capacity(self.block_bytes());
        for t in self.tensors() {
            let slots = t.narrow(0, start, self.block_size)?.flatten_all()?;
            match slots.dtype() {
                DType::F32 => {
                    (slots.to_vec1::<f32>()?.iter()).for_each(|x| out.extend(x.to_le_bytes()))
                }
                DType::F16 => {
                    (slots.to_vec1::<half::f16>()?.iter()).for_each(|x| out.extend(x.to_le_bytes()))
                }
                DType::BF16 => (slots.to_vec1::<half::bf16>()?.iter())
                    .for_each(|x| out.extend(x.to_le_bytes())),
                other => return Err(Error::Input(format!("a KV cache of {other:?}"))),
            }
        }
        Ok(out)
    }

    /// Writes `bytes` (from [`Self::read_block`] of a cache of the same
    /// shape) into block `block`'s slots of every layer.
    pub fn write_block(&self, block: usize, bytes: &[u8]) -> Result<()> {
        let start = self.block_start(block)?;
        if bytes.len() != self.block_bytes() {
            return Err(Error::Input(format!(
                "a block of {} bytes for a cache whose blocks are {}",
                bytes.len(),
                self.block_bytes()
            )));
        }
        let shape = (self.block_size, self.kv_dim);
        let each = bytes.len() / (self.k.len() + self.v.len());
        for (t, chunk) in self.tensors().zip(bytes.chunks_exact(each)) {
            let device = t.device();
            let src = match t.dtype() {
                DType::F32 => {
                    Tensor::from_vec(le_values(chunk, f32::from_le_bytes), shape, device)?
                }
                DType::F16 => {
                    Tensor::from_vec(le_values(chunk, half::f16::from_le_bytes), shape, device)?
                }
                DType::BF16 => {
                    Tensor::from_vec(le_values(chunk, half::bf16::from_le_bytes), shape, device)?
                }
                other => return Err(Error::Input(format!("a KV cache of {other:?}"))),
            };
            t.slice_set(&src, 0, start)?;
        }
        Ok(())
    }

    /// The first slot of `block`, if it is in the pool.
    fn block_start(&self, block: usize) -> Result<usize> {
        if block >= self.num_blocks {
            return Err(Error::Input(format!(
                "block {block} outside the pool of {}",
                self.num_blocks
            )));
        }
        Ok(block * self.block_size)
    }

    /// Writes `k`, `v` (`(tokens, kv_dim)`) of `layer` into the slots named
    /// by `index` (from [`Self::slot_index`]); `v` is not read by a K-only
    /// cache. In place: no per-step copy of the cache.
    pub fn write(&self, layer: usize, index: &Tensor, k: &Tensor, v: &Tensor) -> Result<()> {
        let dtype = self.dtype();
        self.k[layer].scatter_set(index, &k.to_dtype(dtype)?.contiguous()?, 0)?;
        if let Some(cache) = self.v.get(layer) {
            cache.scatter_set(index, &v.to_dtype(dtype)?.contiguous()?, 0)?;
        }
        Ok(())
    }
}

/// Values of `N` little-endian bytes each.
fn le_values<T, const N: usize>(bytes: &[u8], from: fn([u8; N]) -> T) -> Vec<T> {
    bytes
        .chunks_exact(N)
        .map(|c| from(c.try_into().unwrap_or([0; N])))
        .collect()
}
