//! What the server runs with, whichever way it was sized (a generating
//! model's pools, a pooling model's batch budget).

use ferrox_engine::EngineConfig;
use ferrox_models::memory::DeviceMemory;
use ferrox_plan::{KvDtype, Plan};

/// What the server runs with: the engine's limits, the plan behind them and
/// the memory figure it was made from.
#[derive(Debug, Clone)]
pub struct Sizing {
    /// The engine's limits.
    pub engine: EngineConfig,
    /// The capacity plan.
    pub plan: Plan,
    /// The KV element type.
    pub kv_dtype: KvDtype,
    /// The memory the plan was made from or checked against.
    pub memory: DeviceMemory,
    /// What sized the pool: the rule (`max-seqs-fit`, `memory-budget`) or
    /// the flag that did.
    pub sized_by: &'static str,
}
