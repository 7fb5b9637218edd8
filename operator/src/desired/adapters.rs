//! What LoRA adapters add to the server pods: `--enable-lora` and the
//! adapters in the args (so adding or removing one rolls the pods, which
//! start with exactly the spec's adapters), their claims mounted read-only
//! under [`ADAPTER_MOUNT`], and the download cache when one downloads.

use std::collections::BTreeSet;

use ferrox_plan::contract::LoraArgs;
use k8s_openapi::api::core::v1::{
    EmptyDirVolumeSource, PersistentVolumeClaimVolumeSource, Volume, VolumeMount,
};

use super::MODEL_CACHE_DIR;
use crate::crd::ModelDeployment;
use crate::lora_plan::lora_plan;
use crate::served_name::served_name;
use crate::source::{self, ModelSource, downloads};

/// Where an adapter's claim `c` is mounted: `/adapters/c`.
pub const ADAPTER_MOUNT: &str = "/adapters";

/// Each adapter's name and parsed source (one the CRD's rule let through
/// but the grammar refuses is left out: `plan::unsupported` refused it).
fn parsed(md: &ModelDeployment) -> Vec<(&str, ModelSource, &str)> {
    let each = md.spec.adapters.iter();
    each.filter_map(|a| {
        Some((
            a.name.as_str(),
            source::parse(&a.source).ok()?,
            a.source.as_str(),
        ))
    })
    .collect()
}

/// The source the server gets for an adapter's `original` source.
pub fn server_source(s: &ModelSource, original: &str) -> String {
    match s {
        ModelSource::Pvc { claim, path } => {
            let path = path.trim_start_matches('/');
            format!("{ADAPTER_MOUNT}/{claim}/{path}")
                .trim_end_matches('/')
                .to_string()
        }
        ModelSource::Local(path) => path.to_string_lossy().into_owned(),
        ModelSource::HuggingFace { .. } | ModelSource::Url(_) => original.to_string(),
    }
}

/// The LoRA flags; `None` without adapters.
pub fn lora_args(md: &ModelDeployment) -> Option<LoraArgs> {
    let adapters = parsed(md);
    if adapters.is_empty() {
        return None;
    }
    let plan = lora_plan(&md.spec)?;
    Some(LoraArgs {
        modules: (adapters.iter())
            .map(|(n, s, o)| (n.to_string(), server_source(s, o)))
            .collect(),
        max_loras: plan.max_loras,
        max_lora_rank: plan.max_lora_rank,
        max_cpu_loras: plan.max_cpu_loras,
        runtime_updates: false,
    })
}

/// Whether some adapter is downloaded by the server.
pub fn downloads_some(md: &ModelDeployment) -> bool {
    parsed(md).iter().any(|(_, s, _)| downloads(s))
}

fn claims(md: &ModelDeployment) -> BTreeSet<String> {
    let adapters = parsed(md).into_iter();
    adapters
        .filter_map(|(_, s, _)| match s {
            ModelSource::Pvc { claim, .. } => Some(claim),
            _ => None,
        })
        .collect()
}

/// Volumes beyond the model's: each adapter claim, and the download cache
/// when an adapter downloads and the model does not.
pub fn volumes(md: &ModelDeployment, model: &ModelSource) -> Vec<Volume> {
    let mut out: Vec<Volume> = claims(md)
        .into_iter()
        .map(|claim| Volume {
            name: format!("adapter-{claim}"),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim,
                read_only: Some(true),
            }),
            ..Default::default()
        })
        .collect();
    if downloads_some(md) && !downloads(model) {
        out.push(Volume {
            name: "model-cache".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        });
    }
    out
}

/// Mounts matching [`volumes`].
pub fn mounts(md: &ModelDeployment, model: &ModelSource) -> Vec<VolumeMount> {
    let mount = |name: String, path: String, read_only: bool| VolumeMount {
        name,
        mount_path: path,
        read_only: read_only.then_some(true),
        ..Default::default()
    };
    let mut out: Vec<VolumeMount> = claims(md)
        .into_iter()
        .map(|c| mount(format!("adapter-{c}"), format!("{ADAPTER_MOUNT}/{c}"), true))
        .collect();
    if downloads_some(md) && !downloads(model) {
        out.push(mount("model-cache".into(), MODEL_CACHE_DIR.into(), false));
    }
    out
}

/// Why the spec's adapters cannot be served (a condition reason and a
/// message): a name that is the served model's own (`metadata.name` when
/// no `servedName`; CEL checks the rest), or a source the grammar refuses.
pub fn refusal(md: &ModelDeployment) -> Option<(&'static str, String)> {
    let served = served_name(md);
    if let Some(a) = md.spec.adapters.iter().find(|a| a.name == served) {
        let message = format!(
            "adapter {:?} has the model's served name; requests could not tell them apart",
            a.name
        );
        return Some(("InvalidSpec", message));
    }
    let bad =
        (md.spec.adapters.iter()).find_map(|a| source::parse(&a.source).err().map(|e| (a, e)));
    bad.map(|(a, e)| ("InvalidSpec", format!("adapter {:?}: {e}", a.name)))
}

#[cfg(test)]
mod tests;
