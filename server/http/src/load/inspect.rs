//! `ferrox-server inspect`: the model's geometry and weight bytes, and the
//! task its files say, for the operator's capacity plan (one line of JSON
//! with `--json`).

use std::path::PathBuf;

use anyhow::Context;
use ferrox_models::{ModelInfo, Source};
use ferrox_plan::Task;
use serde::Serialize;

/// What to inspect.
#[derive(Debug, Clone)]
pub struct InspectConfig {
    /// Model file or directory.
    pub model: PathBuf,
    /// One line of JSON instead of a table.
    pub json: bool,
}

/// Prints the model's facts on stdout. Reads headers only, not weights.
pub fn run(config: &InspectConfig) -> anyhow::Result<()> {
    let context = || format!("inspecting {}", config.model.display());
    let mut source = Source::open(&config.model).with_context(context)?;
    let info = source.info().with_context(context)?;
    let encoder = !source.spec().with_context(context)?.keeps_cache();
    let task = super::task::found(&source.pooling_files().with_context(context)?, encoder);
    let info = Inspection { info, task };
    if config.json {
        println!("{}", serde_json::to_string(&info)?);
        return Ok(());
    }
    let value = serde_json::to_value(&info)?;
    if let Some(map) = value.as_object() {
        for (k, v) in map {
            println!("{k:<18} {v}");
        }
    }
    Ok(())
}

/// What `inspect` prints: the model's facts and the task its files say
/// (which the operator plans with when `spec.task` is absent).
#[derive(Serialize)]
struct Inspection {
    #[serde(flatten)]
    info: ModelInfo,
    task: Task,
}
