//! Loading the model and sizing the KV pool through the capacity plan.

use std::sync::Arc;

use anyhow::Context;
use ferrox_engine::EngineConfig;
use ferrox_plan::{ModelGeometry, Plan, PlanConfig, plan_for_blocks};

use crate::config::{KvSizing, ServeConfig};
use crate::state::Loaded;
use crate::text::CoreFrontend;

/// The engine's limits for this model, or why the pool is refused (it
/// cannot hold one `max_model_len` sequence).
pub fn engine_config(
    geometry: &ModelGeometry,
    cfg: &ServeConfig,
) -> anyhow::Result<(EngineConfig, Plan)> {
    let block_size = cfg.block_size as u64;
    let plan_config = PlanConfig {
        block_size,
        max_model_len: cfg.max_model_len.map(|n| n as u64),
        max_seqs_cap: Some(cfg.max_seqs as u64),
        ..PlanConfig::default()
    };
    let blocks = match cfg.kv {
        KvSizing::Blocks(n) => n,
        KvSizing::Memory(bytes) => bytes / (block_size * geometry.kv_bytes_per_token()).max(1),
    };
    let plan = plan_for_blocks(geometry, &plan_config, blocks)
        .context("the KV pool cannot serve this model")?;
    let engine = EngineConfig {
        max_seqs: cfg.max_seqs,
        max_queue: cfg.max_queue,
        prefill_chunk: cfg.prefill_chunk,
        max_model_len: plan.max_model_len as usize,
        block_size: cfg.block_size,
        kv_blocks: plan.kv_blocks as usize,
        decode_log_interval: cfg.decode_log_interval,
    };
    Ok((engine, plan))
}

/// Loads the model at `cfg.model`, sizes its KV pool, and starts the worker.
pub fn load(cfg: &ServeConfig) -> anyhow::Result<Loaded> {
    let started = std::time::Instant::now();
    let mut source = ferrox_models::Source::open(&cfg.model)
        .with_context(|| format!("opening {}", cfg.model.display()))?;
    let info = source.info()?;
    let (engine_config, plan) = engine_config(&info.geometry(), cfg)?;
    tracing::info!(
        kv_blocks = plan.kv_blocks,
        block_size = plan.block_size,
        kv_bytes = plan.kv_budget_bytes,
        max_model_len = plan.max_model_len,
        full_length_seqs = plan.max_seqs,
        max_seqs = engine_config.max_seqs,
        "KV pool planned"
    );
    let text = source.text().context("loading the tokenizer")?;
    let llama = source
        .decoder(&ferrox_models::Device::Cpu)
        .context("loading the weights")?;
    let model =
        ferrox_models::PagedModel::new(llama, engine_config.kv_blocks, engine_config.block_size)
            .context("allocating the KV cache")?;
    let eos = text.end_of_generation.ids().to_vec();
    let frontend = CoreFrontend::new(text.tokenizer, text.chat_template, eos);
    let (engine, _worker) =
        ferrox_engine::worker::spawn(model, engine_config).context("starting the worker thread")?;
    tracing::info!(
        secs = started.elapsed().as_secs_f64(),
        "model {} loaded",
        info.architecture
    );
    Ok(Loaded {
        engine,
        frontend: Arc::new(frontend),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn geometry() -> ModelGeometry {
        ModelGeometry {
            layers: 2,
            kv_heads: 1,
            head_dim: 4,
            kv_dtype: ferrox_plan::KvDtype::F32,
            weight_bytes: 0,
            context_length: 256,
            ..ModelGeometry::default()
        }
    }

    fn serve_config(kv: KvSizing, max_model_len: Option<usize>) -> ServeConfig {
        ServeConfig {
            model: "m.gguf".into(),
            host: "127.0.0.1".into(),
            port: 0,
            served_model_name: "m".into(),
            max_seqs: 4,
            kv,
            block_size: 16,
            prefill_chunk: 64,
            max_queue: 8,
            max_model_len,
            threads: None,
            drain_timeout: Duration::from_secs(1),
            decode_log_interval: 10,
            max_body: 1 << 20,
            http: crate::config::HttpConfig::default(),
        }
    }

    #[test]
    fn sizes_the_pool_or_refuses_it() {
        // 2 * 2 * 1 * 4 * 4 = 64 bytes a token, 1024 a block.
        let cases = [
            (KvSizing::Blocks(16), None, Some((16, 256))),
            (KvSizing::Blocks(15), None, None),
            (KvSizing::Blocks(8), Some(128), Some((8, 128))),
            (KvSizing::Memory(20 * 1024 + 5), None, Some((20, 256))),
            (KvSizing::Memory(1024), None, None),
        ];
        for (kv, len, want) in cases {
            let got = engine_config(&geometry(), &serve_config(kv, len))
                .ok()
                .map(|(e, _)| (e.kv_blocks, e.max_model_len));
            assert_eq!(got, want, "{kv:?} {len:?}");
        }
    }
}
