//! Where a plan's geometry comes from: the spec, a past inspection recorded in
//! status, or the termination message of an inspection pod.

use ferrox_plan::{DeviceKind, DraftPlan, Footprint, Footprints, KvDtype, ModelGeometry, Task};
use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;

use crate::Error;
use crate::crd::{
    DeviceFootprints, DraftGeometry, FootprintStatus, GeometrySpec, ModelDeployment,
    ObservedGeometry,
};

/// `ferrox-server inspect --json`: the geometry (top-level weight bytes and
/// KV dtype are the CPU figures) and, from newer servers, every device's.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Inspected {
    /// The shape facts.
    #[serde(flatten)]
    pub geometry: ModelGeometry,
    /// How the model is held on each device kind.
    #[serde(default)]
    pub devices: Option<Footprints>,
    /// What the model's files say it serves (absent from older servers).
    #[serde(default)]
    pub task: Option<Task>,
}

/// `status.geometry.source` when the geometry came from the spec.
pub const FROM_SPEC: &str = "spec";

/// The geometry already known for `md`'s current spec, if any: the model's
/// and, when the spec names a draft model, the draft's (without it, none:
/// the inspection learns both).
pub fn known(md: &ModelDeployment) -> Option<ObservedGeometry> {
    let recorded = md.status.as_ref().and_then(|s| s.geometry.as_ref());
    let mut g = match &md.spec.model.geometry {
        Some(g) => from_spec(g),
        None => recorded
            .filter(|g| g.source == md.spec.model.source)?
            .clone(),
    };
    g.draft = match draft_source(md) {
        None => None,
        Some(source) => Some(known_draft(md, source, recorded)?),
    };
    Some(g)
}

fn from_spec(g: &GeometrySpec) -> ObservedGeometry {
    ObservedGeometry {
        source: FROM_SPEC.into(),
        geometry: g.clone(),
        devices: None,
        task: None,
        draft: None,
    }
}

/// The draft model's source, when the spec names one.
pub fn draft_source(md: &ModelDeployment) -> Option<&str> {
    md.spec.speculative.as_ref()?.draft_source()
}

fn known_draft(
    md: &ModelDeployment,
    source: &str,
    recorded: Option<&ObservedGeometry>,
) -> Option<DraftGeometry> {
    let given = (md.spec.speculative.as_ref()).and_then(|s| s.draft_geometry.as_ref());
    if let Some(g) = given {
        return Some(DraftGeometry {
            source: FROM_SPEC.into(),
            geometry: g.clone(),
            devices: None,
        });
    }
    recorded?.draft.clone().filter(|d| d.source == source)
}

/// Parses `ferrox-server inspect --json` output (extra fields are ignored):
/// its first JSON line.
pub fn parse_inspect(json: &str) -> Result<Inspected, Error> {
    parse_inspections(json)?
        .into_iter()
        .next()
        .ok_or(Error::Missing("a JSON line in the inspect output"))
}

/// Every JSON line of an inspection's output, in order: the model's, then
/// the draft model's when one was inspected.
pub fn parse_inspections(json: &str) -> Result<Vec<Inspected>, Error> {
    let lines = json.lines().map(str::trim).filter(|l| l.starts_with('{'));
    lines
        .map(|l| serde_json::from_str(l).map_err(Error::from))
        .collect()
}

/// `md`'s geometry from an inspection's output: the model's and, when the
/// spec names a draft, the draft's (the spec's `draftGeometry`, else the
/// output's second line).
pub fn from_inspection(md: &ModelDeployment, json: &str) -> Result<ObservedGeometry, Error> {
    let all = parse_inspections(json)?;
    let first = all
        .first()
        .ok_or(Error::Missing("a JSON line in the inspect output"))?;
    let mut g = observed(&md.spec.model.source, first);
    if let Some(source) = draft_source(md) {
        // The spec's draft geometry, else the inspection's second line.
        g.draft = match known_draft(md, source, None) {
            Some(d) => Some(d),
            None => {
                let line = all
                    .get(1)
                    .ok_or(Error::Missing("the draft model's JSON line"))?;
                Some(observed_draft(source, line))
            }
        };
    }
    Ok(g)
}

/// A draft model's inspection as status records it.
pub fn observed_draft(source: &str, inspected: &Inspected) -> DraftGeometry {
    let g = observed(source, inspected);
    DraftGeometry {
        source: g.source,
        geometry: g.geometry,
        devices: g.devices,
    }
}

/// An inspection as status records it.
pub fn observed(source: &str, inspected: &Inspected) -> ObservedGeometry {
    ObservedGeometry {
        source: source.to_string(),
        geometry: GeometrySpec::from(&inspected.geometry),
        devices: inspected.devices.as_ref().map(|d| DeviceFootprints {
            cpu: footprint_status(&d.cpu),
            cuda: footprint_status(&d.cuda),
        }),
        task: inspected.task,
        draft: None,
    }
}

/// The geometry to plan with on `device`: the inspected device's weights and
/// KV dtype when known, else the recorded (or spec's) figures as given.
pub fn held_on(g: &ObservedGeometry, device: DeviceKind) -> ModelGeometry {
    held(&g.geometry, g.devices.as_ref(), device)
}

/// What the draft model adds to the plan on `device`: its weights as held
/// there, and its KV in the target's `kv_dtype` (the server holds it so).
pub fn draft_plan(d: &DraftGeometry, device: DeviceKind, kv_dtype: KvDtype) -> DraftPlan {
    let held = held(&d.geometry, d.devices.as_ref(), device);
    DraftPlan {
        weight_bytes: held.weight_bytes,
        kv_bytes_per_token: ModelGeometry { kv_dtype, ..held }.kv_bytes_per_token(),
    }
}

fn held(g: &GeometrySpec, devices: Option<&DeviceFootprints>, device: DeviceKind) -> ModelGeometry {
    let base = g.for_device(device);
    match devices {
        Some(d) => base.held_as(&to_footprint(match device {
            DeviceKind::Cpu => &d.cpu,
            DeviceKind::Cuda => &d.cuda,
        })),
        None => base,
    }
}

/// `g` with its numbers replaced by those planned with on `device`.
pub fn as_planned(g: &ObservedGeometry, device: DeviceKind) -> ObservedGeometry {
    ObservedGeometry {
        geometry: GeometrySpec::from(&held_on(g, device)),
        ..g.clone()
    }
}

fn footprint_status(f: &Footprint) -> FootprintStatus {
    let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    FootprintStatus {
        weight_bytes: n(f.weight_bytes),
        kv_dtype: f.kv_dtype,
        kv_bytes_per_token: n(f.kv_bytes_per_token),
    }
}

fn to_footprint(f: &FootprintStatus) -> Footprint {
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    Footprint {
        weight_bytes: n(f.weight_bytes),
        kv_dtype: f.kv_dtype,
        kv_bytes_per_token: n(f.kv_bytes_per_token),
    }
}

/// The geometry a successful inspection pod reported for `md`, if one did.
pub fn from_pods(pods: &[Pod], md: &ModelDeployment) -> Option<Result<ObservedGeometry, Error>> {
    let message = pods.iter().find_map(|pod| {
        let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
        statuses.iter().find_map(|cs| {
            let t = cs.state.as_ref()?.terminated.as_ref()?;
            (t.exit_code == 0).then(|| t.message.clone()).flatten()
        })
    })?;
    // A model geometry the spec gives wins, as in [`known`] (the Job ran
    // for the draft's).
    let given = md.spec.model.geometry.as_ref().map(from_spec);
    Some(from_inspection(md, &message).map(|g| match given {
        Some(spec) => ObservedGeometry {
            draft: g.draft,
            ..spec
        },
        None => g,
    }))
}

#[cfg(test)]
mod tests;
