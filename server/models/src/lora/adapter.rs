//! One loaded adapter: a low-rank pair `(A, B)` and its scale for each
//! targeted projection of each layer, held as f32 on the host.

use std::sync::atomic::{AtomicU64, Ordering};

use half::f16;
use half::vec::HalfFloatVecExt;
use sha2::{Digest, Sha256};

use super::{Target, refuse};
use crate::arch::Family;
use crate::error::Result;
use crate::spec::ModelSpec;

/// The base model's shapes an adapter must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraShapes {
    /// Decoder layers.
    pub layers: usize,
    /// `(out, in)` of each target, by [`Target::index`].
    pub dims: [(usize, usize); 7],
    /// `(heads, kv_heads)` where llama.cpp stores q/k rows interleaved
    /// (the llama family), so a GGUF LoRA's `B` of q/k must be put back.
    pub gguf_unpermute: Option<(usize, usize)>,
    /// `(heads, kv_heads)` where the checkpoints' q/k rows rotate in pairs
    /// (Llama 4), so a PEFT adapter's `B` of q/k is regrouped as the base
    /// weights are.
    pub peft_unpermute: Option<(usize, usize)>,
    /// Layers whose feed-forward is a mixture of experts: an adapter of
    /// their gate/up/down is refused (experts take no adapters).
    pub expert_layers: Vec<usize>,
    /// Why the model takes no adapter at all, where it does not: its
    /// layers' projections differ in shape (Gemma 4's).
    pub refused: Option<&'static str>,
}

impl LoraShapes {
    /// The shapes of `s`'s projections (any family: each has the seven).
    pub fn of(s: &ModelSpec) -> Self {
        let (h, q, kv, i) = (s.hidden, s.q_dim(), s.kv_dim(), s.intermediate);
        // A gated query projection (Qwen3.5) emits each head's gate too.
        let gated = (s.layers.iter()).any(|l| l.attention().is_some_and(|a| a.gated));
        let q_out = if gated { 2 * q } else { q };
        let family = Family::by_gguf(s.family).ok();
        let unpermute = family.is_some_and(|f| f.gguf_permuted_qk);
        let pairs = family.is_some_and(|f| f.hf_rope_pairs);
        LoraShapes {
            layers: s.layers.len(),
            dims: [(q_out, h), (kv, h), (kv, h), (h, q), (i, h), (i, h), (h, i)],
            gguf_unpermute: unpermute.then_some((s.heads, s.kv_heads)),
            peft_unpermute: pairs.then_some((s.heads, s.kv_heads)),
            expert_layers: (s.layers.iter().enumerate())
                .filter(|(_, l)| l.moe().is_some())
                .map(|(i, _)| i)
                .collect(),
            refused: uneven(s).then_some(
                "the base's layers differ in projection shapes (Gemma 4's full and \
                 shared-KV layers): adapters on it are not served yet",
            ),
        }
    }

    /// `(out, in)` of `target`.
    pub fn dims(&self, target: Target) -> (usize, usize) {
        self.dims[target.index()]
    }
}

/// One projection's update `scale * B @ A`, `A` `(rank, cols)` and `B`
/// `(rows, rank)`, held in f16 (half the bytes a step streams from memory,
/// which bounds the update's speed; the arithmetic is f32). `B` is held
/// transposed so each output row is a sum of contiguous scaled rows.
#[derive(Debug, Clone)]
pub struct LoraPair {
    rank: usize,
    cols: usize,
    rows: usize,
    scale: f32,
    a: Vec<f16>,
    b_t: Vec<f16>,
}

impl LoraPair {
    /// A pair from `a` `(rank, cols)` and `b` `(rows, rank)`, row-major.
    /// Lengths must agree (the loaders check shapes first); a value beyond
    /// f16's range is refused too.
    pub fn new(a: &[f32], b: &[f32], rank: usize, rows: usize, scale: f32) -> Option<Self> {
        let cols = a.len().checked_div(rank)?;
        if rank == 0 || a.len() != rank * cols || Some(b.len()) != rows.checked_mul(rank) {
            return None;
        }
        let limit = f16::MAX.to_f32();
        if a.iter().chain(b).any(|v| !v.is_finite() || v.abs() > limit) {
            return None;
        }
        let mut b_t = vec![0f32; b.len()];
        for (o, row) in b.chunks_exact(rank).enumerate() {
            for (j, &v) in row.iter().enumerate() {
                b_t[j * rows + o] = v;
            }
        }
        Some(LoraPair {
            rank,
            cols,
            rows,
            scale,
            a: Vec::from_f32_slice(a),
            b_t: Vec::from_f32_slice(&b_t),
        })
    }

    /// The rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// `(out, in)`.
    pub fn dims(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// The scale (`alpha / rank`, or `alpha / sqrt(rank)` with rsLoRA).
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// `A`, `(rank, in)` row-major.
    pub fn a(&self) -> &[f16] {
        &self.a
    }

    /// `B^T`, `(rank, out)` row-major.
    pub fn b_t(&self) -> &[f16] {
        &self.b_t
    }

    fn bytes(&self) -> u64 {
        ((self.a.len() + self.b_t.len()) * 2) as u64
    }
}

/// Numbers each load, so a device keeps one copy per load.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A loaded adapter: its pairs by layer and target.
#[derive(Debug)]
pub struct LoraAdapter {
    name: String,
    id: u64,
    shapes: LoraShapes,
    layers: Vec<[Option<LoraPair>; 7]>,
    digest: String,
}

impl LoraAdapter {
    /// An adapter from its pairs, one array per layer of the base whose
    /// shapes are `shapes` (see [`assemble`] for the checked way).
    fn new(name: &str, shapes: &LoraShapes, layers: Vec<[Option<LoraPair>; 7]>) -> Self {
        let mut h = Sha256::new();
        for (i, l) in layers.iter().enumerate() {
            for (t, p) in l.iter().enumerate() {
                let Some(p) = p else { continue };
                h.update(format!(
                    "{i}.{t}.{}.{}.{}.{}|",
                    p.rank, p.rows, p.cols, p.scale
                ));
                p.a.iter()
                    .chain(&p.b_t)
                    .for_each(|v| h.update(v.to_bits().to_le_bytes()));
            }
        }
        let digest: [u8; 32] = h.finalize().into();
        LoraAdapter {
            name: name.to_string(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            shapes: shapes.clone(),
            layers,
            digest: digest[..12].iter().map(|b| format!("{b:02x}")).collect(),
        }
    }

    /// The name it was loaded as.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Unique to this load (two loads of one file differ).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The digest of its weights: equal for equal adapters, whatever file
    /// or process loaded them.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// What the prefix cache salts this adapter's chains with.
    pub fn cache_key(&self) -> String {
        format!("{}@{}", self.name, self.digest)
    }

    /// The pair of `target` in `layer`, if the adapter updates it.
    pub fn pair(&self, layer: usize, target: Target) -> Option<&LoraPair> {
        self.layers.get(layer)?[target.index()].as_ref()
    }

    /// The base's shapes it was checked against.
    pub fn shapes(&self) -> &LoraShapes {
        &self.shapes
    }

    /// Layers of the base it was checked against.
    pub fn layers(&self) -> usize {
        self.layers.len()
    }

    /// The largest rank among its pairs.
    pub fn rank(&self) -> usize {
        self.pairs().map(LoraPair::rank).max().unwrap_or(0)
    }

    /// The targets it updates in some layer.
    pub fn targets(&self) -> Vec<Target> {
        Target::ALL
            .into_iter()
            .filter(|t| self.layers.iter().any(|l| l[t.index()].is_some()))
            .collect()
    }

    /// Bytes its weights take as held (f16).
    pub fn bytes(&self) -> u64 {
        self.pairs().map(LoraPair::bytes).sum()
    }

    fn pairs(&self) -> impl Iterator<Item = &LoraPair> {
        self.layers.iter().flatten().flatten()
    }

    /// Refuses an adapter with a rank above `max_rank`, or with no pairs.
    pub fn check_rank(&self, max_rank: usize) -> Result<()> {
        if self.pairs().next().is_none() {
            return Err(refuse(&self.name, "it updates no projection"));
        }
        let rank = self.rank();
        if rank > max_rank {
            return Err(refuse(
                &self.name,
                format!("rank {rank} is above --max-lora-rank {max_rank}"),
            ));
        }
        Ok(())
    }
}

/// Whether `s`'s layers' projections differ in shape from layer to layer:
/// heads of their own, no k or v projection, MLPs of several widths.
fn uneven(s: &ModelSpec) -> bool {
    let odd = |a: &crate::spec::AttentionSpec| {
        a.kv.shape.is_some() || a.kv.shared_from.is_some() || a.kv.values_from_keys
    };
    !s.ffn_widths.is_empty() || s.layers.iter().any(|l| l.attention().is_some_and(odd))
}

/// Collects `(layer, target, pair)` into one array per layer, refusing a
/// pair whose shape is not the base's or a layer the base does not have.
pub(crate) fn assemble(
    name: &str,
    shapes: &LoraShapes,
    pairs: Vec<(usize, Target, LoraPair)>,
) -> Result<LoraAdapter> {
    if let Some(why) = shapes.refused {
        return Err(refuse(name, why));
    }
    let mut layers: Vec<[Option<LoraPair>; 7]> =
        (0..shapes.layers).map(|_| Default::default()).collect();
    for (layer, target, pair) in pairs {
        let want = shapes.dims(target);
        let Some(slot) = layers.get_mut(layer) else {
            return Err(refuse(
                name,
                format!("it updates layer {layer}, the base has {}", shapes.layers),
            ));
        };
        if matches!(target, Target::Gate | Target::Up | Target::Down)
            && shapes.expert_layers.contains(&layer)
        {
            return Err(refuse(
                name,
                format!(
                    "layer {layer} {}: the layer is a mixture of experts, whose experts take no adapters",
                    target.module()
                ),
            ));
        }
        if pair.dims() != want {
            return Err(refuse(
                name,
                format!(
                    "layer {layer} {}: (out, in) {:?}, the base model's is {want:?}",
                    target.module(),
                    pair.dims()
                ),
            ));
        }
        slot[target.index()] = Some(pair);
    }
    Ok(LoraAdapter::new(name, shapes, layers))
}
