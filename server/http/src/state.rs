//! What every handler shares: the engine once the model is loaded, the model's
//! text side, and the server's name and limits.

use std::sync::{Arc, OnceLock};

use ferrox_engine::EngineHandle;

use crate::frontend::Frontend;

/// The parts that exist once the model is loaded.
pub struct Loaded {
    /// The way into the worker.
    pub engine: EngineHandle,
    /// Tokenizer, template, detokenizer.
    pub frontend: Arc<dyn Frontend>,
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
}

impl AppState {
    /// State for a server whose model is still loading.
    pub fn new(model_name: String, max_body: usize, default_max_tokens: usize) -> Self {
        AppState {
            inner: Arc::new(Inner {
                loaded: OnceLock::new(),
                model_name,
                max_body,
                default_max_tokens,
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

    /// Loaded, worker running, not draining.
    pub fn is_ready(&self) -> bool {
        self.loaded()
            .is_some_and(|l| l.engine.is_alive() && !l.engine.is_draining())
    }
}
