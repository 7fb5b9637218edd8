//! `ferrox-server generate`: one prompt through the same engine the server
//! runs, printing only the generated text on stdout (logs go to stderr).

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use ferrox_core::BatchModel;
use ferrox_core::ChatMessage;
use ferrox_engine::{EngineConfig, Event, GenerationRequest, SamplingParams};
use ferrox_models::Device;
use ferrox_models::{PagedModel, Source};

use crate::load::text::Stream;

/// One generation.
#[derive(Debug, Clone)]
pub struct GenerateConfig {
    /// Model file or directory.
    pub model: PathBuf,
    /// The prompt text.
    pub prompt: String,
    /// Wrap the prompt as one user message in the model's chat template.
    pub chat: bool,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    pub temperature: f32,
    /// Sampling seed.
    pub seed: u64,
    /// Tokens per KV block.
    pub block_size: usize,
}

/// Runs the generation, streaming text to stdout.
pub fn run(config: &GenerateConfig) -> anyhow::Result<()> {
    let path = config.model.display().to_string();
    let mut source = Source::open(&config.model).with_context(|| format!("opening {path}"))?;
    let info = source.info()?;
    let text = source
        .text()
        .with_context(|| format!("tokenizer of {path}"))?;
    let prompt = if config.chat {
        let Some(template) = &text.chat_template else {
            bail!("{path} has no chat template; drop --chat");
        };
        template.render(&[ChatMessage::new("user", config.prompt.clone())], true)?
    } else {
        config.prompt.clone()
    };
    // A chat template writes its own BOS; plain text gets the model's default.
    let ids = text.tokenizer.encode(&prompt, !config.chat)?;
    tracing::debug!(?ids, "prompt tokens");
    let total = ids.len() + config.max_tokens;
    let context = usize::try_from(info.facts.context_length)?;
    if total > context {
        bail!(
            "prompt ({}) + max tokens ({}) exceed the context of {}",
            ids.len(),
            config.max_tokens,
            context
        );
    }
    let blocks = total.div_ceil(config.block_size);
    let kv = ferrox_plan::DeviceKind::Cpu.auto_kv_dtype(info.model_half);
    let mut model = PagedModel::new(source.decoder(&Device::Cpu)?, blocks, config.block_size, kv)?;
    // One sequence: one recurrent state slot, where the model has such layers.
    model.set_state_slots(1)?;
    let engine = EngineConfig {
        max_seqs: 1,
        max_queue: 1,
        max_model_len: context,
        block_size: config.block_size,
        decode_log_interval: 0,
        pools: model.cache_pools(),
        ..EngineConfig::default()
    };
    // The worker thread ends with the process.
    let (handle, _worker) = ferrox_engine::worker::spawn(model, engine)?;
    let request = GenerationRequest {
        prompt: ids,
        max_tokens: config.max_tokens,
        sampling: SamplingParams {
            temperature: config.temperature,
            seed: config.seed,
            ..SamplingParams::default()
        },
        stop: Vec::new(),
        include_stop_str: false,
        min_tokens: 0,
        cache_salt: None,
        request_id: None,
        stop_token_ids: Vec::new(),
        eos_token_ids: text.end_of_generation.ids().to_vec(),
        ignore_eos: false,
        text: Box::new(Stream::new(Arc::new(text.tokenizer), true)),
        constraint: None,
        adapter: None,
    };
    let mut submission = handle.submit(request, Instant::now())?;
    let mut out = std::io::stdout().lock();
    loop {
        match submission.blocking_next() {
            Some(Event::Token { text, .. }) => {
                out.write_all(text.as_bytes())?;
                out.flush()?;
            }
            Some(Event::Done { text, .. }) => {
                writeln!(out, "{text}")?;
                break;
            }
            Some(Event::Error(e)) => bail!("generation failed: {e}"),
            Some(Event::Vectors { .. }) => bail!("the engine answered with vectors"),
            Some(Event::PromptLogprobs(_)) => {}
            None => bail!("the engine stopped before the generation finished"),
        }
    }
    Ok(())
}
