//! The short Job that runs `ferrox-server inspect` to learn a model's geometry.
//!
//! `inspect --json` prints one line; the container copies it into its
//! termination message, which the operator reads from the pod's status.

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;

use super::deployment::{
    container_security_context, env, image, pod_security_context, volume_mounts, volumes,
};
use super::side_sources::{self, draft_server_path};
use super::{DesiredConfig, child_meta};
use crate::Error;
use crate::crd::ModelDeployment;
use crate::geometry::draft_source;
use crate::source;

/// Where the container writes its one line of JSON.
pub const TERMINATION_LOG: &str = "/dev/termination-log";

/// Name of the inspection Job for the current sources (a new model or
/// draft source, a new Job).
pub fn job_name(md: &ModelDeployment) -> String {
    let mut sources = md.spec.model.source.clone();
    if let Some(draft) = draft_source(md) {
        sources = format!("{sources}\n{draft}");
    }
    format!("{}-inspect-{:08x}", md.name_any(), fnv1a(&sources))
}

/// The inspection Job for `md`'s model source, and its draft model's when
/// the spec names one (its line second).
pub fn inspect_job(md: &ModelDeployment, config: &DesiredConfig) -> Result<Job, Error> {
    let source = source::parse(&md.spec.model.source)?;
    let model_arg = shell_quote(&source::server_arg(&source, &md.spec.model.source));
    let mut script =
        format!("ferrox-server inspect --model {model_arg} --json > {TERMINATION_LOG}");
    // A draft whose geometry the spec gives is not inspected.
    let given = (md.spec.speculative.as_ref()).is_some_and(|s| s.draft_geometry.is_some());
    if let Some(draft) = draft_server_path(md).filter(|_| !given) {
        let draft = shell_quote(&draft);
        script += &format!(" && ferrox-server inspect --model {draft} --json >> {TERMINATION_LOG}");
    }
    // The output goes to the termination log (kept by the kubelet) and to the log.
    script += &format!(" && cat {TERMINATION_LOG}");
    let mut volumes = volumes(md, &source);
    volumes.extend(side_sources::volumes(md, &source));
    let mut mounts = volume_mounts(&source);
    mounts.extend(side_sources::mounts(md, &source));
    let container = Container {
        name: "inspect".into(),
        image: Some(image(md, config)),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(vec!["/bin/sh".into(), "-c".into(), script]),
        termination_message_path: Some(TERMINATION_LOG.into()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        env: Some(env(md, &source)),
        volume_mounts: Some(mounts),
        security_context: Some(container_security_context()),
        resources: Some(ResourceRequirements {
            limits: Some([("memory".to_string(), Quantity("1Gi".into()))].into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    Ok(Job {
        metadata: child_meta(md, job_name(md))?,
        spec: Some(JobSpec {
            backoff_limit: Some(2),
            active_deadline_seconds: Some(1800),
            ttl_seconds_after_finished: Some(3600),
            template: PodTemplateSpec {
                metadata: None,
                spec: Some(PodSpec {
                    containers: vec![container],
                    volumes: Some(volumes),
                    restart_policy: Some("Never".into()),
                    security_context: Some(pod_security_context()),
                    image_pull_secrets: md.spec.image_pull_secrets.clone(),
                    service_account_name: md.spec.service_account_name.clone(),
                    automount_service_account_token: Some(false),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    })
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// 32-bit FNV-1a: a short, stable name suffix.
fn fnv1a(s: &str) -> u32 {
    s.bytes().fold(0x811c9dc5u32, |h, b| {
        (h ^ b as u32).wrapping_mul(0x01000193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{gpu_spec, md};

    #[test]
    fn job_runs_inspect_into_the_termination_log() {
        let mut spec = gpu_spec(1, "80Gi");
        spec.model.source = "pvc://models/llama-8b".into();
        let md = md("llama", spec);
        let job = inspect_job(&md, &DesiredConfig::default()).unwrap();
        let pod = job.spec.unwrap().template.spec.unwrap();
        let c = &pod.containers[0];
        assert_eq!(
            c.command.as_ref().unwrap()[2],
            "ferrox-server inspect --model '/models/llama-8b' --json > /dev/termination-log && cat /dev/termination-log"
        );
        assert_eq!(c.termination_message_path.as_deref(), Some(TERMINATION_LOG));
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
        assert!(
            c.resources
                .as_ref()
                .unwrap()
                .limits
                .as_ref()
                .unwrap()
                .get("nvidia.com/gpu")
                .is_none()
        );
    }

    #[test]
    fn a_new_source_gets_a_new_job() {
        let a = md("llama", gpu_spec(1, "80Gi"));
        let mut b = a.clone();
        b.spec.model.source = "hf://org/other".into();
        assert_ne!(job_name(&a), job_name(&b));
        assert_eq!(job_name(&a), job_name(&a.clone()));
        assert!(job_name(&a).starts_with("llama-inspect-"));
        // Naming a draft model inspects again, for its geometry.
        let mut c = a.clone();
        c.spec.speculative = Some(crate::fixtures::draft("pvc://drafts/d.gguf"));
        assert_ne!(job_name(&a), job_name(&c));
    }

    #[test]
    fn a_draft_model_is_inspected_second_from_its_claim() {
        let mut spec = gpu_spec(1, "80Gi");
        spec.model.source = "pvc://models/llama-8b".into();
        spec.speculative = Some(crate::fixtures::draft("pvc://drafts/small/d.gguf"));
        let job = inspect_job(&md("llama", spec), &DesiredConfig::default()).unwrap();
        let pod = job.spec.unwrap().template.spec.unwrap();
        let c = &pod.containers[0];
        assert_eq!(
            c.command.as_ref().unwrap()[2],
            "ferrox-server inspect --model '/models/llama-8b' --json > /dev/termination-log \
             && ferrox-server inspect --model '/draft/drafts/small/d.gguf' --json >> \
             /dev/termination-log && cat /dev/termination-log"
        );
        let mounts = c.volume_mounts.clone().unwrap();
        let draft = mounts.iter().find(|m| m.name == "draft-drafts").unwrap();
        assert_eq!(
            (draft.mount_path.as_str(), draft.read_only),
            ("/draft/drafts", Some(true))
        );
        let vols = pod.volumes.unwrap();
        let claim = vols.iter().find(|v| v.name == "draft-drafts").unwrap();
        let claim = claim.persistent_volume_claim.as_ref().unwrap();
        assert_eq!(claim.claim_name, "drafts");
    }

    #[test]
    fn a_draft_whose_geometry_is_given_is_not_inspected() {
        let mut spec = gpu_spec(1, "80Gi");
        let mut draft = crate::fixtures::draft("pvc://drafts/d.gguf");
        draft.draft_geometry = Some((&crate::fixtures::smollm2_135m()).into());
        spec.speculative = Some(draft);
        let job = inspect_job(&md("m", spec), &DesiredConfig::default()).unwrap();
        let pod = job.spec.unwrap().template.spec.unwrap();
        let script = &pod.containers[0].command.as_ref().unwrap()[2];
        assert!(!script.contains("/draft/"), "{script}");
    }
}
