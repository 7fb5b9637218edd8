//! LoRA adapters on a `ModelDeployment`: each served under its own name on
//! top of the model, and the limits the servers run them with.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The CEL message for an adapter source the grammar refuses.
pub const ADAPTER_SOURCE_MESSAGE: &str = "adapters[].source must be hf://org/name[@rev][/file], pvc://claim/path, file:///path or https://host/file";

/// One LoRA adapter: requests name it as `model`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdapterSpec {
    /// The name requests give as `model`: a DNS label, unique among the
    /// adapters and not the model's served name.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// A PEFT adapter (a directory with `adapter_config.json` and
    /// `adapter_model.safetensors`) or a GGUF LoRA file, from the sources a
    /// model comes from: `hf://org/name[@rev][/file.gguf]` (a repo without a
    /// file is a PEFT adapter), `pvc://claim/path`, `file:///path` or `https://...`.
    #[x_kube(validation = Rule::new(ferrox_source::cel_rule()).message(ADAPTER_SOURCE_MESSAGE))]
    #[schemars(length(min = 1, max = 2048))]
    pub source: String,
}

/// How the servers hold adapters (vLLM's flags).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoraSpec {
    /// Distinct adapters in one step (and on a GPU); a request for another
    /// waits. Absent: the number of adapters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub max_loras: Option<i32>,
    /// The largest adapter rank the servers load.
    #[serde(default = "default_rank")]
    #[schemars(range(min = 1, max = 1024))]
    pub max_lora_rank: i32,
    /// Adapters kept in host memory. Absent: every adapter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub max_cpu_loras: Option<i32>,
}

fn default_rank() -> i32 {
    16
}

impl Default for LoraSpec {
    fn default() -> Self {
        LoraSpec {
            max_loras: None,
            max_lora_rank: default_rank(),
            max_cpu_loras: None,
        }
    }
}

/// One adapter as the ready servers report it (written by the scraper).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdapterStatus {
    /// The adapter's name.
    pub name: String,
    /// Ready replicas that serve it (list it on their `/metrics`).
    pub replicas: i32,
}
