//! The LoRA adapters a server knows: each name's source and local path,
//! and the loaded ones kept in memory (at most `--max-cpu-loras`, the least
//! recently used unloaded first, never one a request in flight holds).
//! Adapters are loaded and checked at start (`--lora-modules`) or at run
//! time (`POST /v1/load_lora_adapter`); one evicted is read again from its
//! path when a request names it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use ferrox_core::AdapterRef;
use ferrox_models::lora::{self, LoraShapes};

use crate::openai::error::ApiError;

/// The LoRA flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraConfig {
    /// `--lora-modules`: `(name, source)` loaded at start.
    pub modules: Vec<(String, String)>,
    /// `--max-loras`: distinct adapters in one step (and on the device).
    pub max_loras: usize,
    /// `--max-lora-rank`: the largest rank loaded.
    pub max_lora_rank: usize,
    /// `--max-cpu-loras`: adapters kept loaded in host memory.
    pub max_cpu_loras: usize,
    /// `--allow-runtime-lora-updating`: the load and unload endpoints.
    pub allow_runtime_updates: bool,
}

/// Turns a source into a local path (downloading it); given by the caller
/// so tests need no network.
pub type Resolver = Arc<dyn Fn(&str) -> Result<PathBuf, String> + Send + Sync>;

/// One adapter as `/v1/models` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterInfo {
    /// The name requests give as `model`.
    pub name: String,
    /// Where it was loaded from.
    pub source: String,
    /// Its prefix-cache key, if loaded now.
    pub key: Option<String>,
}

struct Entry {
    source: String,
    path: PathBuf,
    loaded: Option<AdapterRef>,
    /// The store's clock at its last use.
    used: u64,
}

#[derive(Default)]
struct State {
    entries: BTreeMap<String, Entry>,
    clock: u64,
}

/// The server's adapters. Shared by the HTTP handlers.
pub struct AdapterStore {
    base_name: String,
    shapes: LoraShapes,
    config: LoraConfig,
    resolve: Resolver,
    state: Mutex<State>,
}

impl std::fmt::Debug for AdapterStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdapterStore")
            .field("config", &self.config)
            .field("adapters", &self.list())
            .finish_non_exhaustive()
    }
}

/// Which loaded adapter to unload to make room for one more, if any must
/// go: the least recently used of those no request holds. `Err` when
/// `capacity` are loaded and every one is held.
fn to_evict(loaded: &[(&str, u64, bool)], capacity: usize) -> Result<Option<String>, ()> {
    if loaded.len() < capacity {
        return Ok(None);
    }
    let free = loaded.iter().filter(|(_, _, held)| !held);
    free.min_by_key(|(_, used, _)| *used)
        .map(|(name, ..)| Some(name.to_string()))
        .ok_or(())
}

impl AdapterStore {
    /// An empty store for a base served as `base_name` with `shapes`.
    pub fn new(base_name: &str, shapes: LoraShapes, config: LoraConfig, resolve: Resolver) -> Self {
        AdapterStore {
            base_name: base_name.to_string(),
            shapes,
            config,
            resolve,
            state: Mutex::new(State::default()),
        }
    }

    /// The store of a server serving `base_name`, with every
    /// `--lora-modules` entry loaded and checked (sources resolved through
    /// `fetch`): one that cannot be served stops the start with its name and
    /// reason.
    pub fn start(
        base_name: &str,
        lora: &LoraConfig,
        fetch: &ferrox_fetch::FetchConfig,
        shapes: LoraShapes,
    ) -> anyhow::Result<Arc<AdapterStore>> {
        let fetch = fetch.clone();
        let resolve: Resolver = Arc::new(move |source: &str| {
            let parsed = ferrox_fetch::parse(source).map_err(|e| e.to_string())?;
            ferrox_fetch::resolve_adapter(&parsed, &fetch).map_err(|e| e.to_string())
        });
        let store = AdapterStore::new(base_name, shapes, lora.clone(), resolve);
        for (name, source) in &lora.modules {
            store
                .add(name, source)
                .map_err(|e| anyhow::anyhow!("--lora-modules {name}={source}: {e}"))?;
        }
        Ok(Arc::new(store))
    }

    /// The flags it runs with.
    pub fn config(&self) -> &LoraConfig {
        &self.config
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Loads and checks adapter `name` from `source` (blocking: it may
    /// download); refused with the reason when the name is taken or
    /// invalid, the source unreachable or the adapter unfit for the base.
    pub fn add(&self, name: &str, source: &str) -> Result<(), ApiError> {
        check_name(name, &self.base_name)?;
        if self.state().entries.contains_key(name) {
            return Err(ApiError::invalid(
                "lora_name",
                format!("the LoRA adapter {name:?} has already been loaded"),
            ));
        }
        let path = (self.resolve)(source)
            .map_err(|e| ApiError::invalid("lora_path", format!("LoRA adapter {name:?}: {e}")))?;
        let loaded = self.read(name, &path)?;
        let mut state = self.state();
        if state.entries.contains_key(name) {
            return Err(ApiError::invalid(
                "lora_name",
                format!("the LoRA adapter {name:?} has already been loaded"),
            ));
        }
        self.make_room(&mut state)?;
        state.clock += 1;
        let used = state.clock;
        let entry = Entry {
            source: source.to_string(),
            path,
            loaded: Some(loaded),
            used,
        };
        state.entries.insert(name.to_string(), entry);
        Ok(())
    }

    /// Loads `source` as `name` in place of the adapter of that name (vLLM's
    /// `load_inplace`); the old one stays if the new one is refused.
    pub fn replace(&self, name: &str, source: &str) -> Result<(), ApiError> {
        let path = (self.resolve)(source)
            .map_err(|e| ApiError::invalid("lora_path", format!("LoRA adapter {name:?}: {e}")))?;
        let loaded = self.read(name, &path)?;
        let mut state = self.state();
        state.clock += 1;
        let used = state.clock;
        let entry = Entry {
            source: source.to_string(),
            path,
            loaded: Some(loaded),
            used,
        };
        state.entries.insert(name.to_string(), entry);
        Ok(())
    }

    /// Forgets adapter `name`; requests in flight keep their copy.
    pub fn remove(&self, name: &str) -> Result<(), ApiError> {
        match self.state().entries.remove(name) {
            Some(_) => Ok(()),
            None => Err(ApiError::UnknownAdapter(name.to_string())),
        }
    }

    /// Adapter `name` for a request, read again if it was unloaded; `None`
    /// when no adapter has that name.
    pub fn get(&self, name: &str) -> Option<Result<AdapterRef, ApiError>> {
        let path = {
            let mut state = self.state();
            state.clock += 1;
            let now = state.clock;
            let entry = state.entries.get_mut(name)?;
            entry.used = now;
            if let Some(a) = &entry.loaded {
                return Some(Ok(a.clone()));
            }
            entry.path.clone()
        };
        Some(self.reload(name, &path))
    }

    fn reload(&self, name: &str, path: &Path) -> Result<AdapterRef, ApiError> {
        let loaded = self.read(name, path)?;
        let mut state = self.state();
        self.make_room(&mut state)?;
        match state.entries.get_mut(name) {
            // Another request read it meanwhile: keep one copy.
            Some(Entry {
                loaded: Some(a), ..
            }) => Ok(a.clone()),
            Some(entry) => {
                entry.loaded = Some(loaded.clone());
                Ok(loaded)
            }
            None => Err(ApiError::UnknownModel(name.to_string())),
        }
    }

    /// Unloads the least recently used adapter no request holds, when the
    /// loaded ones fill `--max-cpu-loras`.
    fn make_room(&self, state: &mut State) -> Result<(), ApiError> {
        let loaded: Vec<(&str, u64, bool)> = (state.entries.iter())
            .filter_map(|(n, e)| {
                e.loaded
                    .as_ref()
                    .map(|a| (n.as_str(), e.used, a.holders() > 1))
            })
            .collect();
        let capacity = self.config.max_cpu_loras;
        match to_evict(&loaded, capacity) {
            Ok(None) => Ok(()),
            Ok(Some(name)) => {
                tracing::info!(adapter = %name, "LoRA adapter unloaded from memory (least recently used)");
                if let Some(e) = state.entries.get_mut(&name) {
                    e.loaded = None;
                }
                Ok(())
            }
            Err(()) => Err(ApiError::Unavailable(format!(
                "all {capacity} LoRA adapters held in memory (--max-cpu-loras) are in use by \
                 requests in flight; retry later"
            ))),
        }
    }

    /// Reads and checks the adapter at `path`.
    fn read(&self, name: &str, path: &Path) -> Result<AdapterRef, ApiError> {
        let started = std::time::Instant::now();
        let a = lora::load(name, path, &self.shapes, self.config.max_lora_rank)
            .map_err(|e| ApiError::invalid("lora_path", e.to_string()))?;
        tracing::info!(
            adapter = name,
            rank = a.rank(),
            bytes = a.bytes(),
            secs = started.elapsed().as_secs_f64(),
            "LoRA adapter loaded"
        );
        Ok(AdapterRef::new(name, &a.cache_key(), Arc::new(a)))
    }

    /// Every adapter known, by name.
    pub fn list(&self) -> Vec<AdapterInfo> {
        let state = self.state();
        let infos = state.entries.iter().map(|(name, e)| AdapterInfo {
            name: name.clone(),
            source: e.source.clone(),
            key: e.loaded.as_ref().map(|a| a.key().to_string()),
        });
        infos.collect()
    }

    /// Whether an adapter has the name `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.state().entries.contains_key(name)
    }

    /// Adapters loaded in memory now.
    #[cfg(test)]
    pub fn loaded(&self) -> usize {
        self.state()
            .entries
            .values()
            .filter(|e| e.loaded.is_some())
            .count()
    }
}

/// Refuses a name a request could not give as `model`: empty, too long,
/// with spaces or control characters, or the base's own.
fn check_name(name: &str, base: &str) -> Result<(), ApiError> {
    let why = if name.is_empty() || name.len() > 256 {
        "must be 1 to 256 bytes"
    } else if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        "must have no spaces or control characters"
    } else if name == base {
        "is the base model's name"
    } else {
        return Ok(());
    };
    Err(ApiError::invalid(
        "lora_name",
        format!("the LoRA adapter name {name:?} {why}"),
    ))
}

#[cfg(test)]
pub(crate) mod tests;
