//! Test builders: a tiny fake model and text side, and a server on loopback.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ferrox_core::{BatchModel, ChatMessage, DecodeRow, Error, Pool, RenderOptions, Tables};
use ferrox_engine::{EngineConfig, TokenConstraint, TokenText};
use ferrox_grammar::{GrammarSpec, Grammars, Vocab};

use crate::load::config::HttpConfig;
use crate::serve::fault::{StallSwitch, Stalling};
use crate::serve::frontend::Frontend;
use crate::serve::state::{AppState, Loaded};

const VOCAB: usize = 64;
/// The fake model's KV blocks (its pool is [`engine_config`]'s).
const KV_BLOCKS: usize = 64;
/// The fake model's end token.
pub const EOS: u32 = 0;

/// Next token is `last + 1`, wrapping; each step sleeps `delay`. Once `die`
/// is set, the worker panics outside any step (its thread dies).
pub struct FakeModel {
    pub delay: std::time::Duration,
    pub die: Arc<AtomicBool>,
}

impl FakeModel {
    fn logits(last: u32) -> Vec<f32> {
        let mut l = vec![0.0; VOCAB];
        l[(last as usize + 1) % VOCAB] = 50.0;
        l
    }
}

impl BatchModel for FakeModel {
    fn vocab_size(&self) -> usize {
        assert!(!self.die.load(Ordering::SeqCst), "injected worker death");
        VOCAB
    }

    fn block_size(&self) -> usize {
        4
    }

    fn cache_pools(&self) -> Vec<Pool> {
        vec![Pool {
            kind: ferrox_plan::CacheKind::Full,
            blocks: KV_BLOCKS,
        }]
    }

    fn prefill(
        &mut self,
        _tables: Tables<'_>,
        tokens: &[u32],
        _pos: usize,
        want_logits: bool,
    ) -> Result<Option<Vec<f32>>, Error> {
        std::thread::sleep(self.delay);
        Ok(want_logits.then(|| Self::logits(*tokens.last().unwrap_or(&0))))
    }

    fn decode(&mut self, rows: &[DecodeRow<'_>]) -> Result<Vec<Vec<f32>>, Error> {
        std::thread::sleep(self.delay);
        Ok(rows.iter().map(|r| Self::logits(r.token)).collect())
    }

    /// Adapters change nothing in the fake's arithmetic.
    fn step_with_adapters(
        &mut self,
        prefill: &[ferrox_core::batch_model::PrefillChunk<'_>],
        decode: &[DecodeRow<'_>],
        _adapters: &[Option<ferrox_core::AdapterRef>],
    ) -> Result<ferrox_core::batch_model::StepLogits, Error> {
        self.step(prefill, decode)
    }
}

/// Byte `b` is token `b % 64`; token `i` reads as `'A' + i` (printable).
pub struct FakeFrontend;

/// Token `i` reads as `'0' + i`; with special tokens kept, the end token
/// reads as its name instead.
struct Chars {
    keep_special: bool,
}

/// How the fake end token reads when special tokens are kept.
const EOS_NAME: &str = "<|eos|>";

impl TokenText for Chars {
    fn push(&mut self, id: u32) -> String {
        if self.keep_special && id == EOS {
            return EOS_NAME.into();
        }
        char::from(b'0' + id as u8).to_string()
    }

    fn fresh(&self) -> Box<dyn TokenText> {
        Box::new(Chars {
            keep_special: self.keep_special,
        })
    }
}

/// The fake text of `ids`, special tokens skipped.
fn chars(ids: &[u32]) -> String {
    let mut c = Chars {
        keep_special: false,
    };
    ids.iter().map(|&i| c.push(i)).collect()
}

impl Frontend for FakeFrontend {
    fn text_spec(&self) -> Result<crate::serve::frontend::TextSpec, String> {
        Err("the fake tokenizer cannot be written down".into())
    }

    fn encode(&self, text: &str, _add_special: bool) -> Result<Vec<u32>, String> {
        Ok(text.bytes().map(|b| u32::from(b) % VOCAB as u32).collect())
    }

    /// The first `max` bytes' ids (the fake adds no special token).
    fn encode_truncated(&self, text: &str, max: usize) -> Result<Vec<u32>, String> {
        let mut ids = self.encode(text, true)?;
        ids.truncate(max);
        Ok(ids)
    }

    /// `a`'s ids then `b`'s, types 0 then 1 (the fake adds no special
    /// token).
    fn encode_pair(&self, a: &str, b: &str) -> Result<(Vec<u32>, Vec<u32>), String> {
        let (a, b) = (self.encode(a, true)?, self.encode(b, true)?);
        let types = (0..a.len() + b.len())
            .map(|i| u32::from(i >= a.len()))
            .collect();
        Ok(([a, b].concat(), types))
    }

    /// `role:content` lines, then any tool calls, tool call id and name in
    /// brackets, then the tools' count.
    fn render_chat(
        &self,
        messages: &[ChatMessage],
        options: &RenderOptions<'_>,
    ) -> Result<String, String> {
        let mut out = String::new();
        for m in messages {
            out.push_str(&format!("{}:{}", m.role, m.content));
            for c in m.tool_calls.iter().flatten() {
                out.push_str(&format!("[{}]", c["function"]));
            }
            for extra in [&m.tool_call_id, &m.name].into_iter().flatten() {
                out.push_str(&format!("[{extra}]"));
            }
            out.push('\n');
        }
        if let Some(tools) = options.tools {
            out.push_str(&format!("tools:{}\n", tools.len()));
        }
        // The turn and extra variables, marked only when not the default.
        if !options.add_generation_prompt {
            out.push_str("no-generation-prompt\n");
        }
        if options.continue_final_message {
            out.push_str("continue\n");
        }
        for (k, v) in options.kwargs.into_iter().flatten() {
            out.push_str(&format!("{k}={v}\n"));
        }
        Ok(out)
    }

    fn decode(&self, ids: &[u32]) -> Result<String, String> {
        Ok(chars(ids))
    }

    fn detokenizer(&self, skip_special_tokens: bool) -> Box<dyn TokenText> {
        Box::new(Chars {
            keep_special: !skip_special_tokens,
        })
    }

    fn token_str(&self, id: u32) -> String {
        chars(&[id])
    }

    fn raw_token(&self, id: u32) -> Option<String> {
        Some(chars(&[id]))
    }

    fn vocab_size(&self) -> usize {
        VOCAB
    }

    fn eos_ids(&self) -> Vec<u32> {
        vec![EOS]
    }

    fn bos_eos_tokens(&self) -> (Option<String>, Option<String>) {
        (None, Some(chars(&[EOS])))
    }

    /// Grammars over one token per byte (ids past the fake model's
    /// vocabulary are masked off).
    fn constraint(&self, spec: &GrammarSpec) -> Result<Box<dyn TokenConstraint>, String> {
        let vocab = Vocab {
            tokens: (0..=255u8).map(|b| vec![b]).collect(),
            special: Vec::new(),
            eos: vec![EOS],
        };
        let grammars = Grammars::new(vocab).map_err(|e| e.to_string())?;
        Ok(Box::new(grammars.compile(spec).map_err(|e| e.to_string())?))
    }
}

/// `max_tokens` of a chat request without one, on the fake server.
pub const DEFAULT_MAX_TOKENS: usize = 5;

/// A small engine over the fake model.
pub fn engine_config() -> EngineConfig {
    EngineConfig {
        max_seqs: 2,
        max_queue: 2,
        prefill_chunk: 8,
        max_model_len: 128,
        block_size: 4,
        pools: vec![Pool {
            kind: ferrox_plan::CacheKind::Full,
            blocks: KV_BLOCKS,
        }],
        decode_log_interval: 0,
        prefix_caching: true,
        cache_salt: "fake".into(),
        max_loras: 2,
        speculative: None,
        max_batch_tokens: 16384,
        kv_offload: Vec::new(),
    }
}

/// Serves the fake model on a free loopback port; returns its address.
pub async fn serve(config: EngineConfig, delay_ms: u64) -> (std::net::SocketAddr, AppState) {
    serve_with(config, delay_ms, &HttpConfig::default()).await
}

/// An engine over the fake model, and the state of a server around it.
pub fn loaded_state(config: EngineConfig, delay_ms: u64, http: &HttpConfig) -> AppState {
    let model = FakeModel {
        delay: std::time::Duration::from_millis(delay_ms),
        die: Arc::new(AtomicBool::new(false)),
    };
    loaded_with(model, config, http)
}

/// A server's state around an engine over `model`.
pub fn loaded_with(model: FakeModel, config: EngineConfig, http: &HttpConfig) -> AppState {
    loaded_stalling(model, config, http, StallSwitch::default())
}

/// [`loaded_with`], the model obeying the test-only stall `switch`.
pub fn loaded_stalling(
    model: FakeModel,
    config: EngineConfig,
    http: &HttpConfig,
    stall: StallSwitch,
) -> AppState {
    let model = Stalling::new(model, stall.clone());
    let (engine, _thread) = ferrox_engine::worker::spawn(model, config).unwrap();
    let state = AppState::new("fake".into(), 1024, DEFAULT_MAX_TOKENS, http);
    state.set_loaded(Loaded {
        engine,
        frontend: Arc::new(FakeFrontend),
        tools: crate::tools::parser::ToolSetup {
            family: Some(crate::tools::parser::ToolFamily::Hermes),
            describe: true,
        },
        reasoning: None,
        stall,
        adapters: None,
        task: ferrox_plan::Task::Generate,
        embedding: None,
    });
    state
}

/// A pooling model whose vector of a sequence is `[length, sum of its
/// tokens, 1, 1]`: what a batch returns is checkable input by input.
pub struct FakeEmbedder;

impl ferrox_core::PoolingModel for FakeEmbedder {
    fn vocab_size(&self) -> usize {
        VOCAB
    }

    fn max_len(&self) -> usize {
        64
    }

    fn embed(&mut self, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>, ferrox_core::Error> {
        let v = |s: &&[u32]| vec![s.len() as f32, s.iter().sum::<u32>() as f32, 1.0, 1.0];
        Ok(seqs.iter().map(v).collect())
    }
}

/// A server's state around a pooling engine over [`FakeEmbedder`]: 64
/// tokens a sequence, batches of `batch_tokens`; Matryoshka sizes
/// `matryoshka`, normalized by default.
pub fn pooling_state(batch_tokens: usize, matryoshka: Option<Vec<usize>>) -> AppState {
    let config = EngineConfig {
        pools: Vec::new(),
        max_model_len: 64,
        max_batch_tokens: batch_tokens,
        ..EngineConfig::default()
    };
    let (engine, _thread) = ferrox_engine::worker::spawn_pooling(FakeEmbedder, config).unwrap();
    let state = AppState::new(
        "fake".into(),
        1 << 20,
        DEFAULT_MAX_TOKENS,
        &HttpConfig::default(),
    );
    state.set_loaded(Loaded {
        engine,
        frontend: Arc::new(FakeFrontend),
        tools: crate::tools::parser::ToolSetup {
            family: None,
            describe: false,
        },
        reasoning: None,
        stall: StallSwitch::default(),
        adapters: None,
        task: ferrox_plan::Task::Embed,
        embedding: Some(crate::openai::embeddings::EmbeddingModel {
            name: "fake".into(),
            vocab: VOCAB,
            max_model_len: 64,
            dim: 4,
            normalize: true,
            matryoshka,
            prompts: Default::default(),
        }),
    });
    state
}

/// Serves the fake model through the real edge with `http`'s limits.
pub async fn serve_with(
    config: EngineConfig,
    delay_ms: u64,
    http: &HttpConfig,
) -> (std::net::SocketAddr, AppState) {
    let state = loaded_state(config, delay_ms, http);
    (serve_state(state.clone(), http).await, state)
}

/// Serves `state` through the real edge with `http`'s limits.
pub async fn serve_state(state: AppState, http: &HttpConfig) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = crate::serve::app::router(state);
    let edge = crate::serve::server::edge_config(http);
    tokio::spawn(crate::serve::edge::serve(
        listener,
        app,
        edge,
        std::future::pending(),
    ));
    addr
}

/// One HTTP/1.1 request; returns the status and the raw body.
pub async fn request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, String) {
    let (status, _, body) = request_with(addr, method, path, &[], body).await;
    (status, body)
}

/// One HTTP/1.1 request with extra headers; returns the status, the raw
/// head and the raw body.
pub async fn request_with(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n{extra}\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text[9..12].parse().unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (status, head.to_string(), body.to_string())
}
