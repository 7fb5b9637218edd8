//! Loading the model and sizing the KV pool through the capacity plan, with
//! the memory the device really has.

use std::sync::Arc;

use anyhow::Context;
use ferrox_engine::{EngineConfig, PlanInfo, WindowPool};
use ferrox_models::ModelInfo;
use ferrox_models::memory::DeviceMemory;
use ferrox_models::memory::MemorySource;
use ferrox_models::mixer::attention::AttentionBackend;
use ferrox_plan::{
    DEFAULT_TYPICAL_SEQ_LEN, DeviceKind, KvDtype, LoraPlan, MemoryKind, Plan, PlanConfig,
    plan_default, plan_for_kv_bytes, plan_for_pools,
};

use crate::load::adapters::AdapterStore;
use crate::load::config::{KvSizing, ServeConfig};
use crate::load::text::CoreFrontend;
use crate::serve::state::Loaded;
use crate::tools::parser::ToolSetup;
use ferrox_models::lora::LoraShapes;

/// What the server runs with: the engine's limits, the plan behind them and
/// the memory figure it was made from.
#[derive(Debug, Clone)]
pub struct Sizing {
    /// The engine's limits.
    pub engine: EngineConfig,
    /// The capacity plan.
    pub plan: Plan,
    /// The KV element type.
    pub kv_dtype: KvDtype,
    /// The memory the plan was made from or checked against.
    pub memory: DeviceMemory,
    /// What sized the pool: the rule (`max-seqs-fit`, `memory-budget`) or
    /// the flag that did.
    pub sized_by: &'static str,
}

/// Plans the server for `info` on `device` with `memory` (and the activation
/// bytes a profile run measured, else the plan's estimate), or says why it
/// cannot run there with every number and what to change.
pub fn size(
    info: &ModelInfo,
    device: DeviceKind,
    memory: DeviceMemory,
    activation: Option<u64>,
    cfg: &ServeConfig,
) -> anyhow::Result<Sizing> {
    let kv_dtype = cfg
        .kv_dtype
        .unwrap_or(device.auto_kv_dtype(info.model_half));
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
        ..PlanConfig::for_device(device)
    };
    let (planned, sized_by) = match &cfg.kv {
        KvSizing::Device => match plan_default(&geometry, &config, memory_kind(memory.source)) {
            Ok((p, rule)) => (Ok(p), rule.name()),
            Err(e) => (Err(e), "memory-budget"),
        },
        KvSizing::Pools(sizes) => (
            plan_for_pools(&geometry, &config, sizes),
            if sizes.kv_blocks.is_some() {
                "kv-blocks"
            } else {
                "window-blocks"
            },
        ),
        KvSizing::Memory(bytes) => (
            plan_for_kv_bytes(&geometry, &config, *bytes),
            "kv-cache-memory",
        ),
    };
    let plan = planned.map_err(|e| {
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
        // A model with recurrent layers: the plan's state slots.
        state_slots: (plan.state_slots > 0)
            .then(|| usize::try_from(plan.state_slots))
            .transpose()
            .context("the state slots are too many")?,
        max_queue: cfg.max_queue,
        prefill_chunk: cfg.prefill_chunk,
        max_model_len: plan.max_model_len as usize,
        block_size: cfg.block_size,
        kv_blocks: usize::try_from(plan.kv_blocks).context("the KV pool is too large")?,
        windows: plan
            .windows
            .iter()
            .map(|w| {
                Ok(WindowPool {
                    window: usize::try_from(w.window)?,
                    blocks: usize::try_from(w.kv_blocks)?,
                })
            })
            .collect::<Result<_, std::num::TryFromIntError>>()
            .context("a window pool is too large")?,
        decode_log_interval: cfg.decode_log_interval,
        prefix_caching: cfg.prefix_caching,
        // Everything but the tokens that decides what a block's KV holds.
        cache_salt: format!("{}|kv={kv_dtype}", cfg.model.display()),
        max_loras: cfg.lora.as_ref().map_or(1, |l| l.max_loras),
    };
    Ok(Sizing {
        engine,
        plan,
        kv_dtype,
        memory,
        sized_by,
    })
}

impl Sizing {
    /// What `/metrics` says about the plan.
    pub fn info(&self, cfg: &ServeConfig) -> PlanInfo {
        PlanInfo {
            block_size: self.engine.block_size,
            kv_blocks: self.engine.kv_blocks,
            windows: self.engine.windows.clone(),
            kv_dtype: self.kv_dtype.name().to_string(),
            memory_utilization: cfg.memory_utilization,
            prefix_caching: self.engine.prefix_cache_on(),
            weight_bytes: self.plan.weight_bytes,
            kv_block_bytes: self.plan.block_bytes,
            memory_bytes: self.memory.bytes,
            memory_source: self.memory.source.as_str().to_string(),
            max_seqs: self.engine.max_seqs,
            max_model_len: self.engine.max_model_len,
        }
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
        KvSizing::Pools(_) => "fewer --kv-blocks or --window-blocks",
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
    // With the estimate first: what cannot fit is refused before loading.
    let sizing = size(&info, selected.kind, memory, None, cfg)?;
    let text = source.text().context("loading the tokenizer")?;
    let mut decoder = source
        .decoder(&selected.device)
        .context("loading the weights")?;
    decoder.set_fused_attention(cfg.attention == AttentionBackend::Paged);
    // RoPE tables for the served context only (and LongRoPE's factors for it).
    decoder
        .set_context(sizing.engine.max_model_len)
        .context("building the RoPE tables")?;
    let (decoder, sizing) = match selected.kind {
        DeviceKind::Cpu => (decoder, sizing),
        DeviceKind::Cuda => {
            let shape = ferrox_models::profile::ProfileShape {
                // No step holds more prompt than a sequence may.
                prefill_chunk: cfg.prefill_chunk.min(sizing.engine.max_model_len),
                max_seqs: sizing.engine.max_seqs,
                block_size: cfg.block_size,
            };
            let (decoder, measured) = ferrox_models::profile::profile(
                decoder,
                &shape,
                sizing.kv_dtype,
                &gpus,
                &selected.device,
            )
            .context("the profile run")?;
            tracing::info!(
                estimated = sizing.plan.activation_reserve_bytes,
                measured,
                "activation reserve profiled"
            );
            (
                decoder,
                size(&info, selected.kind, memory, Some(measured), cfg)?,
            )
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
    // One pool per KV group, in the order the model lists its groups.
    let blocks: Vec<usize> = sizing.engine.pools().iter().map(|p| p.blocks).collect();
    let mut model = ferrox_models::PagedModel::with_pools(
        decoder,
        &blocks,
        sizing.engine.block_size,
        sizing.kv_dtype,
    )
    .context("allocating the KV cache")?;
    if let Some(slots) = sizing.engine.state_slots {
        model
            .set_state_slots(slots)
            .context("allocating the recurrent state")?;
    }
    model.set_max_loras(sizing.engine.max_loras);
    let eos = text.end_of_generation.ids().to_vec();
    let template = text.chat_template.as_ref().map(|t| t.source());
    let tools = ToolSetup::new(cfg.tool_call_parser, template);
    tracing::info!(family = ?tools.family, describe = tools.describe, "tool calls");
    let reasoning = cfg.reasoning_parser.resolve(template);
    tracing::info!(family = ?reasoning, "reasoning");
    let frontend = CoreFrontend::new(text.tokenizer, text.chat_template, eos);
    let stall = crate::serve::fault::StallSwitch::from_env();
    let model = crate::serve::fault::Stalling::new(model, stall.clone());
    let (engine, _worker) = ferrox_engine::worker::spawn(model, sizing.engine.clone())
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
    })
}

/// The plan, once, at start.
fn log_plan(s: &Sizing) {
    let p = &s.plan;
    let windows: Vec<String> = p
        .windows
        .iter()
        .map(|w| {
            format!(
                "{} blocks of {} layers' {}-token windows",
                w.kv_blocks, w.layers, w.window
            )
        })
        .collect();
    tracing::info!(
        kv_blocks = p.kv_blocks,
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
        window_pools = windows.join(", "),
        state_slots = p.state_slots,
        state_bytes_per_seq = p.state_bytes_per_seq,
        prefix_caching = s.engine.prefix_cache_on(),
        max_model_len = p.max_model_len,
        plan_max_seqs = p.max_seqs,
        max_seqs = s.engine.max_seqs,
        "KV pool planned"
    );
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ferrox_models::{Format, KvGroup, ModelInfo};
    use ferrox_plan::{Footprint, Footprints};

    use super::*;

    /// 2 layers, 1 KV head of 4: 32 bytes of f16 KV a token, 512 a block.
    fn info() -> ModelInfo {
        let fp = |weight_bytes| Footprint {
            weight_bytes,
            kv_dtype: KvDtype::F16,
            kv_bytes_per_token: 32,
        };
        ModelInfo {
            architecture: "llama".into(),
            format: Format::Gguf,
            layers: 2,
            kv_heads: 1,
            head_dim: 4,
            kv_dtype: KvDtype::F16,
            weight_bytes: 1000,
            context_length: 256,
            hidden_size: 0,
            heads: 0,
            vocab_size: 0,
            intermediate_size: 0,
            kv_groups: vec![KvGroup {
                window: None,
                layers: vec![0, 1],
            }],
            devices: Footprints {
                cpu: fp(1000),
                cuda: fp(500),
            },
            sliding_windows: Vec::new(),
            state_bytes_per_seq: 0,
            recurrent_layers: 0,
            params: 0,
            active_params: 0,
            model_half: KvDtype::Bf16,
        }
    }

    /// `--kv-blocks n`.
    fn blocks(n: u64) -> KvSizing {
        KvSizing::Pools(ferrox_plan::PoolSizes {
            kv_blocks: Some(n),
            window_blocks: None,
        })
    }

    fn serve_config(kv: KvSizing, max_model_len: Option<usize>) -> ServeConfig {
        ServeConfig {
            model: "m.gguf".into(),
            host: "127.0.0.1".into(),
            port: 0,
            served_model_name: "m".into(),
            max_seqs: Some(4),
            kv,
            device: ferrox_models::device::DeviceChoice::Cpu,
            kv_dtype: None,
            attention: Default::default(),
            memory_utilization: 0.5,
            block_size: 16,
            prefill_chunk: 64,
            max_queue: 8,
            max_model_len,
            threads: None,
            drain_timeout: Duration::from_secs(1),
            decode_log_interval: 10,
            max_body: 1 << 20,
            http: crate::load::config::HttpConfig::default(),
            prefix_caching: true,
            default_max_tokens: 1024,
            tool_call_parser: crate::tools::parser::ParserChoice::Auto,
            reasoning_parser: crate::reasoning::choice::ReasoningChoice::Auto,
            lora: None,
            fetch: ferrox_fetch::FetchConfig {
                cache_dir: "/nonexistent".into(),
                hf_token: None,
                hf_endpoint: None,
            },
        }
    }

    fn memory(bytes: u64) -> DeviceMemory {
        DeviceMemory {
            bytes,
            source: MemorySource::CgroupV2,
        }
    }

    const OVERHEAD: u64 = 32 << 20;

    #[test]
    fn sizes_the_pool_from_the_device_or_the_flags() {
        // The activation reserve: (64 + 4) tokens x 2 k/v projections x 4 dims x 4 bytes.
        let act = 68 * 8 * 4;
        let base = 1000 + act + OVERHEAD;
        let gib = 1u64 << 30;
        let cases = [
            // Half of 1 GiB, less weights and reserves, in 512-byte blocks.
            (
                KvSizing::Device,
                None,
                gib,
                Some(((gib / 2 - base) / 512, 256, "memory-budget")),
            ),
            (KvSizing::Device, None, 2 * base, None),
            (blocks(16), None, gib, Some((16, 256, "kv-blocks"))),
            (blocks(15), None, gib, None),
            (blocks(8), Some(128), gib, Some((8, 128, "kv-blocks"))),
            // Explicit pools are checked against all the memory (no utilization).
            (
                blocks(16),
                None,
                base + 16 * 512,
                Some((16, 256, "kv-blocks")),
            ),
            (blocks(16), None, base + 16 * 512 - 1, None),
            (
                KvSizing::Memory(20 * 512 + 5),
                None,
                gib,
                Some((20, 256, "kv-cache-memory")),
            ),
            (KvSizing::Memory(512), None, gib, None),
        ];
        for (kv, len, mem, want) in cases {
            let got = size(
                &info(),
                DeviceKind::Cpu,
                memory(mem),
                None,
                &serve_config(kv.clone(), len),
            );
            let got = got.ok().map(|s| {
                assert_eq!(s.plan.activation_reserve_bytes, act);
                (
                    s.engine.kv_blocks as u64,
                    s.engine.max_model_len,
                    s.sized_by,
                )
            });
            assert_eq!(got, want, "{kv:?} {len:?} {mem}");
        }
        // A profiled reserve replaces the estimate: 10 blocks' worth more
        // activations leave 10 blocks fewer.
        let cfg = serve_config(KvSizing::Device, None);
        let measured = act + 10 * 512;
        let s = size(&info(), DeviceKind::Cpu, memory(gib), Some(measured), &cfg).unwrap();
        assert_eq!(s.plan.activation_reserve_bytes, measured);
        assert_eq!(s.engine.kv_blocks as u64, (gib / 2 - base) / 512 - 10);
    }

    #[test]
    fn with_no_flags_free_memory_is_fitted_and_a_limit_is_the_budget() {
        // 256 tokens a sequence is 16 blocks; 16 on CPU (no --max-seqs) x 16
        // + 25% = 320 blocks, in 4 GiB of MemAvailable.
        let gib = 1u64 << 30;
        let no_cap = ServeConfig {
            max_seqs: None,
            ..serve_config(KvSizing::Device, None)
        };
        let at = |bytes, source| DeviceMemory { bytes, source };
        for (source, device, want_fit) in [
            (MemorySource::MemInfo, DeviceKind::Cpu, true),
            (MemorySource::CgroupV2, DeviceKind::Cpu, false),
            (MemorySource::Cuda, DeviceKind::Cuda, false),
        ] {
            let s = size(&info(), device, at(4 * gib, source), None, &no_cap).unwrap();
            let (blocks, rule) = (s.engine.kv_blocks as u64, s.sized_by);
            if want_fit {
                assert_eq!((blocks, rule, s.engine.max_seqs), (320, "max-seqs-fit", 16));
            } else {
                // The whole budget: half of 4 GiB in 512-byte blocks, less
                // reserves (32 MiB on CPU, 768 MiB on GPU).
                assert!(
                    blocks > (2 * gib - (800 << 20)) / 512,
                    "{source:?} {blocks}"
                );
                assert_eq!(rule, "memory-budget", "{source:?}");
                // The plan's figure: 16 (CPU) or 256 (GPU) sequences at most.
                let cap = device.default_max_seqs() as usize;
                assert_eq!(s.engine.max_seqs, cap, "{source:?}");
            }
            assert_eq!(s.info(&no_cap).kv_blocks, s.engine.kv_blocks);
            assert_eq!(s.info(&no_cap).max_seqs, s.engine.max_seqs);
        }
        // Little MemAvailable: utilization bounds the fit.
        let small = size(
            &info(),
            DeviceKind::Cpu,
            at((64 << 20) + 200_000, MemorySource::MemInfo),
            None,
            &no_cap,
        )
        .unwrap();
        assert_eq!(small.sized_by, "memory-budget");
        assert!(small.engine.kv_blocks < 320);
        // A given --max-seqs is what the fit counts and what the engine runs.
        let four = serve_config(KvSizing::Device, None);
        let s = size(
            &info(),
            DeviceKind::Cpu,
            at(4 * gib, MemorySource::MemInfo),
            None,
            &four,
        )
        .unwrap();
        assert_eq!((s.engine.kv_blocks, s.engine.max_seqs), (80, 4));
    }

    #[test]
    fn the_device_decides_weights_and_kv_dtype() {
        let cfg = serve_config(blocks(16), None);
        let cpu = size(&info(), DeviceKind::Cpu, memory(1 << 30), None, &cfg).unwrap();
        let gpu = size(&info(), DeviceKind::Cuda, memory(1 << 30), None, &cfg).unwrap();
        assert_eq!((cpu.kv_dtype, cpu.plan.weight_bytes), (KvDtype::F16, 1000));
        assert_eq!((gpu.kv_dtype, gpu.plan.weight_bytes), (KvDtype::Bf16, 500));
        let f32 = ServeConfig {
            kv_dtype: Some(KvDtype::F32),
            ..cfg
        };
        let wide = size(&info(), DeviceKind::Cpu, memory(1 << 30), None, &f32).unwrap();
        assert_eq!(wide.plan.block_bytes, 2 * cpu.plan.block_bytes);
    }

    #[test]
    fn a_refusal_names_every_number_and_what_to_change() {
        let cfg = serve_config(KvSizing::Device, None);
        let err = size(&info(), DeviceKind::Cpu, memory(60 << 20), None, &cfg)
            .unwrap_err()
            .to_string();
        for part in [
            "62914560 bytes (cgroup-v2)",
            "KV in f16",
            "256 tokens a sequence",
            "weights take 1000",
            "one 256-token sequence needs 8192 bytes of KV",
            "Try a smaller --max-model-len, a higher --memory-utilization, or more memory",
        ] {
            assert!(err.contains(part), "{err} lacks {part}");
        }
        let wide = ServeConfig {
            kv: blocks(1 << 40),
            kv_dtype: Some(KvDtype::F32),
            ..cfg
        };
        let err = size(&info(), DeviceKind::Cpu, memory(1 << 30), None, &wide)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--kv-dtype f16, fewer --kv-blocks"), "{err}");
    }

    #[test]
    fn the_plan_the_metrics_export_and_the_cache_switch() {
        // The memory figure is the device's, whichever flag sized the pool.
        for (kv, caching) in [
            (blocks(16), true),
            (KvSizing::Memory(20 * 512 + 5), false),
            (KvSizing::Device, true),
        ] {
            let cfg = ServeConfig {
                prefix_caching: caching,
                ..serve_config(kv.clone(), None)
            };
            let s = size(&info(), DeviceKind::Cpu, memory(1 << 30), None, &cfg).unwrap();
            assert_eq!(s.engine.prefix_caching, caching);
            let want = PlanInfo {
                block_size: 16,
                kv_blocks: s.engine.kv_blocks,
                windows: Vec::new(),
                kv_dtype: "f16".into(),
                memory_utilization: 0.5,
                prefix_caching: caching,
                weight_bytes: 1000,
                kv_block_bytes: 512,
                memory_bytes: 1 << 30,
                memory_source: "cgroup-v2".into(),
                max_seqs: 4,
                max_model_len: 256,
            };
            assert_eq!(s.info(&cfg), want, "{kv:?}");
        }
        // The salt names the model and the KV dtype: another of either never
        // shares a cached block.
        let salt = |model: &str, kv_dtype| {
            let cfg = ServeConfig {
                model: model.into(),
                kv_dtype: Some(kv_dtype),
                ..serve_config(blocks(16), None)
            };
            size(&info(), DeviceKind::Cpu, memory(1 << 30), None, &cfg)
                .unwrap()
                .engine
                .cache_salt
        };
        let base = salt("a.gguf", KvDtype::F16);
        assert_eq!(base, salt("a.gguf", KvDtype::F16));
        assert_ne!(base, salt("b.gguf", KvDtype::F16));
        assert_ne!(base, salt("a.gguf", KvDtype::F32));
    }

    /// `info()` with one of its two layers behind a 16-token window.
    fn windowed() -> ModelInfo {
        ModelInfo {
            sliding_windows: vec![ferrox_plan::SlidingWindow {
                window: 16,
                layers: 1,
            }],
            kv_groups: vec![
                KvGroup {
                    window: None,
                    layers: vec![1],
                },
                KvGroup {
                    window: Some(16),
                    layers: vec![0],
                },
            ],
            ..info()
        }
    }

    #[test]
    fn a_windowed_model_gets_a_window_pool_beside_the_kv_pool() {
        // 16 bytes a layer-token in f16: blocks of 256 bytes in each pool.
        // A 256-token sequence takes 16 KV blocks and min(16, ceil((16 + 63)
        // / 16) + 1 = 6) window blocks.
        let cfg = serve_config(blocks(64), None);
        let s = size(&windowed(), DeviceKind::Cpu, memory(1 << 30), None, &cfg).unwrap();
        assert_eq!(s.engine.kv_blocks, 64);
        // The window pool holds as many typical sequences as the KV pool:
        // min(4 given, 64 / 16) = 4, at 6 blocks each.
        assert_eq!(
            s.engine.windows,
            [WindowPool {
                window: 16,
                blocks: 24
            }]
        );
        let info = s.info(&cfg);
        assert_eq!(info.windows, s.engine.windows);
        // No prefix cache with windows, and the metrics say so.
        assert!(!info.prefix_caching);
        // Both flags: the window pool as given, checked against one sequence.
        let both = ServeConfig {
            kv: KvSizing::Pools(ferrox_plan::PoolSizes {
                kv_blocks: Some(64),
                window_blocks: Some(vec![5]),
            }),
            ..cfg.clone()
        };
        let err = size(&windowed(), DeviceKind::Cpu, memory(1 << 30), None, &both)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("16-token window has 5 blocks, fewer than the 6"),
            "{err}"
        );
        assert!(
            err.contains("fewer --kv-blocks or --window-blocks"),
            "{err}"
        );
        // From the memory: both pools, split as the plan splits a budget.
        let device = serve_config(KvSizing::Device, None);
        let s = size(&windowed(), DeviceKind::Cpu, memory(1 << 30), None, &device).unwrap();
        assert!(s.engine.kv_blocks >= 16 && s.engine.windows[0].blocks >= 6);
        assert_eq!(s.plan.windows[0].blocks_per_seq, 6);
    }
}
