//! Loading the model and sizing the KV pool through the capacity plan, with
//! the memory the device really has.

use std::sync::Arc;

use anyhow::Context;
use ferrox_engine::{EngineConfig, PlanInfo};
use ferrox_models::ModelInfo;
use ferrox_models::memory::DeviceMemory;
use ferrox_models::memory::MemorySource;
use ferrox_models::mixer::attention::AttentionBackend;
use ferrox_plan::{
    CacheKind, DEFAULT_TYPICAL_SEQ_LEN, DeviceKind, KvDtype, LoraPlan, MemoryKind, PlanConfig,
    PoolSizes, plan_default, plan_for_kv_bytes, plan_for_pools,
};

use crate::load::adapters::AdapterStore;
use crate::load::config::{KvSizing, ServeConfig};
use crate::load::sizing::Sizing;
use crate::load::text::CoreFrontend;
use crate::serve::state::Loaded;
use crate::tools::parser::ToolSetup;
use ferrox_models::lora::LoraShapes;

/// Plans the server for `info` on `device` with `memory` (and the activation
/// bytes a profile run measured, else the plan's estimate), or says why it
/// cannot run there with every number and what to change. Without a draft
/// model: the server itself sizes through [`size_with_draft`].
#[cfg(test)]
pub fn size(
    info: &ModelInfo,
    device: DeviceKind,
    memory: DeviceMemory,
    activation: Option<u64>,
    cfg: &ServeConfig,
) -> anyhow::Result<Sizing> {
    size_with_draft(info, device, memory, activation, cfg, None)
}

/// As [`size`], counting a draft model's weights and its pool (as many
/// blocks as the full-attention pool's) beside the target's.
pub fn size_with_draft(
    info: &ModelInfo,
    device: DeviceKind,
    memory: DeviceMemory,
    activation: Option<u64>,
    cfg: &ServeConfig,
    draft: Option<ferrox_plan::DraftPlan>,
) -> anyhow::Result<Sizing> {
    let kv_dtype = kv_dtype(info, device, cfg);
    let geometry = info.geometry(device, kv_dtype);
    let config = PlanConfig {
        memory_bytes: memory.bytes,
        utilization: cfg.memory_utilization,
        block_size: cfg.block_size as u64,
        prefill_chunk: cfg.prefill_chunk as u64,
        max_model_len: cfg.max_model_len.map(|n| n as u64),
        max_seqs_cap: Some(cfg.max_seqs.map_or(device.default_max_seqs(), |n| n as u64)),
        // As the operator counts: what sized the pool decides `max_seqs`
        // for requests of this many tokens (admission reserves each one's own).
        typical_seq_len: Some(DEFAULT_TYPICAL_SEQ_LEN),
        activation_reserve_bytes: activation,
        adapter_bytes: lora_plan(cfg).map_or(0, |l| l.device_bytes(&geometry, device)),
        // Counted as asked (a model whose pools refuse speculation keeps
        // this reserve unused).
        speculative_tokens: cfg
            .speculative
            .map_or(0, |s| u64::from(s.num_speculative_tokens)),
        draft,
        ..PlanConfig::for_device(device)
    };
    let (planned, sized_by) = match &cfg.kv {
        KvSizing::Device => match plan_default(&geometry, &config, memory_kind(memory.source)) {
            Ok((p, rule)) => (Ok(p), rule.name()),
            Err(e) => (Err(e), "memory-budget"),
        },
        KvSizing::Pools(sizes) => (plan_for_pools(&geometry, &config, sizes), sized_by(sizes)),
        KvSizing::Memory(bytes) => (
            plan_for_kv_bytes(&geometry, &config, *bytes),
            "kv-cache-memory",
        ),
    };
    let plan = planned.map_err(|e| {
        // Not a matter of memory: the flags name a pool the model lacks.
        if let ferrox_plan::PlanError::NoSuchPool { .. } = e {
            return anyhow::anyhow!("{e}: size each with --pool KIND=N");
        }
        let len = geometry
            .context_length
            .min(cfg.max_model_len.map_or(u64::MAX, |n| n as u64));
        anyhow::anyhow!(
            "cannot serve this model in {memory} on {device} (KV in {kv_dtype}, \
             {len} tokens a sequence): {e}. Try {}",
            hints(cfg, kv_dtype).join(", ")
        )
    })?;
    let max_seqs = cfg
        .max_seqs
        .unwrap_or(usize::try_from(plan.max_seqs).context("max_seqs is too large")?);
    let engine = EngineConfig {
        max_seqs,
        max_queue: cfg.max_queue,
        prefill_chunk: cfg.prefill_chunk,
        max_model_len: plan.max_model_len as usize,
        block_size: cfg.block_size,
        pools: EngineConfig::plan_pools(&plan).context("a pool is too large")?,
        decode_log_interval: cfg.decode_log_interval,
        prefix_caching: cfg.prefix_caching,
        // Everything but the tokens that decides what a block's KV holds.
        cache_salt: format!("{}|kv={kv_dtype}", cfg.model.display()),
        max_loras: cfg.lora.as_ref().map_or(1, |l| l.max_loras),
        speculative: cfg.speculative,
        max_batch_tokens: cfg.max_batch_tokens,
        kv_offload: offload_tiers(cfg, device)?,
    };
    Ok(Sizing {
        engine,
        plan,
        kv_dtype,
        memory,
        sized_by,
    })
}

/// The KV dtype asked for, or the device's default for the model.
fn kv_dtype(info: &ModelInfo, device: DeviceKind, cfg: &ServeConfig) -> KvDtype {
    cfg.kv_dtype
        .unwrap_or(device.auto_kv_dtype(info.model_half))
}

/// The lower KV tiers asked for, refusing a host tier on a CPU server,
/// whose pool is host memory already.
fn offload_tiers(
    cfg: &ServeConfig,
    device: DeviceKind,
) -> anyhow::Result<Vec<ferrox_plan::OffloadTier>> {
    let host = cfg
        .kv_offload
        .iter()
        .any(|t| t.tier() == ferrox_plan::KvTier::Host);
    anyhow::ensure!(
        !(host && device == DeviceKind::Cpu),
        "--kv-offload host=SIZE on a CPU server: its KV pool is host memory already; \
         use disk=PATH:SIZE for a second tier"
    );
    Ok(cfg.kv_offload.clone())
}

impl Sizing {
    /// What `/metrics` says about the plan.
    pub fn info(&self, cfg: &ServeConfig) -> PlanInfo {
        PlanInfo {
            block_size: self.engine.block_size,
            pools: self.engine.pools.clone(),
            kv_dtype: self.kv_dtype.name().to_string(),
            memory_utilization: cfg.memory_utilization,
            prefix_caching: self.engine.prefix_cache_on(),
            weight_bytes: self.plan.weight_bytes,
            kv_block_bytes: self.plan.pool(CacheKind::Full).map_or(0, |p| p.block_bytes),
            memory_bytes: self.memory.bytes,
            memory_source: self.memory.source.as_str().to_string(),
            max_seqs: self.engine.max_seqs,
            max_model_len: self.engine.max_model_len,
        }
    }
}

/// The flag that sized the pools by hand, as the log and metrics name it.
fn sized_by(sizes: &PoolSizes) -> &'static str {
    if !sizes.by_kind.is_empty() {
        ferrox_plan::contract::flag::POOL
    } else if sizes.kv_blocks.is_some() {
        ferrox_plan::contract::flag::KV_BLOCKS
    } else {
        ferrox_plan::contract::flag::WINDOW_BLOCKS
    }
}

/// The adapters the plan counts, if the server serves any.
fn lora_plan(cfg: &ServeConfig) -> Option<LoraPlan> {
    cfg.lora.as_ref().map(|l| LoraPlan {
        max_loras: l.max_loras as u64,
        max_lora_rank: l.max_lora_rank as u64,
        max_cpu_loras: l.max_cpu_loras as u64,
    })
}

/// Free memory the server takes what it can use of; a limit or a GPU was
/// set aside for it.
fn memory_kind(source: MemorySource) -> MemoryKind {
    match source {
        MemorySource::MemInfo => MemoryKind::Free,
        MemorySource::CgroupV2 | MemorySource::CgroupV1 | MemorySource::Cuda => {
            MemoryKind::Reserved
        }
    }
}

/// What a user can change when the plan does not fit.
fn hints(cfg: &ServeConfig, kv_dtype: KvDtype) -> Vec<&'static str> {
    let mut out = vec!["a smaller --max-model-len"];
    if kv_dtype.bytes() > 2 {
        out.push("--kv-dtype f16");
    }
    out.push(match cfg.kv {
        KvSizing::Device => "a higher --memory-utilization",
        KvSizing::Pools(_) => "smaller --pool sizes (or --kv-blocks, --window-blocks)",
        KvSizing::Memory(_) => "a different --kv-cache-memory",
    });
    out.push("or more memory");
    out
}

/// Loads the model at `cfg.model`, sizes its KV pool, and starts the worker.
pub fn load(cfg: &ServeConfig) -> anyhow::Result<Loaded> {
    let started = std::time::Instant::now();
    let mut source = ferrox_models::Source::open(&cfg.model)
        .with_context(|| format!("opening {}", cfg.model.display()))?;
    let info = source.info()?;
    let gpus = ferrox_models::device::CudaGpus;
    let selected = ferrox_models::device::select(cfg.device, &gpus)?;
    tracing::info!(device = %selected.description, "device chosen");
    let memory = match selected.kind {
        DeviceKind::Cpu => ferrox_models::memory::host_memory(std::path::Path::new("/"))
            .context("reading the host's memory")?,
        DeviceKind::Cuda => ferrox_models::device::gpu_memory(&gpus, &selected.device)?,
    };
    let encoder = !source.spec()?.keeps_cache();
    let served =
        crate::load::task::decide(&source.pooling_files()?, encoder, cfg.task, cfg.pooling)?;
    tracing::info!(task = %served.task, "task");
    anyhow::ensure!(
        cfg.matryoshka.is_none() || served.task == ferrox_plan::Task::Embed,
        "--{}: a {} model has no vectors to cut (an embedding model's flag)",
        ferrox_plan::contract::flag::MATRYOSHKA_DIMENSIONS,
        served.task
    );
    if let Some(pooling) = served.pooling {
        let at = (&selected, memory);
        return crate::load::pooling::load_pooling(cfg, source, &info, (served.task, pooling), at);
    }
    // The draft's weights and pool are planned beside the target's.
    let draft_plan = (cfg.draft_model.as_ref())
        .map(|p| crate::load::draft::plan(p, selected.kind, kv_dtype(&info, selected.kind, cfg)))
        .transpose()?;
    // With the estimate first: what cannot fit is refused before loading.
    let sizing = size_with_draft(&info, selected.kind, memory, None, cfg, draft_plan)?;
    let text = source.text().context("loading the tokenizer")?;
    let mut decoder = source
        .decoder(&selected.device)
        .context("loading the weights")?;
    decoder.set_fused_attention(cfg.attention == AttentionBackend::Paged);
    // RoPE tables for the served context only (and LongRoPE's factors for it).
    decoder
        .set_context(sizing.engine.max_model_len)
        .context("building the RoPE tables")?;
    // The draft's weights before the pools are sized: a GPU profiles its
    // activations with the target's.
    let draft = open_draft_model(cfg, &sizing, &text.tokenizer, &selected.device)?;
    let (decoder, draft, sizing) = match selected.kind {
        DeviceKind::Cpu => (decoder, draft, sizing),
        DeviceKind::Cuda => {
            let (decoder, draft, measured) =
                profile_activations(decoder, draft, &sizing, cfg, (&gpus, &selected.device))?;
            let sizing = size_with_draft(
                &info,
                selected.kind,
                memory,
                Some(measured),
                cfg,
                draft_plan,
            )?;
            (decoder, draft, sizing)
        }
    };
    log_plan(&sizing);
    let adapters = cfg
        .lora
        .as_ref()
        .map(|l| {
            AdapterStore::start(
                &cfg.served_model_name,
                l,
                &cfg.fetch,
                LoraShapes::of(decoder.spec()),
            )
        })
        .transpose()?;
    // The plan's pools, by kind: one for each kind of cache the model keeps.
    let mut model = ferrox_models::PagedModel::with_pools(
        decoder,
        &sizing.engine.pools,
        sizing.engine.block_size,
        sizing.kv_dtype,
    )
    .context("allocating the KV cache and state slots")?;
    model.set_max_loras(sizing.engine.max_loras);
    let draft = draft
        .map(|d| {
            let pool = crate::load::draft::DraftPool {
                blocks: sizing.engine.pool(CacheKind::Full).map_or(0, |p| p.blocks),
                block_size: sizing.engine.block_size,
                kv_dtype: sizing.kv_dtype,
            };
            tracing::info!(blocks = pool.blocks, "draft model loaded");
            crate::load::draft::with_pool(d, pool)
                .map(|m| Box::new(m) as Box<dyn ferrox_core::BatchModel>)
        })
        .transpose()?;
    let eos = text.end_of_generation.ids().to_vec();
    let template = text.chat_template.as_ref().map(|t| t.source());
    let tools = ToolSetup::new(cfg.tool_call_parser, template);
    tracing::info!(family = ?tools.family, describe = tools.describe, "tool calls");
    let reasoning = cfg.reasoning_parser.resolve(template);
    tracing::info!(family = ?reasoning, "reasoning");
    let frontend = CoreFrontend::new(text.tokenizer, text.chat_template, eos);
    let stall = crate::serve::fault::StallSwitch::from_env();
    let model = crate::serve::fault::Stalling::new(model, stall.clone());
    let (engine, _worker) =
        ferrox_engine::worker::spawn_with_draft(model, draft, sizing.engine.clone())
            .context("starting the worker thread")?;
    engine.metrics().set_plan(&sizing.info(cfg));
    engine.metrics().set_model_name(&cfg.served_model_name);
    if adapters.is_some() {
        engine.metrics().enable_lora(sizing.engine.max_loras);
    }
    tracing::info!(
        secs = started.elapsed().as_secs_f64(),
        "model {} loaded",
        info.architecture
    );
    Ok(Loaded {
        engine,
        frontend: Arc::new(frontend),
        tools,
        reasoning,
        stall,
        adapters,
        task: ferrox_plan::Task::Generate,
        embedding: None,
    })
}

/// The draft model of `--speculative-config`, if one is given, without its
/// pool: refused where the target cannot speculate, before its weights are
/// read.
fn open_draft_model(
    cfg: &ServeConfig,
    sizing: &Sizing,
    tokenizer: &ferrox_core::Tokenizer,
    device: &ferrox_models::Device,
) -> anyhow::Result<Option<ferrox_models::Decoder>> {
    let Some(path) = &cfg.draft_model else {
        return Ok(None);
    };
    if let Some(why) = sizing.engine.speculation_off_reason() {
        anyhow::bail!(
            "--speculative-config names a draft model, but this model cannot speculate: {why}"
        );
    }
    let setup = crate::load::draft::DraftSetup {
        tokenizer,
        device,
        max_model_len: sizing.engine.max_model_len,
        attention: cfg.attention,
    };
    let draft = crate::load::draft::open_draft(path, &setup)?;
    tracing::info!(draft = %path.display(), "draft model opened");
    Ok(Some(draft))
}

/// The activation bytes of the worst step on a GPU: the target's, and the
/// draft's when one drafts (its forwards run between the target's, so the
/// reserve is the larger of the two).
fn profile_activations(
    decoder: ferrox_models::Decoder,
    draft: Option<ferrox_models::Decoder>,
    sizing: &Sizing,
    cfg: &ServeConfig,
    (gpus, device): (&dyn ferrox_models::device::Gpus, &ferrox_models::Device),
) -> anyhow::Result<(ferrox_models::Decoder, Option<ferrox_models::Decoder>, u64)> {
    let shape = ferrox_models::profile::ProfileShape {
        // No step holds more prompt than a sequence may.
        prefill_chunk: cfg.prefill_chunk.min(sizing.engine.max_model_len),
        max_seqs: sizing.engine.max_seqs,
        block_size: cfg.block_size,
        speculative: sizing.engine.speculative.is_some()
            && sizing.engine.speculation_off_reason().is_none(),
    };
    let profile = |d| ferrox_models::profile::profile(d, &shape, sizing.kv_dtype, gpus, device);
    let (decoder, measured) = profile(decoder).context("the profile run")?;
    let (draft, drafting) = match draft {
        Some(d) => {
            let (d, bytes) = profile(d).context("the draft's profile run")?;
            (Some(d), bytes)
        }
        None => (None, 0),
    };
    tracing::info!(
        estimated = sizing.plan.activation_reserve_bytes,
        measured,
        drafting,
        "activation reserve profiled"
    );
    Ok((decoder, draft, measured.max(drafting)))
}

/// The plan, once, at start.
fn log_plan(s: &Sizing) {
    let p = &s.plan;
    let pools: Vec<String> = p
        .pools
        .iter()
        .map(|pool| {
            format!(
                "{}={} ({} layers, {} bytes a block)",
                pool.kind, pool.blocks, pool.layers, pool.block_bytes
            )
        })
        .collect();
    tracing::info!(
        pools = pools.join(", "),
        kv_blocks = p.blocks(CacheKind::Full),
        block_size = p.block_size,
        kv_dtype = %s.kv_dtype,
        kv_bytes = p.kv_budget_bytes,
        weight_bytes = p.weight_bytes,
        params = p.params,
        active_params = p.active_params,
        activation_bytes = p.activation_reserve_bytes,
        overhead_bytes = p.overhead_bytes,
        total_bytes = p.total_bytes(),
        memory_bytes = s.memory.bytes,
        memory_source = s.memory.source.as_str(),
        rule = s.sized_by,
        prefix_caching = s.engine.prefix_cache_on(),
        max_model_len = p.max_model_len,
        plan_max_seqs = p.max_seqs,
        max_seqs = s.engine.max_seqs,
        "KV pool planned"
    );
}

#[cfg(test)]
mod tests;
