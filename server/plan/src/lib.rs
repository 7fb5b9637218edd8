//! The capacity plan shared by the operator (to plan at apply time) and the
//! server (to size its KV pool and check the plan against real memory).
//!
//! ```text
//! kv_bytes_per_token = sum over cache groups of 2 * layers * kv_heads * head_dim * kv_dtype_bytes
//!                      (full-attention layers at their own heads and head dim where they
//!                      differ; latent attention: layers * kv_latent_dim * kv_dtype_bytes;
//!                      layers that share an earlier layer's KV count nothing)
//! block_bytes        = block_size * kv_bytes_per_token
//! kv_budget          = memory * utilization - weights - activation_reserve - overhead - adapters
//! kv_blocks          = floor(kv_budget / block_bytes)
//! max_seqs           = min(cap, kv_blocks / ceil(typical_seq_len / block_size))
//! ```
//!
//! A model with recurrent layers (Mamba-2) keeps no KV there but a fixed
//! state per sequence (`state_bytes_per_seq`): a pool of state slots, one a
//! sequence, shares the budget with the KV pools as a pool whose sequences
//! each take one "block" of that size.
//!
//! Everything here is a pure function of its inputs: no I/O, no clock.

use serde::{Deserialize, Serialize};

mod cache;
pub mod contract;
mod draft;
mod error;
mod footprint;
mod groups;
mod kv_offload;
mod lora;
mod plan;
mod pool_sizes;
mod pooling;
mod pools;
mod speculative;
mod task;
mod window;

pub use cache::{CacheGroup, CacheKind, CacheSpec, KvShape};
pub use draft::DraftPlan;
pub use error::PlanError;
pub use footprint::{DeviceKind, Footprint, Footprints};
pub use kv_offload::{KvTier, OffloadTier, TierWeights, parse_size};
pub use lora::LoraPlan;
pub use plan::{Plan, PoolPlan};
pub use pool_sizes::{PoolSizes, spell_kinds};
pub use pooling::{plan_pooling, pooling_activation_bytes};
pub use speculative::{
    MAX_PROMPT_LOOKUP, MAX_SPECULATIVE_TOKENS, SpeculativeConfig, SpeculativeFlag,
};
pub use task::Task;
pub use window::{SlidingWindow, slides, window_blocks};

use pools::Layout;

/// Element type of the KV cache: the one type the plan, the server's
/// `--kv-dtype` and the operator's CRD share (lowercase on every wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
// The CRD's wording: kube puts the type's description on the optional
// `geometry.kvDtype` field, so it says what absent means there.
#[cfg_attr(
    feature = "schemars",
    schemars(
        description = "Element type of the KV cache (in a spec's geometry, absent means what the\nserver's `--kv-dtype auto` picks on the pods' device: f16 on CPU, bf16 on\na GPU)."
    )
)]
#[serde(rename_all = "lowercase")]
pub enum KvDtype {
    /// 4 bytes per element.
    F32,
    /// 2 bytes per element (the CPU server's default, as llama.cpp's).
    #[default]
    F16,
    /// 2 bytes per element.
    Bf16,
    /// 1 byte per element.
    Fp8,
}

impl KvDtype {
    /// Bytes one element takes.
    pub fn bytes(self) -> u64 {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 | KvDtype::Bf16 => 2,
            KvDtype::Fp8 => 1,
        }
    }

    /// The lowercase name (`f16`), as flags, JSON and metrics spell it.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Bf16 => "bf16",
            KvDtype::Fp8 => "fp8",
        }
    }
}

impl std::str::FromStr for KvDtype {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        [KvDtype::F32, KvDtype::F16, KvDtype::Bf16, KvDtype::Fp8]
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| format!("unknown KV dtype `{s}` (f32, f16, bf16 or fp8)"))
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The shape facts of a model that decide its memory use.
///
/// Also the operator's `spec.model.geometry` (its schema, with the
/// `schemars` feature, is this type's): a fact is declared here once.
/// Counts that may be unknown are 0, and absent on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ModelGeometry {
    /// Decoder layers.
    #[cfg_attr(feature = "schemars", schemars(range(min = 1)))]
    pub layers: u64,
    /// Key/value heads per layer (grouped-query attention).
    #[cfg_attr(feature = "schemars", schemars(range(min = 1)))]
    pub kv_heads: u64,
    /// Dimension of one head.
    #[cfg_attr(feature = "schemars", schemars(range(min = 1)))]
    pub head_dim: u64,
    /// Element type of the KV cache.
    #[serde(default)]
    pub kv_dtype: KvDtype,
    /// Bytes of weights resident in memory.
    pub weight_bytes: u64,
    /// The model's trained context length, in tokens.
    #[cfg_attr(feature = "schemars", schemars(range(min = 1)))]
    pub context_length: u64,
    /// Query heads (0 or absent if unknown: activations are then
    /// underestimated).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub heads: u64,
    /// Residual width (0 or absent if unknown).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hidden_size: u64,
    /// MLP width (0 or absent if unknown).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub intermediate_size: u64,
    /// Vocabulary size (0 or absent if unknown).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub vocab_size: u64,
    /// Layers that attend over a sliding window, by window (Gemma 2 and 3,
    /// Mistral 7B v0.1); every other layer attends to the whole sequence. A
    /// window pool per window holds only each sequence's window.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sliding_windows: Vec<SlidingWindow>,
    /// Parameters stored, every expert of a mixture counted (0 or absent if
    /// unknown): all of them are resident, so the weight bytes hold them all.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub params: u64,
    /// Parameters one token runs through: `params` less the experts it does
    /// not choose (equal to `params` for a dense model; 0 or absent if
    /// unknown).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub active_params: u64,
    /// Layers that keep a recurrent state instead of KV (Mamba-2's): out
    /// of `layers`, and of every KV count (0 or absent: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub recurrent_layers: u64,
    /// Bytes of one sequence's recurrent state over all those layers (0 or
    /// absent: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub state_bytes_per_seq: u64,
    /// Latent attention (DeepSeek-V2/V3, Kimi K2): elements each attention
    /// layer caches a token (`kv_lora_rank + qk_rope_head_dim`) instead of
    /// K and V for every head; 0 for per-head K and V.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub kv_latent_dim: u64,
    /// Key/value heads of the full-attention layers where they differ from
    /// the windowed layers' (Gemma 4's `num_global_key_value_heads`); 0 or
    /// absent: the same.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub full_kv_heads: u64,
    /// Head dimension of the full-attention layers where it differs from
    /// the windowed layers' (Gemma 4's `global_head_dim`); 0 or absent: the
    /// same.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub full_head_dim: u64,
    /// Attention layers that attend over an earlier layer's KV and keep
    /// none of their own (Gemma 4 E2B/E4B's `num_kv_shared_layers`): out of
    /// `layers`, in no cache group, counted by no pool (the sliding windows
    /// count only layers that keep KV); 0 or absent: none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub kv_shared_layers: u64,
}

/// Whether a count is absent (serialised as nothing).
fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl ModelGeometry {
    /// Bytes of K and V one token takes across all layers that keep KV, each
    /// cache group at its own shape (what a token costs while every layer
    /// holds it; windowed layers stop holding it once it leaves their
    /// window; layers that share an earlier layer's KV hold none).
    pub fn kv_bytes_per_token(&self) -> u64 {
        self.cache_groups()
            .iter()
            .map(CacheGroup::token_bytes)
            .fold(0, u64::saturating_add)
    }

    /// Layers that attend: all but the recurrent ones (those that share an
    /// earlier layer's KV included; [`ModelGeometry::kv_layers`] leaves them
    /// out).
    pub fn attention_layers(&self) -> u64 {
        self.layers.saturating_sub(self.recurrent_layers)
    }

    /// Layers that keep KV of their own: the attention layers less those
    /// that share an earlier layer's.
    pub fn kv_layers(&self) -> u64 {
        self.attention_layers()
            .saturating_sub(self.kv_shared_layers)
    }
}

/// What the plan is asked to fit into.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanConfig {
    /// Memory the server may use, summed over its devices; 0 with
    /// [`plan_for_blocks`] means "not known, do not check".
    pub memory_bytes: u64,
    /// Fraction of `memory_bytes` the server may take, in (0, 1].
    pub utilization: f64,
    /// Held back for activations and scratch of one forward pass; `None`
    /// estimates it from the geometry for a step of `prefill_chunk` prompt
    /// tokens plus one token for each of `max_seqs_cap` rows.
    pub activation_reserve_bytes: Option<u64>,
    /// Bytes per activation element (4 on CPU, which computes in f32).
    pub activation_elem_bytes: u64,
    /// Held back for the runtime itself (code, threads, CUDA context).
    pub overhead_bytes: u64,
    /// Held back per vocabulary entry for the tokenizer (on the host).
    pub tokenizer_bytes_per_token: u64,
    /// Tokens per KV block.
    pub block_size: u64,
    /// Most prompt tokens in one step (the server's `--prefill-chunk`).
    pub prefill_chunk: u64,
    /// Longest sequence to serve; `None` means the model's context length.
    pub max_model_len: Option<u64>,
    /// Upper bound on concurrent sequences; `None` means [`DEFAULT_MAX_SEQS`].
    pub max_seqs_cap: Option<u64>,
    /// Sequence length used to count how many sequences fit; `None` means
    /// `max_model_len` (every sequence may run to full length).
    pub typical_seq_len: Option<u64>,
    /// Held for LoRA adapters on this device ([`LoraPlan::device_bytes`]).
    pub adapter_bytes: u64,
    /// Draft tokens a row verifies at most in one step (speculative
    /// decoding's `num_speculative_tokens`; 0 without). Drafts come out of
    /// the step's prompt-token budget, so they add no tokens to the largest
    /// step, and they stay inside each sequence's reservation, so no KV; but
    /// each is one more vocabulary-wide logit row.
    pub speculative_tokens: u64,
    /// A draft model's weights and KV, when one proposes the drafts: its
    /// pool holds as many blocks as the full-attention pool.
    pub draft: Option<DraftPlan>,
}

/// The cap on concurrent sequences of a [`PlanConfig`] that names none
/// (vLLM's `max_num_seqs` default); callers that know the device take
/// [`DeviceKind::default_max_seqs`].
pub const DEFAULT_MAX_SEQS: u64 = 256;

/// Tokens (prompt + completion) of a typical request, which `max_seqs` is
/// counted for when the memory sized the pool (the operator's
/// `typicalSeqLen` default, and the server's).
pub const DEFAULT_TYPICAL_SEQ_LEN: u64 = 2048;

/// The prefix cache's allowance over `max_seqs` full-length sequences, in
/// percent: a quarter more blocks, so a full set of running sequences still
/// leaves cached prefixes to share (a shared system prompt, a chat's earlier
/// turns) instead of evicting them at once; more would be memory a host
/// holds for a cache that rarely grows past a few prompts.
pub const PREFIX_CACHE_ALLOWANCE_PERCENT: u64 = 25;

/// Which rule sized the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SizingRule {
    /// `max_seqs` full-length sequences plus the prefix cache's allowance
    /// (memory the host has free, which the server need not take whole).
    MaxSeqsFit,
    /// The whole budget: `memory * utilization` less weights and reserves (a
    /// container's limit or a GPU, sized for this server).
    MemoryBudget,
}

impl SizingRule {
    /// The name the log's plan line gives (`max-seqs-fit`).
    pub fn name(self) -> &'static str {
        match self {
            SizingRule::MaxSeqsFit => "max-seqs-fit",
            SizingRule::MemoryBudget => "memory-budget",
        }
    }
}

/// Blocks `max_seqs` sequences of `max_model_len` tokens need, plus
/// [`PREFIX_CACHE_ALLOWANCE_PERCENT`] (rounded up).
pub fn fit_blocks(max_seqs: u64, max_model_len: u64, block_size: u64) -> u64 {
    let seqs = max_seqs
        .max(1)
        .saturating_mul(blocks_for(max_model_len, block_size));
    seqs.saturating_add(
        seqs.saturating_mul(PREFIX_CACHE_ALLOWANCE_PERCENT)
            .div_ceil(100),
    )
}

/// The default prompt tokens per step (the server's `--prefill-chunk`).
pub const DEFAULT_PREFILL_CHUNK: u64 = 512;
/// Most tokens in one batch of an embedding model (`--max-batch-tokens`,
/// the server's default and the operator's).
pub const DEFAULT_MAX_BATCH_TOKENS: u64 = 16384;

/// The default tokens per KV block (the server's `--block-size`, the CRD's
/// `engine.blockSize`).
pub const DEFAULT_BLOCK_SIZE: u64 = 16;

/// The default fraction of the device's memory a plan may take (vLLM's
/// `gpu_memory_utilization`; `--memory-utilization`, `engine.memoryUtilization`).
pub const DEFAULT_UTILIZATION: f64 = 0.9;

impl PlanConfig {
    /// The defaults for a server on `device`: its runtime overhead and the
    /// width its activations are computed in.
    pub fn for_device(device: DeviceKind) -> Self {
        PlanConfig {
            memory_bytes: 0,
            utilization: DEFAULT_UTILIZATION,
            activation_reserve_bytes: None,
            activation_elem_bytes: match device {
                DeviceKind::Cpu => 4,
                DeviceKind::Cuda => 2,
            },
            overhead_bytes: device.runtime_overhead_bytes(),
            tokenizer_bytes_per_token: device.tokenizer_bytes_per_token(),
            block_size: DEFAULT_BLOCK_SIZE,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            max_model_len: None,
            max_seqs_cap: None,
            typical_seq_len: None,
            adapter_bytes: 0,
            speculative_tokens: 0,
            draft: None,
        }
    }

    pub(crate) fn max_seqs_cap(&self) -> u64 {
        self.max_seqs_cap.unwrap_or(DEFAULT_MAX_SEQS).max(1)
    }

    /// The runtime's bytes for `geometry`: the fixed overhead and the
    /// tokenizer's tables.
    pub fn overhead(&self, geometry: &ModelGeometry) -> u64 {
        self.overhead_bytes.saturating_add(
            geometry
                .vocab_size
                .saturating_mul(self.tokenizer_bytes_per_token),
        )
    }

    /// The activation reserve for `geometry`: given, or estimated for the
    /// largest step: a prompt chunk beside a decode row for every sequence,
    /// each row's logits and, when speculating, its drafts' (at most the
    /// chunk's budget).
    pub fn activation_reserve(&self, geometry: &ModelGeometry) -> u64 {
        self.activation_reserve_bytes.unwrap_or_else(|| {
            let cap = self.max_seqs_cap();
            let drafts = cap
                .saturating_mul(self.speculative_tokens)
                .min(self.prefill_chunk);
            geometry.activation_bytes(
                self.prefill_chunk.saturating_add(cap),
                cap.saturating_add(drafts),
                self.activation_elem_bytes,
            )
        })
    }
}

impl Default for PlanConfig {
    fn default() -> Self {
        PlanConfig::for_device(DeviceKind::Cpu)
    }
}

/// Blocks one sequence of `tokens` tokens needs.
pub fn blocks_for(tokens: u64, block_size: u64) -> u64 {
    tokens.div_ceil(block_size.max(1))
}

/// Plans the KV pools and sequence cap for `geometry` in `config`'s memory.
pub fn plan(geometry: &ModelGeometry, config: &PlanConfig) -> Result<Plan, PlanError> {
    check_inputs(geometry, config)?;
    let max_model_len = resolve_max_model_len(geometry, config.max_model_len)?;
    let usable = (config.memory_bytes as f64 * config.utilization).floor() as u64;
    let reserve = config
        .activation_reserve(geometry)
        .saturating_add(config.overhead(geometry))
        .saturating_add(config.adapter_bytes)
        .saturating_add(config.draft.map_or(0, |d| d.weight_bytes));
    let available = usable
        .saturating_sub(geometry.weight_bytes)
        .saturating_sub(reserve);
    let layout = Layout::new(geometry, config, max_model_len);
    let pools = layout.split(available);
    let planned = match layout.plan(geometry, config, max_model_len, &pools) {
        // Each pool holds one sequence only by taking more than the budget.
        Ok(_) if layout.cost(&pools) > available => Err(PlanError::PoolTooSmall {
            kv_blocks: 0,
            block_size: config.block_size,
            pool_tokens: 0,
            max_model_len,
        }),
        other => other,
    };
    planned.map_err(|e| match e {
        PlanError::PoolTooSmall { .. } | PlanError::WindowPoolTooSmall { .. } => {
            PlanError::InsufficientMemory {
                weight_bytes: geometry.weight_bytes,
                kv_per_seq_bytes: layout.most_bytes(),
                available_bytes: available,
                reserve_bytes: reserve,
                usable_bytes: usable,
                utilization: config.utilization,
                memory_bytes: config.memory_bytes,
                max_model_len,
            }
        }
        other => other,
    })
}

/// What a memory figure is to the server that plans in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    /// Memory the host has free for anyone (`MemAvailable`, no limit of
    /// the server's own): the server takes what it can use of it.
    Free,
    /// Memory set aside for this server (a container's limit, a GPU): the
    /// whole budget is the plan, as whoever set it sized it.
    Reserved,
}

/// Plans with no pool size given. In [`MemoryKind::Reserved`] memory this is
/// [`plan`]. In [`MemoryKind::Free`] memory the pools are what `max_seqs_cap`
/// full-length sequences need (with the prefix cache's allowance in the KV
/// pool, [`fit_blocks`]), never more than [`plan`] finds in `memory *
/// utilization`; the rule says which bound.
pub fn plan_default(
    geometry: &ModelGeometry,
    config: &PlanConfig,
    memory: MemoryKind,
) -> Result<(Plan, SizingRule), PlanError> {
    let budget = plan(geometry, config)?;
    let layout = Layout::new(geometry, config, budget.max_model_len);
    let fit = layout.fit(budget.max_model_len, config.block_size);
    if memory == MemoryKind::Reserved || layout.bytes(&fit) >= budget.kv_budget_bytes {
        return Ok((budget, SizingRule::MemoryBudget));
    }
    let fitted = layout.plan(geometry, config, budget.max_model_len, &fit)?;
    Ok((fitted, SizingRule::MaxSeqsFit))
}

/// Plans around an attention pool of exactly `kv_blocks` blocks (the
/// server's `--kv-blocks`), every other pool sized to hold as many typical
/// sequences; see [`plan_for_pools`].
pub fn plan_for_blocks(
    geometry: &ModelGeometry,
    config: &PlanConfig,
    kv_blocks: u64,
) -> Result<Plan, PlanError> {
    let sizes = PoolSizes {
        kv_blocks: Some(kv_blocks),
        ..PoolSizes::default()
    };
    plan_for_pools(geometry, config, &sizes)
}

/// Plans around the pool sizes given (`--pool`, `--kv-blocks`,
/// `--window-blocks`), by kind, deriving any not given so each pool holds as many typical sequences as the
/// given ones. When `config.memory_bytes` is not 0 the whole plan must fit in
/// it (utilization is not applied: the pools were chosen).
pub fn plan_for_pools(
    geometry: &ModelGeometry,
    config: &PlanConfig,
    sizes: &PoolSizes,
) -> Result<Plan, PlanError> {
    check_inputs(geometry, config)?;
    let max_model_len = resolve_max_model_len(geometry, config.max_model_len)?;
    let layout = Layout::new(geometry, config, max_model_len);
    let pools = layout.sized(sizes)?;
    within_memory(
        config,
        layout.plan(geometry, config, max_model_len, &pools)?,
    )
}

/// Plans pools that together take `kv_bytes` (the server's
/// `--kv-cache-memory`), split between them as [`plan`] splits a budget.
pub fn plan_for_kv_bytes(
    geometry: &ModelGeometry,
    config: &PlanConfig,
    kv_bytes: u64,
) -> Result<Plan, PlanError> {
    check_inputs(geometry, config)?;
    let max_model_len = resolve_max_model_len(geometry, config.max_model_len)?;
    let layout = Layout::new(geometry, config, max_model_len);
    let pools = layout.split(kv_bytes);
    within_memory(
        config,
        layout.plan(geometry, config, max_model_len, &pools)?,
    )
}

fn within_memory(config: &PlanConfig, plan: Plan) -> Result<Plan, PlanError> {
    if config.memory_bytes != 0 && plan.total_bytes() > config.memory_bytes {
        return Err(PlanError::OverMemory {
            total_bytes: plan.total_bytes(),
            weight_bytes: plan.weight_bytes,
            kv_bytes: plan.kv_budget_bytes,
            reserve_bytes: (plan.activation_reserve_bytes + plan.overhead_bytes)
                .saturating_add(plan.adapter_bytes),
            memory_bytes: config.memory_bytes,
        });
    }
    Ok(plan)
}

pub(crate) fn resolve_max_model_len(
    geometry: &ModelGeometry,
    asked: Option<u64>,
) -> Result<u64, PlanError> {
    match asked {
        None => Ok(geometry.context_length),
        Some(0) => Err(PlanError::Invalid("maxModelLen must be at least 1".into())),
        Some(n) if n > geometry.context_length => Err(PlanError::Invalid(format!(
            "maxModelLen {n} exceeds the model's context length {}",
            geometry.context_length
        ))),
        Some(n) => Ok(n),
    }
}

pub(crate) fn check_inputs(geometry: &ModelGeometry, config: &PlanConfig) -> Result<(), PlanError> {
    let invalid = |m: &str| Err(PlanError::Invalid(m.to_string()));
    // A model whose every layer is recurrent has no attention heads.
    let attends = geometry.attention_layers() > 0;
    if geometry.layers == 0 || (attends && (geometry.kv_heads == 0 || geometry.head_dim == 0)) {
        return invalid("layers, kvHeads and headDim must be at least 1");
    }
    if geometry.recurrent_layers > geometry.layers
        || (geometry.recurrent_layers > 0) != (geometry.state_bytes_per_seq > 0)
    {
        return invalid("recurrentLayers and stateBytesPerSeq must both be set, within layers");
    }
    if geometry.context_length == 0 {
        return invalid("contextLength must be at least 1");
    }
    if geometry.sliding_windows.iter().any(|s| s.window == 0) {
        return invalid("a sliding window must be at least 1 token");
    }
    let windowed = geometry
        .sliding_windows
        .iter()
        .fold(0u64, |n, s| n.saturating_add(s.layers));
    if windowed > geometry.layers {
        return invalid("slidingWindows name more layers than the model has");
    }
    check_kv_kinds(geometry, windowed)?;
    if config.block_size == 0 {
        return invalid("blockSize must be at least 1");
    }
    if !(config.utilization > 0.0 && config.utilization <= 1.0) {
        return invalid("memoryUtilization must be in (0, 1]");
    }
    Ok(())
}

/// Shared KV and full-attention head shapes: at least one layer keeps KV,
/// windows count only layers that keep it, and per-head shapes are not given
/// for latent attention.
fn check_kv_kinds(geometry: &ModelGeometry, windowed: u64) -> Result<(), PlanError> {
    let invalid = |m: String| Err(PlanError::Invalid(m));
    let (shared, attention) = (geometry.kv_shared_layers, geometry.attention_layers());
    if shared > 0 && shared >= attention {
        return invalid(format!(
            "kvSharedLayers ({shared}) must be fewer than the {attention} attention layers: \
             at least one layer must keep the KV the others share"
        ));
    }
    if shared > 0 && windowed.saturating_add(shared) > attention {
        return invalid(format!(
            "slidingWindows ({windowed} layers) and kvSharedLayers ({shared}) name more than \
             the {attention} attention layers: slidingWindows counts only layers that keep KV"
        ));
    }
    let per_head: Vec<&str> = [
        ("fullKvHeads", geometry.full_kv_heads),
        ("fullHeadDim", geometry.full_head_dim),
    ]
    .into_iter()
    .filter(|(_, n)| *n > 0)
    .map(|(name, _)| name)
    .collect();
    if geometry.kv_latent_dim > 0 && !per_head.is_empty() {
        return invalid(format!(
            "kvLatentDim caches one latent vector a layer, not per-head K and V: {} must \
             be absent with it",
            per_head.join(" and ")
        ));
    }
    Ok(())
}

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod tests;
