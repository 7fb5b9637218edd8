//! `ferrox-server inspect`: the model's geometry and weight bytes, for the
//! operator's capacity plan (one line of JSON with `--json`).

use std::path::PathBuf;

use anyhow::Context;
use ferrox_models::Source;

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
    let info = Source::open(&config.model)
        .and_then(|mut s| s.info())
        .with_context(|| format!("inspecting {}", config.model.display()))?;
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
