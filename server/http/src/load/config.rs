//! The server's typed configuration, built from the CLI in `main.rs`.

use std::path::PathBuf;
use std::time::Duration;

use ferrox_models::device::DeviceChoice;
use ferrox_plan::{KvDtype, PoolSizes};

use crate::tools::parser::ParserChoice;

/// How the KV pools are sized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvSizing {
    /// Pools of exactly these sizes (`--kv-blocks`, `--window-blocks`); a
    /// pool not given holds as many typical sequences as the given ones.
    Pools(PoolSizes),
    /// As many blocks as fit in this many bytes, split between the pools as
    /// the plan splits a budget.
    Memory(u64),
    /// What the plan leaves of `--memory-utilization` of the device's memory.
    Device,
}

/// Parses `--kv-dtype`: `auto` (`None`: the device's default, see
/// `DeviceKind::auto_kv_dtype`), `f16`, `bf16` or `f32`.
pub fn parse_kv_dtype(text: &str) -> Result<Option<KvDtype>, String> {
    match text {
        "auto" => Ok(None),
        "fp8" => Err("an fp8 KV cache is not supported yet; use auto, f16, bf16 or f32".into()),
        other => other
            .parse()
            .map(Some)
            .map_err(|_| format!("`{other}` is not a KV dtype (auto, f16, bf16 or f32)")),
    }
}

/// Parses `--memory-utilization`: a fraction in (0, 1].
pub fn parse_utilization(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
        _ => Err(format!("`{text}` is not a fraction in (0, 1], e.g. 0.9")),
    }
}

/// Everything `serve` needs.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// GGUF file or Hugging Face directory.
    pub model: PathBuf,
    /// Address to bind.
    pub host: String,
    /// Port to bind (0 picks a free one).
    pub port: u16,
    /// The name clients ask for; defaults to the model file's stem.
    pub served_model_name: String,
    /// Most rows at once; `None` takes the plan's figure.
    pub max_seqs: Option<usize>,
    /// KV pool size.
    pub kv: KvSizing,
    /// The device to run on.
    pub device: DeviceChoice,
    /// KV element type; `None` is `--kv-dtype auto`.
    pub kv_dtype: Option<KvDtype>,
    /// How attention reads the KV pool.
    pub attention: ferrox_models::mixer::attention::AttentionBackend,
    /// Fraction of the device's memory the plan may take.
    pub memory_utilization: f64,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Most prompt tokens per prefill chunk.
    pub prefill_chunk: usize,
    /// What the model serves; `None`: what its files say.
    pub task: Option<ferrox_plan::Task>,
    /// How an embedding model pools; `None`: as its files say.
    pub pooling: Option<ferrox_models::pooling::PoolingMethod>,
    /// Matryoshka sizes (empty: any) over what the files say; `None`: as
    /// they say.
    pub matryoshka: Option<Vec<usize>>,
    /// Most tokens in one embedding batch.
    pub max_batch_tokens: usize,
    /// Most requests waiting.
    pub max_queue: usize,
    /// Longest sequence; `None` means the model's context length.
    pub max_model_len: Option<usize>,
    /// Compute threads; `None` means rayon's default.
    pub threads: Option<usize>,
    /// How long in-flight requests get after SIGTERM.
    pub drain_timeout: Duration,
    /// Decode status line every this many steps.
    pub decode_log_interval: u64,
    /// Largest request body in bytes.
    pub max_body: usize,
    /// Share cached prompt blocks between requests.
    pub prefix_caching: bool,
    /// Speculative decoding (`--speculative-config`); `None` runs without.
    pub speculative: Option<ferrox_plan::SpeculativeConfig>,
    /// The draft model proposing the draft tokens (`"model"` of
    /// `--speculative-config`); `None`: n-gram lookup.
    pub draft_model: Option<PathBuf>,
    /// The lower KV tiers (`--kv-offload`); empty runs with the device pool
    /// alone.
    pub kv_offload: Vec<ferrox_plan::OffloadTier>,
    /// `max_tokens` of a chat request that sets none (capped by what is
    /// left of `max_model_len`).
    pub default_max_tokens: usize,
    /// How tool calls are read out of answers.
    pub tool_call_parser: ParserChoice,
    /// How reasoning is read out of answers.
    pub reasoning_parser: crate::reasoning::choice::ReasoningChoice,
    /// The HTTP edge: keys, timeouts, connection cap, liveness bound.
    pub http: HttpConfig,
    /// LoRA adapters; `None` serves none.
    pub lora: Option<crate::load::adapters::LoraConfig>,
    /// Where downloads (adapters at run time) go.
    pub fetch: ferrox_fetch::FetchConfig,
}

/// Default of `--read-timeout`, seconds.
pub const DEFAULT_READ_TIMEOUT_SECS: f64 = 30.0;
/// Default of `--request-timeout`, seconds.
pub const DEFAULT_REQUEST_TIMEOUT_SECS: f64 = 600.0;
/// Default of `--stream-idle-timeout`, seconds.
pub const DEFAULT_STREAM_IDLE_TIMEOUT_SECS: f64 = 60.0;
/// Default of `--max-connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Default of `--stall-timeout`, seconds.
pub const DEFAULT_STALL_TIMEOUT_SECS: f64 = 60.0;

/// Who may call, and how long anyone may hold the server.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpConfig {
    /// Bearer keys the OpenAI routes accept; empty means no authentication.
    pub api_keys: Vec<String>,
    /// Headers, then the body, must each arrive within this; an idle
    /// keep-alive connection is closed after it.
    pub read_timeout: Duration,
    /// A non-streaming request's answer must be ready within this.
    pub request_timeout: Duration,
    /// A response the client accepts no bytes of for this long is abandoned.
    pub stream_idle_timeout: Duration,
    /// Connections served at once; more get a 503.
    pub max_connections: usize,
    /// `/health` fails once one worker tick has run this long.
    pub stall_timeout: Duration,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            api_keys: Vec::new(),
            read_timeout: Duration::from_secs_f64(DEFAULT_READ_TIMEOUT_SECS),
            request_timeout: Duration::from_secs_f64(DEFAULT_REQUEST_TIMEOUT_SECS),
            stream_idle_timeout: Duration::from_secs_f64(DEFAULT_STREAM_IDLE_TIMEOUT_SECS),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            stall_timeout: Duration::from_secs_f64(DEFAULT_STALL_TIMEOUT_SECS),
        }
    }
}

/// Parses a number of seconds: finite, positive.
pub fn parse_secs(text: &str) -> Result<Duration, String> {
    let secs: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds"))?;
    if !(secs.is_finite() && secs > 0.0) {
        return Err(format!("`{text}` must be a positive number of seconds"));
    }
    Duration::try_from_secs_f64(secs).map_err(|e| format!("`{text}`: {e}"))
}

/// Parses a byte size: `1073741824`, `512MiB`, `2GiB`, `1.5G`.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a byte size (try 2GiB)"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        other => return Err(format!("unknown unit `{other}` in `{text}`")),
    };
    Ok((value * scale as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes() {
        let cases = [
            ("1024", Ok(1024)),
            ("512MiB", Ok(512 << 20)),
            ("2GiB", Ok(2 << 30)),
            ("1.5G", Ok(1_500_000_000)),
            ("3 kb", Ok(3000)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_bytes(text), want, "{text}");
        }
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("2XB").is_err());
    }

    #[test]
    fn kv_dtypes_and_utilization() {
        assert_eq!(parse_kv_dtype("auto"), Ok(None));
        assert_eq!(parse_kv_dtype("bf16"), Ok(Some(KvDtype::Bf16)));
        assert!(parse_kv_dtype("fp8").unwrap_err().contains("not supported"));
        assert!(parse_kv_dtype("int4").unwrap_err().contains("auto, f16"));
        for (text, ok) in [
            ("0.9", true),
            ("1", true),
            ("0", false),
            ("1.5", false),
            ("x", false),
        ] {
            assert_eq!(parse_utilization(text).is_ok(), ok, "{text}");
        }
    }

    #[test]
    fn seconds() {
        assert_eq!(parse_secs("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_secs(" 60 "), Ok(Duration::from_secs(60)));
        for bad in ["0", "-1", "inf", "NaN", "1e300", "soon", ""] {
            assert!(parse_secs(bad).is_err(), "{bad}");
        }
    }
}
