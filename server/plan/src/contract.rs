//! The contract between ferrox-operator and ferrox-server (and
//! ferrox-router), in the one crate they all depend on: the `serve` flags
//! the operator writes into pods (the server's CLI declares them under these
//! names), the plan-carrying arguments as a typed value, the metric names the
//! operator's autoscaler and status read from the servers, and the router's
//! waiting-line report the operator wakes models from. A renamed flag or
//! metric is a compile error on both sides, not a pod that fails in
//! production.

use crate::{CacheKind, DeviceKind, KvDtype, OffloadTier, SpeculativeFlag, Task};

/// `ferrox-server serve` flag names, without the leading `--` (clap's
/// `long`).
pub mod flag {
    /// The model source (path, `file://`, `hf://`, `https://`).
    pub const MODEL: &str = "model";
    /// Address to bind.
    pub const HOST: &str = "host";
    /// Port to bind.
    pub const PORT: &str = "port";
    /// The model name clients send.
    pub const SERVED_MODEL_NAME: &str = "served-model-name";
    /// Blocks of one pool, by kind: `KIND=N` (`full=2048`,
    /// `window:4096=512`, `state=16`), repeated or comma-separated.
    pub const POOL: &str = "pool";
    /// Alias: blocks of the attention KV pool (the full-attention layers',
    /// or the one window pool of a model whose every layer slides).
    pub const KV_BLOCKS: &str = "kv-blocks";
    /// Alias: blocks of each window pool (sliding-window layers), smallest
    /// window first, comma-separated.
    pub const WINDOW_BLOCKS: &str = "window-blocks";
    /// Tokens per KV block.
    pub const BLOCK_SIZE: &str = "block-size";
    /// Most sequences at once.
    pub const MAX_SEQS: &str = "max-seqs";
    /// Longest sequence, prompt and output.
    pub const MAX_MODEL_LEN: &str = "max-model-len";
    /// Seconds in-flight requests get after SIGTERM.
    pub const DRAIN_TIMEOUT: &str = "drain-timeout";
    /// `cpu` or `cuda`.
    pub const DEVICE: &str = "device";
    /// The KV cache's element type.
    pub const KV_DTYPE: &str = "kv-dtype";
    /// Most prompt tokens in one prefill chunk.
    pub const PREFILL_CHUNK: &str = "prefill-chunk";
    /// Most requests waiting for admission.
    pub const MAX_QUEUE: &str = "max-queue";
    /// Serve LoRA adapters (implied by the flags below).
    pub const ENABLE_LORA: &str = "enable-lora";
    /// LoRA adapters loaded at start, `name=source` each (vLLM's syntax).
    pub const LORA_MODULES: &str = "lora-modules";
    /// Most distinct LoRA adapters in one step (and on the device).
    pub const MAX_LORAS: &str = "max-loras";
    /// The largest LoRA rank loaded.
    pub const MAX_LORA_RANK: &str = "max-lora-rank";
    /// LoRA adapters kept in host memory (least recently used unloaded).
    pub const MAX_CPU_LORAS: &str = "max-cpu-loras";
    /// `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` allowed.
    pub const ALLOW_RUNTIME_LORA_UPDATING: &str = "allow-runtime-lora-updating";
    /// Speculative decoding, vLLM's JSON (`{"method": "ngram",
    /// "num_speculative_tokens": 5, ...}`; see [`crate::SpeculativeConfig`]).
    pub const SPECULATIVE_CONFIG: &str = "speculative-config";
    /// What the model serves (`generate`, `embed`, `score`), over what its
    /// files say.
    pub const TASK: &str = "task";
    /// How an embedding model pools (`cls`, `mean`, `last`), over what its
    /// files say.
    pub const POOLING: &str = "pooling";
    /// The Matryoshka sizes an embedding model's vectors may be cut to
    /// (`dimensions`): `768,512,256,128`, or `any`; over what its files say
    /// (a GGUF says none).
    pub const MATRYOSHKA_DIMENSIONS: &str = "matryoshka-dimensions";
    /// Most tokens in one pooling batch (an embedding model's forward).
    pub const MAX_BATCH_TOKENS: &str = "max-batch-tokens";
    /// A lower KV tier for evicted prefix blocks: `host=SIZE` or
    /// `disk=PATH:SIZE` (see [`crate::OffloadTier`]), repeated for both.
    pub const KV_OFFLOAD: &str = "kv-offload";
}

/// What a server serving LoRA adapters is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraArgs {
    /// `(name, source)` of each adapter loaded at start.
    pub modules: Vec<(String, String)>,
    /// Distinct adapters in one step.
    pub max_loras: u64,
    /// The largest rank.
    pub max_lora_rank: u64,
    /// Adapters kept in host memory.
    pub max_cpu_loras: u64,
    /// The load and unload endpoints allowed.
    pub runtime_updates: bool,
}

impl LoraArgs {
    /// The flags, appended to `args`.
    fn push_to(&self, args: &mut Vec<String>) {
        args.push(format!("--{}", flag::ENABLE_LORA));
        for (name, value) in [
            (flag::MAX_LORAS, self.max_loras),
            (flag::MAX_LORA_RANK, self.max_lora_rank),
            (flag::MAX_CPU_LORAS, self.max_cpu_loras),
        ] {
            args.push(format!("--{name}"));
            args.push(value.to_string());
        }
        if self.runtime_updates {
            args.push(format!("--{}", flag::ALLOW_RUNTIME_LORA_UPDATING));
        }
        if !self.modules.is_empty() {
            args.push(format!("--{}", flag::LORA_MODULES));
            args.extend(self.modules.iter().map(|(n, s)| format!("{n}={s}")));
        }
    }
}

/// What the operator tells one server: where to serve and the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeArgs {
    /// The model source, as the server reads it.
    pub model: String,
    /// Address to bind.
    pub host: String,
    /// Port to bind.
    pub port: u16,
    /// The model name clients send.
    pub served_model_name: String,
    /// Every pool's blocks, by kind (the plan's pools).
    pub pools: Vec<(CacheKind, u64)>,
    /// Tokens per block.
    pub block_size: u64,
    /// Most sequences at once.
    pub max_seqs: u64,
    /// Longest sequence in tokens.
    pub max_model_len: u64,
    /// Seconds of drain after SIGTERM.
    pub drain_timeout_seconds: u64,
    /// The device the plan is for (a GPU pod that cannot see its GPU fails
    /// loudly rather than serving on the CPU).
    pub device: DeviceKind,
    /// The KV dtype the plan counted.
    pub kv_dtype: KvDtype,
    /// The prefill chunk, when the spec sets one (else the server's default).
    pub prefill_chunk: Option<u64>,
    /// The waiting line's bound, when the spec sets one.
    pub max_queue: Option<u64>,
    /// LoRA adapters, when the spec has any.
    pub lora: Option<LoraArgs>,
    /// Speculative decoding, when the spec asks for it (with the draft
    /// model's path in the pod, when one drafts).
    pub speculative: Option<SpeculativeFlag>,
    /// What the model serves; `generate` (what a decoder's files say)
    /// writes no flag.
    pub task: Task,
    /// An embedding model's batch budget, when the spec sets one.
    pub max_batch_tokens: Option<u64>,
    /// The lower KV tiers, when the spec asks for any.
    pub kv_offload: Vec<OffloadTier>,
}

impl ServeArgs {
    /// `serve` and its flags, as a pod's `args`.
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec!["serve".to_string()];
        let mut push = |name: &str, value: String| {
            args.push(format!("--{name}"));
            args.push(value);
        };
        push(flag::MODEL, self.model.clone());
        push(flag::HOST, self.host.clone());
        push(flag::PORT, self.port.to_string());
        push(flag::SERVED_MODEL_NAME, self.served_model_name.clone());
        for (kind, blocks) in &self.pools {
            push(flag::POOL, pool_arg(*kind, *blocks));
        }
        push(flag::BLOCK_SIZE, self.block_size.to_string());
        push(flag::MAX_SEQS, self.max_seqs.to_string());
        push(flag::MAX_MODEL_LEN, self.max_model_len.to_string());
        push(flag::DRAIN_TIMEOUT, self.drain_timeout_seconds.to_string());
        push(flag::DEVICE, self.device.arg().to_string());
        push(flag::KV_DTYPE, self.kv_dtype.name().to_string());
        if let Some(n) = self.prefill_chunk {
            push(flag::PREFILL_CHUNK, n.to_string());
        }
        if let Some(n) = self.max_queue {
            push(flag::MAX_QUEUE, n.to_string());
        }
        if let Some(spec) = &self.speculative {
            push(flag::SPECULATIVE_CONFIG, spec.to_arg());
        }
        if self.task != Task::Generate {
            push(flag::TASK, self.task.to_string());
        }
        if let Some(n) = self.max_batch_tokens {
            push(flag::MAX_BATCH_TOKENS, n.to_string());
        }
        for tier in &self.kv_offload {
            push(flag::KV_OFFLOAD, tier.to_arg());
        }
        if let Some(lora) = &self.lora {
            lora.push_to(&mut args);
        }
        args
    }
}

/// One `--pool` value: `KIND=N`.
pub fn pool_arg(kind: CacheKind, blocks: u64) -> String {
    format!("{kind}={blocks}")
}

/// Parses one `--pool` value, `KIND=N` (the inverse of [`pool_arg`]).
pub fn parse_pool_arg(text: &str) -> Result<(CacheKind, u64), String> {
    let (kind, n) = text.split_once('=').ok_or_else(|| {
        format!("`{text}` is not KIND=BLOCKS (e.g. full=2048, window:4096=512, state=16)")
    })?;
    let kind: CacheKind = kind.trim().parse()?;
    let n = n
        .trim()
        .parse::<u64>()
        .map_err(|_| format!("`{n}` in `{text}` is not a number of blocks"))?;
    Ok((kind, n))
}

/// Names of the series the operator reads from a server's `/metrics`.
pub mod metric {
    /// Requests waiting for admission (the autoscaler's queue depth).
    pub const WAITING: &str = "ferrox_requests_waiting";
    /// Requests prefilling or decoding.
    pub const RUNNING: &str = "ferrox_requests_running";
    /// Requests ended, by `reason` (the autoscaler's sign of traffic between scrapes).
    pub const FINISHED: &str = "ferrox_requests_finished_total";
    /// Reserved fraction of the fullest pool (the KV pool, or a window pool
    /// or the state slots when fuller): the one that stops admission first.
    pub const KV_USAGE: &str = "ferrox_kv_usage_ratio";
    /// The label naming a pool by its cache kind (`full`, `window:1024`,
    /// `state`), on every per-pool series.
    pub const POOL_LABEL: &str = "pool";
    /// Blocks reserved by running requests, by `pool` (what admission
    /// counts; a state pool's block is one sequence's slot).
    pub const POOL_BLOCKS_USED: &str = "ferrox_pool_blocks_used";
    /// Blocks of each pool, by `pool`.
    pub const POOL_BLOCKS_CAPACITY: &str = "ferrox_pool_blocks_capacity";
    /// Blocks holding something now, by `pool` (a window pool's reserved
    /// blocks its windows have left, or not drawn yet, are not held).
    pub const POOL_BLOCKS_HELD: &str = "ferrox_pool_blocks_held";
    /// Reserved fraction of each pool, by `pool`.
    pub const POOL_USAGE: &str = "ferrox_pool_usage_ratio";
    /// vLLM's info gauge of the KV cache the server planned.
    pub const CACHE_CONFIG_INFO: &str = "vllm:cache_config_info";
    /// Weight bytes as planned.
    pub const PLAN_WEIGHT_BYTES: &str = "ferrox_plan_weight_bytes";
    /// Bytes of one KV block.
    pub const PLAN_KV_BLOCK_BYTES: &str = "ferrox_plan_kv_block_bytes";
    /// `--max-seqs` the server runs with.
    pub const PLAN_MAX_SEQS: &str = "ferrox_plan_max_seqs";
    /// Longest sequence in tokens.
    pub const PLAN_MAX_MODEL_LEN: &str = "ferrox_plan_max_model_len";
    /// The memory figure the plan was made from, by `source`.
    pub const PLAN_MEMORY_BYTES: &str = "ferrox_plan_memory_bytes";
    /// Blocks of each pool the server runs with, by `pool`.
    pub const PLAN_POOL_BLOCKS: &str = "ferrox_plan_pool_blocks";
    /// vLLM's info gauge of LoRA adapters: labels `running_lora_adapters`,
    /// `waiting_lora_adapters` (comma-separated names) and `max_lora`; the
    /// value is the Unix time the label set was last seen.
    pub const LORA_REQUESTS_INFO: &str = "vllm:lora_requests_info";
    /// Requests submitted for each LoRA adapter, by `adapter`.
    pub const LORA_REQUESTS: &str = "ferrox_lora_requests_total";
    /// Each LoRA adapter the server serves, by `adapter`: 1 held in memory,
    /// 0 known and read in again on its next request (the operator's
    /// `status.adapters`).
    pub const LORA_ADAPTER_LOADED: &str = "ferrox_lora_adapter_loaded";
    /// Rows that verified draft tokens, one a row a step (vLLM's counter
    /// `vllm:spec_decode_num_drafts`, as its client exposes it).
    pub const SPEC_DRAFTS: &str = "vllm:spec_decode_num_drafts_total";
    /// Draft tokens verified.
    pub const SPEC_DRAFT_TOKENS: &str = "vllm:spec_decode_num_draft_tokens_total";
    /// Draft tokens accepted (the acceptance rate is this over
    /// [`SPEC_DRAFT_TOKENS`]).
    pub const SPEC_ACCEPTED_TOKENS: &str = "vllm:spec_decode_num_accepted_tokens_total";
    /// Draft tokens accepted, by `position` in the draft (0 first).
    pub const SPEC_ACCEPTED_PER_POS: &str = "vllm:spec_decode_num_accepted_tokens_per_pos_total";
    /// Decode steps of a speculating server, by `decision`: `verified` (some
    /// row verified drafts), `declined` (drafts were found, but the pay-off
    /// rule judged them not worth the step's extra cost), `none` (no row had
    /// a draft).
    pub const SPEC_STEPS: &str = "ferrox_spec_decode_steps_total";
    /// The label naming a lower KV tier (`host`, `disk`) on every per-tier
    /// series.
    pub const TIER_LABEL: &str = "tier";
    /// Blocks a lower tier holds now, by `tier`.
    pub const TIER_BLOCKS: &str = "ferrox_kv_tier_blocks";
    /// Blocks a lower tier can hold (its size over a block's bytes), by `tier`.
    pub const TIER_CAPACITY_BLOCKS: &str = "ferrox_kv_tier_capacity_blocks";
    /// Blocks looked up in a lower tier and found whole, by `tier`.
    pub const TIER_HITS: &str = "ferrox_kv_tier_hits_total";
    /// Blocks looked up in a lower tier and not found, or found torn or
    /// corrupt, by `tier`.
    pub const TIER_MISSES: &str = "ferrox_kv_tier_misses_total";
    /// Blocks a lower tier read back and refused (a bad checksum, a torn or
    /// missing file), by `tier`; each is also a miss.
    pub const TIER_CORRUPT: &str = "ferrox_kv_tier_corrupt_total";
    /// Bytes written to a lower tier, by `tier`.
    pub const TIER_WRITTEN_BYTES: &str = "ferrox_kv_tier_written_bytes_total";
    /// Bytes read back from a lower tier, by `tier`.
    pub const TIER_READ_BYTES: &str = "ferrox_kv_tier_read_bytes_total";
    /// Seconds one request's blocks took to read back, by `tier` (a histogram).
    pub const TIER_READ_SECONDS: &str = "ferrox_kv_tier_read_seconds";
    /// vLLM's counter of prompt tokens looked up outside the device pool
    /// (its KV connector's; here the lower tiers').
    pub const EXTERNAL_PREFIX_QUERIES: &str = "vllm:external_prefix_cache_queries_total";
    /// Of those, the tokens found.
    pub const EXTERNAL_PREFIX_HITS: &str = "vllm:external_prefix_cache_hits_total";
}

/// What the operator reads from each ferrox-router replica.
pub mod router {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Serialize};

    /// The router's port (its Service's too).
    pub const PORT: u16 = 8000;
    /// The long-poll route of the waiting line:
    /// `GET /pending?since=VERSION&wait_ms=MS` answers at once when the
    /// router's version is not `since`, else on the next change or after
    /// `wait_ms` (at most [`MAX_WAIT_MS`]).
    pub const PENDING_PATH: &str = "/pending";
    /// The longest a `/pending` long-poll is held.
    pub const MAX_WAIT_MS: u64 = 60_000;
    /// The gauge of requests waiting for a ready endpoint, by `model`.
    pub const PENDING_METRIC: &str = "ferrox_router_pending_requests";

    /// The body of `GET /pending`.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
    pub struct PendingReport {
        /// Grows by one per change; starts at the router's start time in
        /// milliseconds, so a restarted router never repeats a version.
        pub version: u64,
        /// Requests waiting, by served model name; models with none are left out.
        pub models: BTreeMap<String, u64>,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pending_report_reads_back_from_its_json() {
        let body = r#"{"version": 7, "models": {"smol": 2}}"#;
        let r: router::PendingReport = serde_json::from_str(body).unwrap();
        assert_eq!((r.version, r.models["smol"]), (7, 2));
        let again: router::PendingReport =
            serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(again, r);
    }

    #[test]
    fn args_name_every_flag_once_and_leave_unset_ones_out() {
        let a = ServeArgs {
            model: "/models/m.gguf".into(),
            host: "0.0.0.0".into(),
            port: 8000,
            served_model_name: "m".into(),
            pools: vec![(CacheKind::Full, 2441)],
            block_size: 16,
            max_seqs: 16,
            max_model_len: 8192,
            drain_timeout_seconds: 30,
            device: DeviceKind::Cuda,
            kv_dtype: KvDtype::Bf16,
            prefill_chunk: Some(256),
            max_queue: None,
            lora: None,
            speculative: None,
            task: Task::Generate,
            max_batch_tokens: None,
            kv_offload: Vec::new(),
        };
        let args = a.to_args();
        let value = |f: &str| {
            let at = args.iter().position(|x| *x == format!("--{f}"))?;
            args.get(at + 1).cloned()
        };
        assert_eq!(args[0], "serve");
        for (f, want) in [
            (flag::POOL, Some("full=2441")),
            (flag::DEVICE, Some("cuda")),
            (flag::KV_DTYPE, Some("bf16")),
            (flag::PREFILL_CHUNK, Some("256")),
            (flag::MAX_QUEUE, None),
            (flag::TASK, None),
            (flag::MAX_BATCH_TOKENS, None),
        ] {
            assert_eq!(value(f).as_deref(), want, "{f}");
        }
        assert_eq!(args.len(), 1 + 2 * 12);
        let lora = LoraArgs {
            modules: vec![
                ("a".into(), "hf://o/a".into()),
                ("b".into(), "/adapters/b".into()),
            ],
            max_loras: 2,
            max_lora_rank: 16,
            max_cpu_loras: 4,
            runtime_updates: false,
        };
        let with = ServeArgs {
            lora: Some(lora),
            ..a.clone()
        }
        .to_args();
        let tail: Vec<&str> = with[args.len()..].iter().map(String::as_str).collect();
        assert_eq!(
            tail,
            [
                "--enable-lora",
                "--max-loras",
                "2",
                "--max-lora-rank",
                "16",
                "--max-cpu-loras",
                "4",
                "--lora-modules",
                "a=hf://o/a",
                "b=/adapters/b"
            ]
        );
        // An embedding model: its task and batch budget, and no pool.
        let embed = ServeArgs {
            pools: Vec::new(),
            task: Task::Embed,
            max_batch_tokens: Some(8192),
            ..a.clone()
        }
        .to_args();
        let value = |f: &str| {
            let at = embed.iter().position(|x| *x == format!("--{f}"))?;
            embed.get(at + 1).cloned()
        };
        assert_eq!(value(flag::TASK).as_deref(), Some("embed"));
        assert_eq!(value(flag::MAX_BATCH_TOKENS).as_deref(), Some("8192"));
        assert_eq!(value(flag::POOL), None);
        // Every pool by kind, in the plan's order; no alias is written.
        // Speculation: the flag's JSON, which the server reads back.
        let ngram = crate::SpeculativeConfig::ngram(5, Some(2), Some(4)).unwrap();
        let drafted = crate::SpeculativeConfig::drafting(3).unwrap();
        for (config, draft_model) in [(ngram, None), (drafted, Some("/draft/m/d.gguf".into()))] {
            let flag_value = SpeculativeFlag {
                config,
                draft_model,
            };
            let spec = ServeArgs {
                speculative: Some(flag_value.clone()),
                ..a.clone()
            }
            .to_args();
            assert_eq!(spec.len(), args.len() + 2);
            let at = spec
                .iter()
                .position(|x| *x == format!("--{}", flag::SPECULATIVE_CONFIG))
                .unwrap();
            assert_eq!(SpeculativeFlag::parse(&spec[at + 1]).unwrap(), flag_value);
        }
        let hybrid = ServeArgs {
            pools: vec![
                (CacheKind::Full, 100),
                (CacheKind::Window(1024), 5719),
                (CacheKind::State, 16),
            ],
            ..a
        };
        let args = hybrid.to_args();
        let pools: Vec<(CacheKind, u64)> = args
            .windows(2)
            .filter(|w| w[0] == "--pool")
            .map(|w| parse_pool_arg(&w[1]).unwrap())
            .collect();
        assert_eq!(pools, hybrid.pools);
        assert!(
            !args
                .iter()
                .any(|a| a == "--kv-blocks" || a == "--window-blocks")
        );
    }

    #[test]
    fn pool_args_read_back_and_bad_ones_say_why() {
        for (text, want) in [
            ("full=2048", Ok((CacheKind::Full, 2048))),
            ("window:4096=512", Ok((CacheKind::Window(4096), 512))),
            (" state = 16", Ok((CacheKind::State, 16))),
            ("full", Err("is not KIND=BLOCKS")),
            ("kv=3", Err("not a cache pool")),
            ("state=-1", Err("not a number of blocks")),
        ] {
            match (parse_pool_arg(text), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{text}"),
                (Err(e), Err(want)) => assert!(e.contains(want), "{text}: {e}"),
                (got, want) => panic!("{text}: {got:?} vs {want:?}"),
            }
        }
        assert_eq!(pool_arg(CacheKind::Window(8), 3), "window:8=3");
    }
}
