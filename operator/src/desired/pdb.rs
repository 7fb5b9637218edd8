//! The PodDisruptionBudget that keeps voluntary evictions to one pod at a time.

use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::{child_meta, selector_labels};
use crate::Error;
use crate::crd::ModelDeployment;

/// The PDB for `md` (rendered only when it runs more than one replica).
pub fn pdb(md: &ModelDeployment) -> Result<PodDisruptionBudget, Error> {
    Ok(PodDisruptionBudget {
        metadata: child_meta(md, md.name_any())?,
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(md)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    })
}
