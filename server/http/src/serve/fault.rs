//! A test-only fault switch: with `FERROX_FAULT_STALL_REQUEST_ID=<id>` in the
//! environment, a request carrying `X-Request-Id: <id>` hangs the batching
//! worker in its next step, so `/health` turns 503 and a kubelet's liveness
//! probe restarts the container (tests/e2e/real-node.sh). Unset, it is inert.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ferrox_core::batch_model::{PrefillChunk, StepLogits};
use ferrox_core::{AdapterRef, BatchModel, DecodeRow, Error, Pool, Tables};
use ferrox_plan::CacheKind;

/// The environment variable naming the request id that stalls the worker.
pub const STALL_ENV: &str = "FERROX_FAULT_STALL_REQUEST_ID";

/// Armed by the HTTP side, obeyed by [`Stalling`] on the worker thread.
#[derive(Clone, Debug, Default)]
pub struct StallSwitch {
    id: Option<String>,
    armed: Arc<AtomicBool>,
}

impl StallSwitch {
    /// The switch for `id` (none: it never arms).
    pub fn new(id: Option<String>) -> Self {
        StallSwitch {
            id: id.filter(|i| !i.is_empty()),
            armed: Arc::default(),
        }
    }

    /// The switch the environment asks for.
    pub fn from_env() -> Self {
        Self::new(std::env::var(STALL_ENV).ok())
    }

    /// Arms the switch when `request_id` is the configured one.
    pub fn on_request(&self, request_id: Option<&str>) {
        if self.id.is_some() && self.id.as_deref() == request_id {
            tracing::warn!("{STALL_ENV}: stalling the worker (test fault)");
            self.armed.store(true, Ordering::SeqCst);
        }
    }

    fn is_armed(&self) -> bool {
        self.armed.load(Ordering::SeqCst)
    }
}

/// A model whose steps hang while the switch is armed.
pub struct Stalling<M> {
    inner: M,
    switch: StallSwitch,
}

impl<M> Stalling<M> {
    /// `inner`, obeying `switch`.
    pub fn new(inner: M, switch: StallSwitch) -> Self {
        Stalling { inner, switch }
    }

    fn hang_while_armed(&self) {
        while self.switch.is_armed() {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl<M: BatchModel> BatchModel for Stalling<M> {
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn block_size(&self) -> usize {
        self.inner.block_size()
    }

    fn cache_pools(&self) -> Vec<Pool> {
        self.inner.cache_pools()
    }

    fn check_input(&self, tables: Tables<'_>, tokens: &[u32], pos: usize) -> Result<(), Error> {
        self.inner.check_input(tables, tokens, pos)
    }

    fn read_block(&self, kind: CacheKind, block: u32) -> Result<Vec<u8>, Error> {
        self.inner.read_block(kind, block)
    }

    fn write_block(&mut self, kind: CacheKind, block: u32, bytes: &[u8]) -> Result<(), Error> {
        self.inner.write_block(kind, block, bytes)
    }

    fn prefill(
        &mut self,
        tables: Tables<'_>,
        tokens: &[u32],
        pos: usize,
        want_logits: bool,
    ) -> Result<Option<Vec<f32>>, Error> {
        self.hang_while_armed();
        self.inner.prefill(tables, tokens, pos, want_logits)
    }

    fn decode(&mut self, rows: &[DecodeRow<'_>]) -> Result<Vec<Vec<f32>>, Error> {
        self.hang_while_armed();
        self.inner.decode(rows)
    }

    fn step(
        &mut self,
        prefill: &[PrefillChunk<'_>],
        decode: &[DecodeRow<'_>],
    ) -> Result<StepLogits, Error> {
        self.hang_while_armed();
        self.inner.step(prefill, decode)
    }

    fn step_with_adapters(
        &mut self,
        prefill: &[PrefillChunk<'_>],
        decode: &[DecodeRow<'_>],
        adapters: &[Option<AdapterRef>],
    ) -> Result<StepLogits, Error> {
        self.hang_while_armed();
        self.inner.step_with_adapters(prefill, decode, adapters)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arms_only_for_its_request_id() {
        let cases = [
            (None, Some("x"), false),
            (Some("x"), None, false),
            (Some("x"), Some("y"), false),
            (Some(""), Some(""), false),
            (Some("x"), Some("x"), true),
        ];
        for (id, request, armed) in cases {
            let s = StallSwitch::new(id.map(String::from));
            s.on_request(request);
            assert_eq!(s.is_armed(), armed, "{id:?} / {request:?}");
        }
    }
}
