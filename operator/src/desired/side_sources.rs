//! The sources the pods read beside the model's: the LoRA adapters' and the
//! draft model's. Each claim is mounted read-only under its kind's root
//! (`/adapters/CLAIM`, `/draft/CLAIM`), and a download cache is added when
//! one of them downloads and the model does not.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{
    EmptyDirVolumeSource, PersistentVolumeClaimVolumeSource, Volume, VolumeMount,
};

use super::MODEL_CACHE_DIR;
use crate::crd::ModelDeployment;
use crate::geometry::draft_source;
use crate::source::{self, ModelSource, downloads};

/// What a side source is for: where its claims mount and what their
/// volumes are called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SideKind {
    /// A LoRA adapter.
    Adapter,
    /// The draft model of speculative decoding.
    Draft,
}

impl SideKind {
    /// Where a claim `c` of this kind is mounted: `ROOT/c`.
    pub fn root(self) -> &'static str {
        match self {
            SideKind::Adapter => "/adapters",
            SideKind::Draft => "/draft",
        }
    }

    fn volume(self, claim: &str) -> String {
        match self {
            SideKind::Adapter => format!("adapter-{claim}"),
            SideKind::Draft => format!("draft-{claim}"),
        }
    }
}

/// Every side source the grammar accepts (one it refuses is left out:
/// `plan::unsupported` or `adapters::refusal` refused it).
fn sides(md: &ModelDeployment) -> Vec<(SideKind, ModelSource)> {
    let adapters = (md.spec.adapters.iter()).map(|a| (SideKind::Adapter, a.source.as_str()));
    let draft = draft_source(md).map(|s| (SideKind::Draft, s));
    adapters
        .chain(draft)
        .filter_map(|(k, s)| Some((k, source::parse(s).ok()?)))
        .collect()
}

/// The path or source the server gets for a side source `original` of
/// `kind`: a claim's mount path, a local path, or the source to download.
pub fn server_path(kind: SideKind, s: &ModelSource, original: &str) -> String {
    match s {
        ModelSource::Pvc { claim, path } => {
            let path = path.trim_start_matches('/');
            format!("{}/{claim}/{path}", kind.root())
                .trim_end_matches('/')
                .to_string()
        }
        ModelSource::Local(path) => path.to_string_lossy().into_owned(),
        ModelSource::HuggingFace { .. } | ModelSource::Url(_) => original.to_string(),
    }
}

/// Whether the server downloads some side source.
pub fn downloads_some(md: &ModelDeployment) -> bool {
    sides(md).iter().any(|(_, s)| downloads(s))
}

fn claims(md: &ModelDeployment) -> BTreeSet<(SideKind, String)> {
    let sides = sides(md).into_iter();
    sides
        .filter_map(|(k, s)| match s {
            ModelSource::Pvc { claim, .. } => Some((k, claim)),
            _ => None,
        })
        .collect()
}

/// Volumes beyond the model's: each side claim, and the download cache
/// when a side source downloads and the model does not.
pub fn volumes(md: &ModelDeployment, model: &ModelSource) -> Vec<Volume> {
    let mut out: Vec<Volume> = claims(md)
        .into_iter()
        .map(|(kind, claim)| Volume {
            name: kind.volume(&claim),
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
        .map(|(k, c)| mount(k.volume(&c), format!("{}/{c}", k.root()), true))
        .collect();
    if downloads_some(md) && !downloads(model) {
        out.push(mount("model-cache".into(), MODEL_CACHE_DIR.into(), false));
    }
    out
}

/// The draft model's path or source as the server gets it, when the spec
/// names a draft the grammar accepts.
pub fn draft_server_path(md: &ModelDeployment) -> Option<String> {
    let original = draft_source(md)?;
    let parsed = source::parse(original).ok()?;
    Some(server_path(SideKind::Draft, &parsed, original))
}
