//! What every handler shares: the engine once the model is loaded, the model's
//! text side, and the server's name, keys and limits.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use ferrox_core::ApiKeys;
use ferrox_engine::{EngineHandle, Liveness};
use tokio::sync::Semaphore;

use crate::load::config::HttpConfig;
use crate::serve::frontend::Frontend;

/// The parts that exist once the model is loaded.
pub struct Loaded {
    /// The way into the worker.
    pub engine: EngineHandle,
    /// Tokenizer, template, detokenizer.
    pub frontend: Arc<dyn Frontend>,
    /// How the model calls tools.
    pub tools: crate::tools::parser::ToolSetup,
    /// How reasoning is read out of answers; `None`: it is not.
    pub reasoning: Option<crate::reasoning::choice::ReasoningFamily>,
    /// The test-only stall switch (inert unless its variable is set).
    pub stall: crate::serve::fault::StallSwitch,
    /// The LoRA adapters; `None` when the server serves none.
    pub adapters: Option<Arc<crate::load::adapters::AdapterStore>>,
    /// What the model serves.
    pub task: ferrox_plan::Task,
    /// What an embedding request needs of the model; `None` unless it embeds.
    pub embedding: Option<crate::openai::embeddings::EmbeddingModel>,
}

/// Handler state. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    loaded: OnceLock<Loaded>,
    model_name: String,
    max_body: usize,
    default_max_tokens: usize,
    api_keys: ApiKeys,
    read_timeout: Duration,
    request_timeout: Duration,
    stall_timeout: Duration,
    prepare_slots: Arc<Semaphore>,
}

impl AppState {
    /// State for a server whose model is still loading.
    pub fn new(
        model_name: String,
        max_body: usize,
        default_max_tokens: usize,
        http: &HttpConfig,
    ) -> Self {
        AppState {
            inner: Arc::new(Inner {
                loaded: OnceLock::new(),
                model_name,
                max_body,
                default_max_tokens,
                api_keys: ApiKeys::new(&http.api_keys),
                read_timeout: http.read_timeout,
                request_timeout: http.request_timeout,
                stall_timeout: http.stall_timeout,
                prepare_slots: Arc::new(Semaphore::new(
                    std::thread::available_parallelism().map_or(1, |n| n.get()),
                )),
            }),
        }
    }

    /// Marks the model loaded; later calls are ignored.
    pub fn set_loaded(&self, loaded: Loaded) {
        let _ = self.inner.loaded.set(loaded);
    }

    /// The engine and text side, once loaded.
    pub fn loaded(&self) -> Option<&Loaded> {
        self.inner.loaded.get()
    }

    /// The served model name.
    pub fn model_name(&self) -> &str {
        &self.inner.model_name
    }

    /// Largest request body accepted, in bytes.
    pub fn max_body(&self) -> usize {
        self.inner.max_body
    }

    /// `max_tokens` of a chat request that sets none, before the cap.
    pub fn default_max_tokens(&self) -> usize {
        self.inner.default_max_tokens
    }

    /// The keys the OpenAI routes accept.
    pub fn api_keys(&self) -> &ApiKeys {
        &self.inner.api_keys
    }

    /// How long a request body may take to arrive.
    pub fn read_timeout(&self) -> Duration {
        self.inner.read_timeout
    }

    /// How long a non-streaming request may take.
    pub fn request_timeout(&self) -> Duration {
        self.inner.request_timeout
    }

    /// Permits for CPU-bound request preparation, one per core.
    pub fn prepare_slots(&self) -> Arc<Semaphore> {
        Arc::clone(&self.inner.prepare_slots)
    }

    /// Loaded, worker running, not draining.
    pub fn is_ready(&self) -> bool {
        self.loaded()
            .is_some_and(|l| l.engine.is_alive() && !l.engine.is_draining())
    }

    /// The worker's liveness at `now`; live while the model still loads.
    pub fn liveness(&self, now: Instant) -> Liveness {
        self.loaded().map_or(Liveness::Live, |l| {
            l.engine.liveness(now, self.inner.stall_timeout)
        })
    }
}
