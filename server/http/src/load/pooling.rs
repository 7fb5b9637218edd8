//! Loading an embedding model: planned with no pool (weights plus one
//! batch of `--max-batch-tokens`, ferrox-plan's `plan_pooling`, checked
//! against the memory the device has), built as a pooling model (an
//! encoder, or a decoder whose attention keeps nothing), and run by the
//! pooling worker.

use std::sync::Arc;

use anyhow::Context;
use ferrox_engine::EngineConfig;
use ferrox_models::memory::DeviceMemory;
use ferrox_models::pooling::Pooling;
use ferrox_models::{ModelInfo, Source};
use ferrox_plan::{DeviceKind, PlanConfig, plan_pooling};

use crate::load::config::ServeConfig;
use crate::load::pair_prompt::PairFormat;
use crate::load::sizing::Sizing;
use crate::load::text::CoreFrontend;
use crate::openai::embeddings::EmbeddingModel;
use crate::serve::state::Loaded;
use crate::tools::parser::ToolSetup;

/// The plan of an embedding model `info` on `device` with `memory`, or
/// why it cannot run there.
pub fn size_pooling(
    info: &ModelInfo,
    device: DeviceKind,
    memory: DeviceMemory,
    cfg: &ServeConfig,
) -> anyhow::Result<Sizing> {
    let kv_dtype = device.auto_kv_dtype(info.model_half);
    let geometry = info.geometry(device, kv_dtype);
    let config = PlanConfig {
        memory_bytes: memory.bytes,
        utilization: cfg.memory_utilization,
        block_size: cfg.block_size as u64,
        max_model_len: cfg.max_model_len.map(|n| n as u64),
        max_seqs_cap: Some(cfg.max_seqs.map_or(device.default_max_seqs(), |n| n as u64)),
        ..PlanConfig::for_device(device)
    };
    let plan = plan_pooling(&geometry, &config, cfg.max_batch_tokens as u64).map_err(|e| {
        anyhow::anyhow!(
            "cannot serve this embedding model in {memory} on {device} with batches of {} \
             tokens: {e}. Try a smaller --max-model-len (one sequence's attention grows \
             with its square) or --max-batch-tokens, a higher --memory-utilization or more \
             memory",
            cfg.max_batch_tokens
        )
    })?;
    if cfg.speculative.is_some() {
        anyhow::bail!(
            "--{} drafts tokens to generate; an embedding or scoring model generates none",
            ferrox_plan::contract::flag::SPECULATIVE_CONFIG
        );
    }
    let engine = EngineConfig {
        max_seqs: usize::try_from(plan.max_seqs).context("max_seqs is too large")?,
        max_queue: cfg.max_queue,
        prefill_chunk: cfg.prefill_chunk,
        max_model_len: plan.max_model_len as usize,
        block_size: cfg.block_size,
        pools: Vec::new(),
        decode_log_interval: cfg.decode_log_interval,
        prefix_caching: false,
        cache_salt: String::new(),
        max_loras: 1,
        max_batch_tokens: cfg.max_batch_tokens,
        speculative: None,
        kv_offload: Vec::new(),
    };
    Ok(Sizing {
        engine,
        plan,
        kv_dtype,
        memory,
        sized_by: ferrox_plan::contract::flag::MAX_BATCH_TOKENS,
    })
}

/// Loads `source` as an embedding model pooling by `pooling` (or, for
/// `Task::Score`, a cross-encoder scoring through its classifier) and
/// starts the pooling worker.
pub fn load_pooling(
    cfg: &ServeConfig,
    mut source: Source,
    info: &ModelInfo,
    (task, pooling): (ferrox_plan::Task, Pooling),
    (device, memory): (&ferrox_models::device::Selected, DeviceMemory),
) -> anyhow::Result<Loaded> {
    let files = source.pooling_files()?;
    let sizing = size_pooling(info, device.kind, memory, cfg)?;
    let text = source.text().context("loading the tokenizer")?;
    let encoder = !source.spec()?.keeps_cache();
    let (model, pairs) = match task {
        // llama.cpp's GGUF of Qwen3-Reranker: its classifier is the "yes"
        // and "no" rows, its prompt the reranker's own.
        ferrox_plan::Task::Score if !encoder && files.yes_no => (
            source.label_scorer(&device.device),
            PairFormat::Qwen3Reranker,
        ),
        // A decoder with no classifier is a reranker scored by its "yes"
        // and "no" tokens (Qwen3-Reranker).
        ferrox_plan::Task::Score if !encoder && !files.classifier => {
            let id = |t: &str| {
                (text.tokenizer.token_to_id(t)).with_context(|| {
                    format!("a decoder scores by its \"yes\" and \"no\" tokens: the vocabulary has no \"{t}\"")
                })
            };
            let yes_no = (id("yes")?, id("no")?);
            let model = source.token_scorer(&device.device, yes_no);
            (model, PairFormat::Qwen3Reranker)
        }
        // A chat template carries the pair where the model has one, as
        // sentence-transformers formats it; else the tokenizer's pair.
        ferrox_plan::Task::Score => {
            let pairs = match text.chat_template.is_some() {
                true => PairFormat::ChatTemplate,
                false => PairFormat::Tokenizer,
            };
            (source.scorer(&device.device), pairs)
        }
        _ => (
            source.embedder(&device.device, pooling),
            PairFormat::Tokenizer,
        ),
    };
    let mut model = model.context("loading the weights")?;
    // Logged from the model built: a cross-encoder pools as its head
    // reads (ModernBERT's `classifier_pooling`), not as an embedder would.
    tracing::info!(
        weight_bytes = sizing.plan.weight_bytes,
        activation_bytes = sizing.plan.activation_reserve_bytes,
        overhead_bytes = sizing.plan.overhead_bytes,
        total_bytes = sizing.plan.total_bytes(),
        memory_bytes = memory.bytes,
        max_batch_tokens = cfg.max_batch_tokens,
        max_model_len = sizing.plan.max_model_len,
        pooling = %model.pooling().method,
        normalize = model.pooling().normalize,
        "pooling model planned: no KV pool"
    );
    (model.decoder_mut())
        .set_context(sizing.engine.max_model_len)
        .context("building the RoPE tables")?;
    let embedding = EmbeddingModel {
        name: cfg.served_model_name.clone(),
        vocab: usize::try_from(info.facts.vocab_size)?,
        max_model_len: sizing.engine.max_model_len,
        // A cross-encoder's "vector" is its one score; an embedder's the
        // width its last Dense module gives.
        dim: model.dim(),
        normalize: pooling.normalize,
        matryoshka: matryoshka(cfg.matryoshka.as_deref(), files.matryoshka, model.dim())?,
        prompts: files.prompts,
    };
    let eos = text.end_of_generation.ids().to_vec();
    let frontend = CoreFrontend::new(text.tokenizer, text.chat_template, eos).with_pairs(pairs);
    let (engine, _worker) = ferrox_engine::worker::spawn_pooling(model, sizing.engine.clone())
        .context("starting the pooling worker")?;
    engine.metrics().set_plan(&sizing.info(cfg));
    engine.metrics().set_model_name(&cfg.served_model_name);
    Ok(Loaded {
        engine,
        frontend: Arc::new(frontend),
        tools: ToolSetup::new(cfg.tool_call_parser, None),
        reasoning: None,
        stall: crate::serve::fault::StallSwitch::from_env(),
        adapters: None,
        task,
        embedding: Some(embedding),
    })
}

/// The Matryoshka sizes served: `--matryoshka-dimensions` over the files'
/// (each no wider than the vectors), else the files'.
fn matryoshka(
    flag: Option<&[usize]>,
    files: Option<Vec<usize>>,
    dim: usize,
) -> anyhow::Result<Option<Vec<usize>>> {
    let name = ferrox_plan::contract::flag::MATRYOSHKA_DIMENSIONS;
    let Some(sizes) = flag else {
        return Ok(files);
    };
    if let Some(wide) = sizes.iter().find(|&&s| s > dim) {
        anyhow::bail!("--{name} {wide}: wider than the model's {dim}-wide vectors");
    }
    Ok(Some(sizes.to_vec()))
}
