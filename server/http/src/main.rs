//! ferrox-server: the serving sidecar. `serve` runs the OpenAI-compatible
//! server over the continuous-batching worker.

#[cfg(test)]
mod cli_tests;
#[cfg(test)]
mod fixtures;
mod load;
mod openai;
#[cfg(test)]
mod pools_tests;
mod reasoning;
mod serve;
mod tools;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use ferrox_plan::contract::flag;

use crate::load::adapters::LoraConfig;
use crate::load::config::{
    DEFAULT_MAX_CONNECTIONS, DEFAULT_READ_TIMEOUT_SECS, DEFAULT_REQUEST_TIMEOUT_SECS,
    DEFAULT_STALL_TIMEOUT_SECS, DEFAULT_STREAM_IDLE_TIMEOUT_SECS, HttpConfig, KvSizing,
    ServeConfig, parse_bytes, parse_kv_dtype, parse_secs, parse_utilization,
};

/// The Ferrox serving sidecar.
#[derive(Debug, Parser)]
#[command(name = "ferrox-server", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve a model over the OpenAI API with continuous batching.
    Serve(Box<ServeArgs>),
    /// Generate from one prompt; prints only the generated text on stdout.
    Generate(GenerateArgs),
    /// Print the model's geometry and weight bytes (for capacity planning).
    Inspect(InspectArgs),
}

/// Where downloaded models go, and how to reach the Hugging Face Hub.
#[derive(Debug, Args)]
struct FetchArgs {
    /// Cache for hf:// and https:// models (default: $HF_HOME, else ~/.cache/huggingface).
    #[arg(long, env = "FERROX_MODEL_CACHE")]
    model_cache: Option<PathBuf>,
    /// Hugging Face token, for private or gated repos.
    #[arg(long, env = "HF_TOKEN", hide_env_values = true)]
    hf_token: Option<String>,
    /// Hugging Face endpoint (e.g. a mirror).
    #[arg(long, env = "HF_ENDPOINT")]
    hf_endpoint: Option<String>,
}

impl FetchArgs {
    /// Resolves a parsed `--model` to a local path, downloading it if needed.
    fn resolve(self, source: &ferrox_fetch::ModelSource) -> anyhow::Result<PathBuf> {
        Ok(ferrox_fetch::resolve(source, &self.config()?)?)
    }

    /// Where and how downloads go.
    fn config(self) -> anyhow::Result<ferrox_fetch::FetchConfig> {
        let cache_dir = match self.model_cache {
            Some(dir) => dir,
            None => ferrox_fetch::default_cache_dir(
                std::env::var("HF_HOME").ok().as_deref(),
                std::env::var("HOME").ok().as_deref(),
            )
            .ok_or_else(|| anyhow::anyhow!("no model cache: set --model-cache, HF_HOME or HOME"))?,
        };
        Ok(ferrox_fetch::FetchConfig {
            cache_dir,
            hf_token: self.hf_token,
            hf_endpoint: self.hf_endpoint,
        })
    }
}

/// `generate`'s flags.
#[derive(Debug, Args)]
struct GenerateArgs {
    /// GGUF file or HF model directory; or file:///abs, hf://org/name[@rev][/file.gguf], https://.../file.gguf.
    #[arg(long, env = "FERROX_MODEL")]
    model: String,
    #[command(flatten)]
    fetch: FetchArgs,
    /// The prompt.
    #[arg(long)]
    prompt: String,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Compute threads (rayon's global pool).
    #[arg(long, env = "FERROX_THREADS")]
    threads: Option<usize>,
}

/// `inspect`'s flags.
#[derive(Debug, Args)]
struct InspectArgs {
    /// GGUF file or HF model directory; or file:///abs, hf://org/name[@rev][/file.gguf], https://.../file.gguf.
    #[arg(long, env = "FERROX_MODEL")]
    model: String,
    #[command(flatten)]
    fetch: FetchArgs,
    /// One line of JSON (for the operator's inspection Job).
    #[arg(long)]
    json: bool,
}

/// `serve`'s flags; each also reads a FERROX_* environment variable.
#[derive(Debug, Args)]
struct ServeArgs {
    /// GGUF file or HF model directory; or file:///abs, hf://org/name[@rev][/file.gguf], https://.../file.gguf.
    #[arg(long = flag::MODEL, env = "FERROX_MODEL")]
    model: String,
    #[command(flatten)]
    fetch: FetchArgs,
    /// Address to bind.
    #[arg(long = flag::HOST, env = "FERROX_HOST", default_value = "0.0.0.0")]
    host: String,
    /// Port to bind.
    #[arg(long = flag::PORT, env = "FERROX_PORT", default_value_t = 8000)]
    port: u16,
    /// Model name clients use (default: the model file's stem).
    #[arg(long = flag::SERVED_MODEL_NAME, env = "FERROX_SERVED_MODEL_NAME")]
    served_model_name: Option<String>,
    /// Most sequences prefilling or decoding at once (default: the plan's
    /// figure, at most 16 on CPU and 256 on GPU, as the operator plans).
    #[arg(long = flag::MAX_SEQS, env = "FERROX_MAX_SEQS")]
    max_seqs: Option<usize>,
    /// Blocks of one pool of the model's cache, by kind: `full=N` (the
    /// full-attention layers), `window:TOKENS=N` (the layers with that
    /// sliding window), `state=N` (recurrent state slots, one a sequence);
    /// repeated or comma-separated. A pool not given holds as many typical
    /// sequences as the given ones (default: all sized from the device's
    /// memory).
    #[arg(long = flag::POOL, env = "FERROX_POOL", value_delimiter = ',', value_parser = ferrox_plan::contract::parse_pool_arg, conflicts_with = "kv_cache_memory")]
    pool: Vec<(ferrox_plan::CacheKind, u64)>,
    /// Alias of `--pool full=N`; on a model whose every attention layer
    /// slides over one window, that window's pool.
    #[arg(long = flag::KV_BLOCKS, env = "FERROX_KV_BLOCKS", conflicts_with = "kv_cache_memory")]
    kv_blocks: Option<u64>,
    /// Alias of `--pool window:W=N` for each window pool, smallest window
    /// first, comma-separated.
    #[arg(long = flag::WINDOW_BLOCKS, env = "FERROX_WINDOW_BLOCKS", value_delimiter = ',', conflicts_with = "kv_cache_memory")]
    window_blocks: Option<Vec<u64>>,
    /// KV cache memory, e.g. 1GiB (default: sized from the device's memory).
    #[arg(long, env = "FERROX_KV_CACHE_MEMORY", value_parser = parse_bytes)]
    kv_cache_memory: Option<u64>,
    /// Fraction of the device's memory (the container's limit on CPU) the
    /// plan may take when neither --kv-blocks nor --kv-cache-memory is given.
    #[arg(long, env = "FERROX_MEMORY_UTILIZATION", default_value_t = ferrox_plan::DEFAULT_UTILIZATION, value_parser = parse_utilization)]
    memory_utilization: f64,
    /// Device: auto (the first CUDA GPU in a CUDA build, else CPU), cpu, cuda or cuda:N.
    #[arg(long = flag::DEVICE, env = "FERROX_DEVICE", default_value = "auto")]
    device: ferrox_models::device::DeviceChoice,
    /// KV cache element type: auto (f16 on CPU), f16, bf16 or f32.
    #[arg(long = flag::KV_DTYPE, env = "FERROX_KV_DTYPE", default_value = "auto", value_parser = parse_kv_dtype)]
    // Spelled out so clap takes `auto` as a value (None), not an absent flag.
    kv_dtype: std::option::Option<ferrox_plan::KvDtype>,
    /// Attention over the KV pool: paged (our kernel, on CPU and CUDA) or
    /// gather (tensor ops over gathered slots; to measure the kernel against).
    #[arg(long, env = "FERROX_ATTENTION_BACKEND", default_value = "paged")]
    attention_backend: ferrox_models::mixer::attention::AttentionBackend,
    /// Tokens per KV block.
    #[arg(long = flag::BLOCK_SIZE, env = "FERROX_BLOCK_SIZE", default_value_t = ferrox_plan::DEFAULT_BLOCK_SIZE as usize)]
    block_size: usize,
    /// Most prompt tokens in one prefill chunk.
    #[arg(long = flag::PREFILL_CHUNK, env = "FERROX_PREFILL_CHUNK", default_value_t = ferrox_plan::DEFAULT_PREFILL_CHUNK as usize)]
    prefill_chunk: usize,
    /// What the model serves: generate, embed or score; default what its
    /// files say (sentence-transformers' modules.json, GGUF's pooling
    /// type, an encoder's architecture).
    #[arg(long = flag::TASK, env = "FERROX_TASK")]
    task: Option<ferrox_plan::Task>,
    /// How an embedding model pools (cls, mean, last), over what its files
    /// say (logged as a warning: vectors pooled otherwise than trained are
    /// plausible and wrong).
    #[arg(long = flag::POOLING, env = "FERROX_POOLING")]
    pooling: Option<ferrox_models::pooling::PoolingMethod>,
    /// The Matryoshka sizes an embedding model's vectors may be cut to by a
    /// request's `dimensions` (`768,512,256,128`, or `any`), over what its
    /// config.json says; a GGUF file says none.
    #[arg(long = flag::MATRYOSHKA_DIMENSIONS, env = "FERROX_MATRYOSHKA_DIMENSIONS", value_parser = parse_matryoshka)]
    matryoshka_dimensions: Option<Matryoshka>,
    /// Most tokens in one embedding batch (an input longer than this is
    /// refused).
    #[arg(long = flag::MAX_BATCH_TOKENS, env = "FERROX_MAX_BATCH_TOKENS", default_value_t = ferrox_plan::DEFAULT_MAX_BATCH_TOKENS as usize)]
    max_batch_tokens: usize,
    /// Most requests waiting for admission; more get 429.
    #[arg(long = flag::MAX_QUEUE, env = "FERROX_MAX_QUEUE", default_value_t = 256)]
    max_queue: usize,
    /// Longest sequence (prompt + max_tokens); default the model's context.
    #[arg(long = flag::MAX_MODEL_LEN, env = "FERROX_MAX_MODEL_LEN")]
    max_model_len: Option<usize>,
    /// Compute threads (rayon's global pool).
    #[arg(long, env = "FERROX_THREADS")]
    threads: Option<usize>,
    /// Seconds in-flight requests get after SIGTERM.
    #[arg(long = flag::DRAIN_TIMEOUT, env = "FERROX_DRAIN_TIMEOUT", default_value_t = 30.0)]
    drain_timeout: f64,
    /// Log a decode status line every this many steps (0: never).
    #[arg(long, env = "FERROX_DECODE_LOG_INTERVAL", default_value_t = 40)]
    decode_log_interval: u64,
    /// Largest request body, e.g. 4MiB.
    #[arg(long, env = "FERROX_MAX_BODY", default_value = "4MiB", value_parser = parse_bytes)]
    max_body: u64,
    /// Compute a shared prompt prefix once: full KV blocks are cached and
    /// shared between requests.
    #[arg(long, env = "FERROX_PREFIX_CACHING", value_enum, default_value_t = Switch::On)]
    prefix_caching: Switch,
    /// Speculative decoding, vLLM's JSON: '{"method": "ngram",
    /// "num_speculative_tokens": 5, "prompt_lookup_max": 4,
    /// "prompt_lookup_min": 2}' (n-gram prompt lookup), or '{"model": PATH,
    /// "num_speculative_tokens": 4}' (a draft model sharing the target's
    /// tokenizer, with its own KV pool); used per step only while it pays;
    /// off for models with sliding-window or recurrent layers.
    #[arg(long = flag::SPECULATIVE_CONFIG, env = "FERROX_SPECULATIVE_CONFIG", value_parser = parse_speculative)]
    speculative_config: Option<ferrox_plan::SpeculativeFlag>,
    /// A lower KV tier the prefix cache's blocks are written through to,
    /// and read back from when the device pool has evicted them:
    /// host=SIZE (beside a GPU's pool) or disk=PATH:SIZE (kept across
    /// restarts and scale to zero); give the flag twice for both.
    #[arg(long = flag::KV_OFFLOAD, value_parser = ferrox_plan::OffloadTier::parse)]
    kv_offload: Vec<ferrox_plan::OffloadTier>,
    /// max_tokens of a chat request that sets none, capped by what is left of
    /// --max-model-len (admission reserves prompt + max_tokens).
    #[arg(long, env = "FERROX_DEFAULT_MAX_TOKENS", default_value_t = 1024)]
    default_max_tokens: usize,
    /// How tool calls are read out of answers: auto (from the chat template;
    /// hermes when it has no tool markup), hermes, llama3-json, or none (off).
    #[arg(long, env = "FERROX_TOOL_CALL_PARSER", default_value = "auto", value_parser = parse_tool_parser)]
    tool_call_parser: tools::parser::ParserChoice,
    /// How reasoning is read out of answers into `reasoning_content`: auto
    /// (gpt-oss's harmony, else `<think>` when the chat template writes it,
    /// else none), qwen3, deepseek-r1, gpt-oss, or none.
    #[arg(long, env = "FERROX_REASONING_PARSER", default_value = "auto", value_parser = parse_reasoning_parser)]
    reasoning_parser: reasoning::choice::ReasoningChoice,
    #[command(flatten)]
    edge: EdgeArgs,
    #[command(flatten)]
    lora: LoraFlags,
}

/// LoRA adapters (vLLM's flags).
#[derive(Debug, Args)]
struct LoraFlags {
    /// Serve LoRA adapters (implied by the other LoRA flags).
    #[arg(long = flag::ENABLE_LORA, env = "FERROX_ENABLE_LORA")]
    enable_lora: bool,
    /// Adapters loaded at start: name=source (a PEFT directory or a GGUF
    /// LoRA file, as a path, file://, hf:// or https://), or vLLM's JSON
    /// {"name": ..., "path": ...}; a request's `model` names one.
    #[arg(long = flag::LORA_MODULES, env = "FERROX_LORA_MODULES", num_args = 1.., value_parser = parse_lora_module)]
    lora_modules: Vec<(String, String)>,
    /// Most distinct adapters in one step (a request for another waits).
    #[arg(long = flag::MAX_LORAS, env = "FERROX_MAX_LORAS", default_value_t = 1)]
    max_loras: usize,
    /// The largest adapter rank loaded.
    #[arg(long = flag::MAX_LORA_RANK, env = "FERROX_MAX_LORA_RANK", default_value_t = 16)]
    max_lora_rank: usize,
    /// Adapters kept in host memory, least recently used unloaded (default:
    /// --max-loras, or the number of --lora-modules if more).
    #[arg(long = flag::MAX_CPU_LORAS, env = "FERROX_MAX_CPU_LORAS")]
    max_cpu_loras: Option<usize>,
    /// Allow POST /v1/load_lora_adapter and /v1/unload_lora_adapter (also
    /// VLLM_ALLOW_RUNTIME_LORA_UPDATING=true).
    #[arg(long = flag::ALLOW_RUNTIME_LORA_UPDATING, env = "FERROX_ALLOW_RUNTIME_LORA_UPDATING")]
    allow_runtime_lora_updating: bool,
}

/// One `--lora-modules` entry: `name=source` or `{"name": .., "path": ..}`.
fn parse_lora_module(text: &str) -> Result<(String, String), String> {
    let (name, source) = if text.trim_start().starts_with('{') {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let field = |k: &str| {
            v.get(k)
                .and_then(serde_json::Value::as_str)
                .map(str::to_string)
        };
        (field("name"), field("path").or_else(|| field("source")))
    } else {
        let (n, s) = text.split_once('=').unzip();
        (n.map(str::to_string), s.map(str::to_string))
    };
    match (name, source) {
        (Some(n), Some(s)) if !n.is_empty() && !s.is_empty() => Ok((n, s)),
        _ => Err(format!(
            "`{text}` is not name=source nor {{\"name\": .., \"path\": ..}}"
        )),
    }
}

/// Whether vLLM's variable turns runtime adapter loading on.
fn vllm_runtime_updates() -> bool {
    std::env::var("VLLM_ALLOW_RUNTIME_LORA_UPDATING")
        .is_ok_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
}

impl LoraFlags {
    /// The LoRA settings, `None` when the server serves no adapters.
    fn into_config(self, vllm_env: bool) -> anyhow::Result<Option<LoraConfig>> {
        let runtime = self.allow_runtime_lora_updating || vllm_env;
        if !self.enable_lora && self.lora_modules.is_empty() && !runtime {
            return Ok(None);
        }
        anyhow::ensure!(self.max_loras > 0, "--max-loras must be at least 1");
        anyhow::ensure!(self.max_lora_rank > 0, "--max-lora-rank must be at least 1");
        let max_cpu_loras = self
            .max_cpu_loras
            .unwrap_or(self.max_loras.max(self.lora_modules.len()));
        anyhow::ensure!(
            max_cpu_loras >= self.max_loras,
            "--max-cpu-loras ({max_cpu_loras}) must be at least --max-loras ({})",
            self.max_loras
        );
        Ok(Some(LoraConfig {
            modules: self.lora_modules,
            max_loras: self.max_loras,
            max_lora_rank: self.max_lora_rank,
            max_cpu_loras,
            allow_runtime_updates: runtime,
        }))
    }
}

/// Who may call, and the HTTP edge's limits.
#[derive(Debug, Args)]
struct EdgeArgs {
    /// A key clients must send as `Authorization: Bearer KEY` on /v1/*
    /// (repeatable; FERROX_API_KEY takes a comma-separated list). None: no auth.
    #[arg(
        long = "api-key",
        env = "FERROX_API_KEY",
        value_delimiter = ',',
        hide_env_values = true
    )]
    api_keys: Vec<String>,
    /// Seconds for a request's headers, then its body, to arrive; an idle
    /// keep-alive connection is closed after it.
    #[arg(long, env = "FERROX_READ_TIMEOUT", default_value_t = DEFAULT_READ_TIMEOUT_SECS, value_parser = secs)]
    read_timeout: f64,
    /// Seconds a non-streaming request may take; then it is cancelled (504).
    #[arg(long, env = "FERROX_REQUEST_TIMEOUT", default_value_t = DEFAULT_REQUEST_TIMEOUT_SECS, value_parser = secs)]
    request_timeout: f64,
    /// Seconds a client may accept no bytes of a response before it is
    /// abandoned (a stream's request is cancelled).
    #[arg(long, env = "FERROX_STREAM_IDLE_TIMEOUT", default_value_t = DEFAULT_STREAM_IDLE_TIMEOUT_SECS, value_parser = secs)]
    stream_idle_timeout: f64,
    /// Connections served at once; more are answered 503 and closed.
    #[arg(long, env = "FERROX_MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// Seconds one worker tick may run before /health fails (the pod restarts).
    #[arg(long, env = "FERROX_STALL_TIMEOUT", default_value_t = DEFAULT_STALL_TIMEOUT_SECS, value_parser = secs)]
    stall_timeout: f64,
}

/// `--kv-offload`: at most one of each tier.
fn offload_tiers(
    tiers: Vec<ferrox_plan::OffloadTier>,
) -> anyhow::Result<Vec<ferrox_plan::OffloadTier>> {
    for (i, t) in tiers.iter().enumerate() {
        anyhow::ensure!(
            tiers[..i].iter().all(|u| u.tier() != t.tier()),
            "--kv-offload names the {} tier twice; give each tier once",
            t.tier()
        );
    }
    Ok(tiers)
}

/// `--speculative-config`: the reason alone when refused (clap names the flag).
fn parse_speculative(text: &str) -> Result<ferrox_plan::SpeculativeFlag, String> {
    ferrox_plan::SpeculativeFlag::parse(text).map_err(|e| match e {
        ferrox_plan::PlanError::SpeculativeConfig(why) => why,
        other => other.to_string(),
    })
}

/// `--matryoshka-dimensions`: its sizes (empty: any).
#[derive(Debug, Clone)]
struct Matryoshka(Vec<usize>);

/// `--matryoshka-dimensions`: `any`, or sizes above zero, comma-separated.
fn parse_matryoshka(text: &str) -> Result<Matryoshka, String> {
    if text.trim() == "any" {
        return Ok(Matryoshka(Vec::new()));
    }
    let mut sizes = text
        .split(',')
        .map(|s| match s.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!(
                "{s:?} is not a size above zero (`768,512,256` or `any`)"
            )),
        })
        .collect::<Result<Vec<usize>, String>>()?;
    sizes.sort_unstable();
    sizes.dedup();
    Ok(Matryoshka(sizes))
}

/// `--tool-call-parser`.
fn parse_tool_parser(text: &str) -> Result<tools::parser::ParserChoice, String> {
    text.parse()
}

/// `--reasoning-parser`.
fn parse_reasoning_parser(text: &str) -> Result<reasoning::choice::ReasoningChoice, String> {
    text.parse()
}

/// A flag's seconds, checked by [`parse_secs`].
fn secs(text: &str) -> Result<f64, String> {
    parse_secs(text).map(|d| d.as_secs_f64())
}

impl EdgeArgs {
    fn into_config(self) -> anyhow::Result<HttpConfig> {
        anyhow::ensure!(
            self.max_connections > 0,
            "--max-connections must be at least 1"
        );
        Ok(HttpConfig {
            api_keys: self
                .api_keys
                .into_iter()
                .filter(|k| !k.is_empty())
                .collect(),
            read_timeout: Duration::from_secs_f64(self.read_timeout),
            request_timeout: Duration::from_secs_f64(self.request_timeout),
            stream_idle_timeout: Duration::from_secs_f64(self.stream_idle_timeout),
            max_connections: self.max_connections,
            stall_timeout: Duration::from_secs_f64(self.stall_timeout),
        })
    }
}

/// A feature switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Switch {
    On,
    Off,
}

impl ServeArgs {
    fn into_config(self) -> anyhow::Result<ServeConfig> {
        anyhow::ensure!(self.block_size > 0, "--block-size must be at least 1");
        anyhow::ensure!(self.max_seqs != Some(0), "--max-seqs must be at least 1");
        anyhow::ensure!(self.prefill_chunk > 0, "--prefill-chunk must be at least 1");
        anyhow::ensure!(
            self.max_batch_tokens > 0,
            "--max-batch-tokens must be at least 1"
        );
        anyhow::ensure!(
            self.default_max_tokens > 0,
            "--default-max-tokens must be at least 1"
        );
        anyhow::ensure!(
            self.drain_timeout.is_finite() && self.drain_timeout >= 0.0,
            "--drain-timeout must be a non-negative number of seconds"
        );
        let source = ferrox_fetch::parse(&self.model)?;
        let served_model_name = self
            .served_model_name
            .unwrap_or_else(|| source.default_name());
        let fetch = self.fetch.config()?;
        let model = ferrox_fetch::resolve(&source, &fetch)?;
        // A draft model comes from the sources the model does.
        let draft = (self.speculative_config.as_ref()).and_then(|f| f.draft_model.as_deref());
        let draft_model = draft
            .map(|d| {
                let parsed = ferrox_fetch::parse(d)?;
                ferrox_fetch::resolve(&parsed, &fetch)
                    .map_err(|e| anyhow::anyhow!("fetching the draft model {d}: {e}"))
            })
            .transpose()?;
        let lora = self.lora.into_config(vllm_runtime_updates())?;
        let sizes = ferrox_plan::PoolSizes {
            by_kind: self.pool,
            kv_blocks: self.kv_blocks,
            window_blocks: self.window_blocks,
        };
        Ok(ServeConfig {
            lora,
            fetch,
            kv: match (self.kv_cache_memory, sizes) {
                (Some(bytes), sizes) if sizes.is_empty() => KvSizing::Memory(bytes),
                (_, sizes) if sizes.is_empty() => KvSizing::Device,
                (_, sizes) => KvSizing::Pools(sizes),
            },
            device: self.device,
            kv_dtype: self.kv_dtype,
            attention: self.attention_backend,
            memory_utilization: self.memory_utilization,
            model,
            host: self.host,
            port: self.port,
            served_model_name,
            max_seqs: self.max_seqs,
            block_size: self.block_size,
            prefill_chunk: self.prefill_chunk,
            task: self.task,
            pooling: self.pooling,
            matryoshka: self.matryoshka_dimensions.map(|m| m.0),
            max_batch_tokens: self.max_batch_tokens,
            max_queue: self.max_queue,
            max_model_len: self.max_model_len,
            threads: self.threads,
            drain_timeout: Duration::from_secs_f64(self.drain_timeout),
            decode_log_interval: self.decode_log_interval,
            max_body: usize::try_from(self.max_body).unwrap_or(usize::MAX),
            prefix_caching: self.prefix_caching == Switch::On,
            speculative: self.speculative_config.as_ref().map(|f| f.config),
            draft_model,
            kv_offload: offload_tiers(self.kv_offload)?,
            default_max_tokens: self.default_max_tokens,
            tool_call_parser: self.tool_call_parser,
            reasoning_parser: self.reasoning_parser,
            http: self.edge.into_config()?,
        })
    }
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // The cause chain on one line; a user error gets no backtrace
            // even when RUST_BACKTRACE is set.
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// One malloc arena, unless `MALLOC_ARENA_MAX` says otherwise. glibc gives
/// each thread that contends for the allocator an arena of its own and
/// keeps what each one frees, so the worker, pool and HTTP threads held up
/// to 15% more than the plan counts (the tiny float model; 5% on the
/// default model); with one arena resident memory is the plan within 1%,
/// at no throughput cost measured at 32 streams (docs/benchmarks.md).
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets an allocator parameter; it is called
        // before any other thread exists.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
        }
    }
}

fn run() -> anyhow::Result<()> {
    // candle's own elementwise thread pool spins while it waits; our kernels
    // run on rayon's pool, and two busy pools on the same cores fight. The
    // elementwise ops are small, so candle gets one thread unless told
    // otherwise.
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        // SAFETY: first thing in main, before any other thread exists.
        unsafe { std::env::set_var("CANDLE_NUM_THREADS", "1") };
    }
    one_malloc_arena();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal, not in pod logs.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match Cli::parse().command {
        Command::Serve(args) => serve::server::run(args.into_config()?),
        Command::Generate(args) => {
            if let Some(n) = args.threads {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .build_global()?;
            }
            load::generate::run(&load::generate::GenerateConfig {
                model: args.fetch.resolve(&ferrox_fetch::parse(&args.model)?)?,
                prompt: args.prompt,
                chat: args.chat,
                max_tokens: args.max_tokens,
                temperature: args.temperature,
                seed: args.seed,
                block_size: 16,
            })
        }
        Command::Inspect(args) => load::inspect::run(&load::inspect::InspectConfig {
            model: args.fetch.resolve(&ferrox_fetch::parse(&args.model)?)?,
            json: args.json,
        }),
    }
}
