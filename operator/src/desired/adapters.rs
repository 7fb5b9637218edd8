//! What LoRA adapters add to the server pods: `--enable-lora` and the
//! adapters in the args (so adding or removing one rolls the pods, which
//! start with exactly the spec's adapters); their claims and the download
//! cache are [`super::side_sources`]'.

use ferrox_plan::contract::LoraArgs;

use super::side_sources::{SideKind, server_path};
use crate::crd::ModelDeployment;
use crate::lora_plan::lora_plan;
use crate::served_name::served_name;
use crate::source::{self, ModelSource};

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
    server_path(SideKind::Adapter, s, original)
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
