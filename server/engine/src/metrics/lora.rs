//! The LoRA series: vLLM's `vllm:lora_requests_info` (which adapters run
//! and wait, and `--max-loras`) and requests per adapter. Exported only by
//! a server that serves adapters.

use std::collections::BTreeSet;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use ferrox_plan::contract::metric;
use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry};

use super::reg;

/// vLLM's label names, in its order.
const INFO_LABELS: [&str; 3] = ["running_lora_adapters", "waiting_lora_adapters", "max_lora"];

pub(super) struct LoraSeries {
    info: GaugeVec,
    requests: IntCounterVec,
    loaded: IntGaugeVec,
    /// `--max-loras`, once the server serves adapters.
    max_loras: OnceLock<usize>,
}

/// Distinct names, sorted, comma-separated (vLLM joins its names so).
fn joined(names: Vec<String>) -> String {
    let set: BTreeSet<String> = names.into_iter().collect();
    set.into_iter().collect::<Vec<_>>().join(",")
}

impl LoraSeries {
    pub(super) fn new(r: &Registry) -> prometheus::Result<Self> {
        let info = GaugeVec::new(
            Opts::new(
                metric::LORA_REQUESTS_INFO,
                "Running and waiting LoRA adapters (vLLM name); the value is when this set was last seen, in Unix seconds.",
            ),
            &INFO_LABELS,
        )?;
        let requests = IntCounterVec::new(
            Opts::new(
                metric::LORA_REQUESTS,
                "Requests submitted for each LoRA adapter.",
            ),
            &["adapter"],
        )?;
        let loaded = IntGaugeVec::new(
            Opts::new(
                metric::LORA_ADAPTER_LOADED,
                "Each LoRA adapter served: 1 held in memory, 0 read in again on its next request.",
            ),
            &["adapter"],
        )?;
        Ok(LoraSeries {
            info: reg(r, info)?,
            requests: reg(r, requests)?,
            loaded: reg(r, loaded)?,
            max_loras: OnceLock::new(),
        })
    }

    pub(super) fn enable(&self, max_loras: usize) {
        let _ = self.max_loras.set(max_loras);
    }

    /// Stamps the current set (the only series: an older set is dropped,
    /// so the label sets do not pile up).
    pub(super) fn set_info(&self, running: Vec<String>, waiting: Vec<String>) {
        let Some(max) = self.max_loras.get() else {
            return;
        };
        let labels = [joined(running), joined(waiting), max.to_string()];
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.info.reset();
        if let Ok(g) = self
            .info
            .get_metric_with_label_values(&labels.each_ref().map(String::as_str))
        {
            g.set(now);
        }
    }

    /// The adapters served now (an unloaded one's series goes).
    pub(super) fn set_adapters(&self, adapters: &[(String, bool)]) {
        self.loaded.reset();
        for (name, held) in adapters {
            if let Ok(g) = self.loaded.get_metric_with_label_values(&[name]) {
                g.set(i64::from(*held));
            }
        }
    }

    pub(super) fn request(&self, adapter: &str) {
        if let Ok(c) = self.requests.get_metric_with_label_values(&[adapter]) {
            c.inc();
        }
    }
}
