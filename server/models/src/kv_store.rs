//! The KV cache of every attention group: one paged [`KvCache`] per KV
//! group, sized by its own pool (found by the group's kind), and which group
//! (and which of its layers) each model layer is. A layer reads and writes
//! its group's cache through the block table of that group
//! (`SeqSpan::tables[group]`, filled from the row's table of that kind).

use candle_core::{Device, Tensor};
use ferrox_core::Pool;
use ferrox_plan::{CacheKind, KvDtype, spell_kinds};

use crate::error::{Error, Result};
use crate::kv_cache::KvCache;
use crate::seq_span::SeqSpan;
use crate::spec::KvGroup;

/// Every group's cache.
#[derive(Debug)]
pub struct KvStore {
    caches: Vec<KvCache>,
    kinds: Vec<CacheKind>,
    /// Tokens per block (every group's; also kept with no group at all).
    block_size: usize,
    /// Per model layer: its group, and its index among the group's layers
    /// (`None` for a recurrent layer, which keeps no KV).
    of_layer: Vec<Option<(usize, usize)>>,
}

impl KvStore {
    /// Caches for `groups` of a model of `layers` layers: each group holds
    /// the blocks of its kind's pool in `pools` (pools of other kinds are
    /// not this store's), of `block_size` slots of `kv_dim` values, in
    /// `dtype`. No layer may be in two groups; one in none (a recurrent
    /// layer) has no KV.
    pub fn new(
        groups: &[KvGroup],
        layers: usize,
        pools: &[Pool],
        block_size: usize,
        kv_dim: usize,
        dtype: KvDtype,
        device: &Device,
    ) -> Result<Self> {
        let shape = (block_size, kv_dim, true);
        Self::with_shape(groups, layers, pools, shape, dtype, device)
    }

    /// As [`KvStore::new`], K alone where `values` is false: a latent
    /// cache's one vector a token (`kv_dim` = its width) is read as both.
    pub fn with_shape(
        groups: &[KvGroup],
        layers: usize,
        pools: &[Pool],
        (block_size, kv_dim, values): (usize, usize, bool),
        dtype: KvDtype,
        device: &Device,
    ) -> Result<Self> {
        let dims = vec![kv_dim; groups.len()];
        let shape = (block_size, dims.as_slice(), values);
        Self::with_widths(groups, layers, pools, shape, dtype, device)
    }

    /// As [`KvStore::with_shape`], each group's K (and V) `kv_dims[g]`
    /// wide (Gemma 4's full layers' heads are not its sliding layers').
    pub fn with_widths(
        groups: &[KvGroup],
        layers: usize,
        pools: &[Pool],
        (block_size, kv_dims, values): (usize, &[usize], bool),
        dtype: KvDtype,
        device: &Device,
    ) -> Result<Self> {
        if kv_dims.len() != groups.len() {
            return Err(Error::Config(format!(
                "{} KV widths for {} groups",
                kv_dims.len(),
                groups.len()
            )));
        }
        let blocks = groups
            .iter()
            .map(|g| {
                let pool = pools.iter().find(|p| p.kind == g.kind());
                pool.map(|p| p.blocks).ok_or_else(|| {
                    let given: Vec<CacheKind> = pools.iter().map(|p| p.kind).collect();
                    Error::Input(format!(
                        "no {} pool among the pools given ({})",
                        g.kind(),
                        spell_kinds(&given)
                    ))
                })
            })
            .collect::<Result<Vec<usize>>>()?;
        let mut of_layer = vec![None; layers];
        for (g, group) in groups.iter().enumerate() {
            for (i, &layer) in group.layers.iter().enumerate() {
                match of_layer.get_mut(layer) {
                    Some(slot @ None) => *slot = Some((g, i)),
                    _ => {
                        return Err(Error::Config(format!(
                            "layer {layer} is past a {layers}-layer model, or in two KV groups"
                        )));
                    }
                }
            }
        }
        let caches = groups
            .iter()
            .zip(blocks)
            .zip(kv_dims)
            .map(|((g, n), &kv_dim)| {
                let (slots, width) = ((n, block_size), (kv_dim, values));
                KvCache::new(g.layers.len(), slots, width, dtype, device)
            })
            .collect::<Result<_>>()?;
        Ok(KvStore {
            caches,
            kinds: groups.iter().map(KvGroup::kind).collect(),
            block_size,
            of_layer,
        })
    }

    /// Groups.
    pub fn groups(&self) -> usize {
        self.caches.len()
    }

    /// Group `group`'s cache.
    pub fn cache(&self, group: usize) -> &KvCache {
        &self.caches[group]
    }

    /// Group `group`'s kind.
    pub fn kind(&self, group: usize) -> CacheKind {
        self.kinds[group]
    }

    /// Layer `layer`'s group, and its index among that group's layers.
    pub fn group_of(&self, layer: usize) -> Result<(usize, usize)> {
        self.of_layer
            .get(layer)
            .copied()
            .flatten()
            .ok_or_else(|| Error::Input(format!("layer {layer} has no KV group")))
    }

    /// Tokens per block (the same in every group).
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The pools, by kind, as the worker hands them out.
    pub fn pools(&self) -> Vec<Pool> {
        self.caches
            .iter()
            .zip(&self.kinds)
            .map(|(c, &kind)| Pool {
                kind,
                blocks: c.num_blocks(),
            })
            .collect()
    }

    /// Bytes each pool's cache holds, by kind, as allocated.
    pub fn bytes(&self) -> Vec<(CacheKind, u64)> {
        let caches = self.kinds.iter().zip(&self.caches);
        caches.map(|(&kind, c)| (kind, c.bytes())).collect()
    }

    /// The groups of `kind` (a model's full-attention layers may be more
    /// than one group only when their shapes differ).
    fn groups_of(&self, kind: CacheKind) -> impl Iterator<Item = &KvCache> {
        let caches = self.caches.iter().zip(&self.kinds);
        caches.filter(move |(_, k)| **k == kind).map(|(c, _)| c)
    }

    /// Block `block` of the pool of `kind`, every group of that kind's
    /// layers, as bytes (a lower KV tier's copy).
    pub fn read_block(&self, kind: CacheKind, block: usize) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        for cache in self.groups_of(kind) {
            out.extend(cache.read_block(block)?);
        }
        if out.is_empty() {
            return Err(Error::Input(format!("no {kind} pool to read a block of")));
        }
        Ok(out)
    }

    /// Writes `bytes` (from [`KvStore::read_block`] of a model of the same
    /// shape) into block `block` of the pool of `kind`.
    pub fn write_block(&self, kind: CacheKind, block: usize, bytes: &[u8]) -> Result<()> {
        let want: usize = self.groups_of(kind).map(KvCache::block_bytes).sum();
        if want == 0 || bytes.len() != want {
            return Err(Error::Input(format!(
                "a block of {} bytes for a {kind} pool whose blocks are {want}",
                bytes.len()
            )));
        }
        let mut rest = bytes;
        for cache in self.groups_of(kind) {
            let (mine, tail) = rest.split_at(cache.block_bytes());
            cache.write_block(block, mine)?;
            rest = tail;
        }
        Ok(())
    }

    /// Per group, an index for [`KvStore::write`]: the slot of every token
    /// of `spans`, in order, through that group's tables.
    pub fn slot_indices(&self, spans: &[SeqSpan], device: &Device) -> Result<Vec<Tensor>> {
        if let Some(s) = spans.iter().find(|s| s.tables.len() != self.groups()) {
            return Err(Error::Input(format!(
                "{} block tables for a model with {} KV groups",
                s.tables.len(),
                self.groups()
            )));
        }
        (0..self.groups())
            .map(|g| {
                let cache = &self.caches[g];
                let mut slots = Vec::new();
                for s in spans {
                    for p in s.start_pos..s.start_pos + s.n_tokens {
                        slots.push(cache.slot(&s.tables[g], p)?);
                    }
                }
                cache.slot_index(&slots, device)
            })
            .collect()
    }

    /// Writes layer `layer`'s `k`, `v` (`(tokens, kv_dim)`) into its group's
    /// cache at the slots of `slot_index` (from [`KvStore::slot_indices`]).
    pub fn write(&self, layer: usize, slot_index: &[Tensor], k: &Tensor, v: &Tensor) -> Result<()> {
        let (g, local) = self.group_of(layer)?;
        let index = slot_index
            .get(g)
            .ok_or_else(|| Error::Input(format!("no slot index for KV group {g}")))?;
        self.caches[g].write(local, index, k, v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(window: Option<usize>, layers: &[usize]) -> KvGroup {
        KvGroup {
            window,
            layers: layers.to_vec(),
        }
    }

    #[test]
    fn each_group_has_its_own_pool_and_each_layer_one_group() {
        let groups = [group(None, &[2]), group(Some(8), &[0, 1, 3])];
        let pool = |kind, blocks| Pool { kind, blocks };
        let (full, window) = (pool(CacheKind::Full, 10), pool(CacheKind::Window(8), 3));
        // Pools by kind, in any order; one of another kind is not this store's.
        let given = [pool(CacheKind::State, 2), window, full];
        let kv = KvStore::new(&groups, 4, &given, 4, 6, KvDtype::F16, &Device::Cpu).unwrap();
        assert_eq!(kv.pools(), [full, window]);
        let err = KvStore::new(&groups, 4, &[full], 4, 6, KvDtype::F16, &Device::Cpu).unwrap_err();
        assert!(
            err.to_string()
                .contains("no window:8 pool among the pools given (full)"),
            "{err}"
        );
        assert_eq!(kv.cache(1).layer(2).0.dims(), [12, 6]);
        assert_eq!(kv.group_of(3).unwrap(), (1, 2));
        assert_eq!(kv.group_of(2).unwrap(), (0, 0));
        assert!(kv.group_of(4).is_err());
        // A layer in two groups, or past the model, is refused; one in none
        // (a recurrent layer) has no KV.
        let partial = [group(None, &[0, 1]), group(Some(8), &[3])];
        let two = [pool(CacheKind::Full, 2), pool(CacheKind::Window(8), 2)];
        let kv2 = KvStore::new(&partial, 4, &two, 4, 6, KvDtype::F16, &Device::Cpu).unwrap();
        assert!(kv2.group_of(2).is_err() && kv2.group_of(3).is_ok());
        for bad in [
            vec![group(None, &[0, 1, 2]), group(Some(8), &[2, 3])],
            vec![group(None, &[0, 1, 2, 3, 4])],
        ] {
            assert!(KvStore::new(&bad, 4, &two, 4, 6, KvDtype::F16, &Device::Cpu).is_err());
        }
        // Each token's slot in each group, through that group's table.
        let span = SeqSpan {
            tables: vec![vec![7, 9], vec![ferrox_core::RELEASED, 2]],
            start_pos: 5,
            n_tokens: 2,
            state: None,
        };
        let idx = kv.slot_indices(&[span], &Device::Cpu).unwrap();
        let first = |t: &Tensor| {
            t.to_vec2::<u32>()
                .unwrap()
                .iter()
                .map(|r| r[0])
                .collect::<Vec<_>>()
        };
        assert_eq!(first(&idx[0]), [37, 38]);
        assert_eq!(first(&idx[1]), [9, 10]);
        let short = SeqSpan {
            tables: vec![vec![7, 9]],
            start_pos: 0,
            n_tokens: 1,
            state: None,
        };
        assert!(kv.slot_indices(&[short], &Device::Cpu).is_err());
    }

    #[test]
    fn a_block_reads_out_and_back_bit_exact_in_every_dtype_and_kind() {
        let groups = [group(None, &[0, 2]), group(Some(8), &[1])];
        let pools = [
            Pool {
                kind: CacheKind::Full,
                blocks: 4,
            },
            Pool {
                kind: CacheKind::Window(8),
                blocks: 3,
            },
        ];
        for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Bf16] {
            let kv = KvStore::new(&groups, 3, &pools, 2, 5, dtype, &Device::Cpu).unwrap();
            for kind in [CacheKind::Full, CacheKind::Window(8)] {
                let layers = if kind == CacheKind::Full { 2 } else { 1 };
                let want = 2 * layers * 2 * 5 * candle_dtype(dtype).size_in_bytes();
                // Values that differ in every byte, kept exactly by each dtype.
                let bytes: Vec<u8> = (0..want).map(|i| (i * 7 % 251) as u8).collect();
                let bytes = kv_bytes(&bytes, dtype);
                kv.write_block(kind, 1, &bytes).unwrap();
                assert_eq!(kv.read_block(kind, 1).unwrap(), bytes, "{dtype:?} {kind}");
                // Its neighbours are untouched; the wrong size writes nothing.
                assert!(kv.read_block(kind, 0).unwrap().iter().all(|&b| b == 0));
                let err = kv.write_block(kind, 0, &bytes[1..]).unwrap_err();
                assert!(err.to_string().contains("bytes for a"), "{err}");
                assert!(kv.read_block(kind, 0).unwrap().iter().all(|&b| b == 0));
                assert!(kv.read_block(kind, 9).is_err());
            }
            assert!(kv.read_block(CacheKind::State, 0).is_err());
        }
    }

    fn candle_dtype(dtype: KvDtype) -> candle_core::DType {
        crate::kv_cache::kv_candle_dtype(dtype).unwrap()
    }

    /// `bytes` with each element made a finite number of `dtype` (no NaN,
    /// whose bits a round trip through a float may change).
    fn kv_bytes(bytes: &[u8], dtype: KvDtype) -> Vec<u8> {
        let width = candle_dtype(dtype).size_in_bytes();
        let mut out = bytes.to_vec();
        for e in out.chunks_exact_mut(width) {
            // Clear the exponent's top bit: every value finite.
            e[width - 1] &= 0x3f;
        }
        out
    }
}
