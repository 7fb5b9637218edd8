//! The status a reconcile should leave, and the events its decisions deserve.
//! Pure: the clock comes in as `now`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use crate::crd::{AcceleratorStatus, ModelDeployment, ModelDeploymentStatus, ObservedGeometry};
use crate::desired::selector_string;
use crate::desired::service::url;
use crate::observed_plan::{Expected, verdict};
use crate::plan::{Planned, to_status};
use crate::router::RouterService;
use crate::served_name::served_name;

/// What the reconciler learnt about the plan.
#[derive(Debug, Clone, PartialEq)]
pub enum PlanOutcome {
    /// No geometry yet (inspection running).
    Pending {
        /// Condition reason.
        reason: &'static str,
        /// Human message.
        message: String,
    },
    /// The spec cannot run as asked.
    Refused {
        /// Condition reason (`InsufficientMemory`, `NoMatchingNodes`,
        /// `TensorParallelUnsupported`, `InspectionFailed`, `InvalidSpec`,
        /// `KvCacheClaimImmutable`).
        reason: &'static str,
        /// Human message, with the numbers.
        message: String,
    },
    /// The numbers.
    Planned(Box<Planned>),
}

/// What one reconcile observed.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    /// The plan, or why there is none.
    pub outcome: PlanOutcome,
    /// The geometry planned with.
    pub geometry: Option<ObservedGeometry>,
    /// `status.replicas` of the Deployment.
    pub replicas: i32,
    /// `status.readyReplicas` of the Deployment.
    pub ready_replicas: i32,
    /// `status.updatedReplicas` of the Deployment.
    pub updated_replicas: i32,
    /// The GPUs planned for.
    pub accelerator: Option<AcceleratorStatus>,
    /// Why pods are Pending, when the scheduler said (`PodScheduled=False`).
    pub unschedulable: Option<String>,
}

/// A decision worth an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Warning rather than Normal.
    pub warning: bool,
    /// PascalCase reason.
    pub reason: String,
    /// Human note.
    pub note: String,
}

/// The status the reconciler owns (everything but `autoscaler`).
pub fn desired_status(
    md: &ModelDeployment,
    observed: &Observed,
    router: Option<&RouterService>,
    now: &Time,
) -> ModelDeploymentStatus {
    let generation = md.meta().generation;
    let old = md
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or(&[]);
    let conditions = conditions(md, observed)
        .into_iter()
        .map(|(type_, status, reason, message)| {
            let transition = old
                .iter()
                .find(|c| c.type_ == type_ && c.status == status)
                .map(|c| c.last_transition_time.clone())
                .unwrap_or_else(|| now.clone());
            Condition {
                type_: type_.into(),
                status: status.into(),
                reason: reason.into(),
                message,
                observed_generation: generation,
                last_transition_time: transition,
            }
        })
        .collect();
    ModelDeploymentStatus {
        observed_generation: generation,
        conditions,
        replicas: observed.replicas,
        ready_replicas: observed.ready_replicas,
        selector: Some(selector_string(md)),
        served_name: Some(served_name(md)),
        url: Some(url(md, router)),
        accelerator: observed.accelerator.clone(),
        geometry: observed.geometry.clone(),
        plan: match &observed.outcome {
            PlanOutcome::Planned(p) => Some(to_status(p)),
            _ => None,
        },
        observed_plan: None,
        autoscaler: None,
        // The scraper's, as `autoscaler` and `observedPlan`.
        adapters: Vec::new(),
        kv_tiers: Vec::new(),
    }
}

type Cond = (&'static str, &'static str, &'static str, String);

fn conditions(md: &ModelDeployment, o: &Observed) -> Vec<Cond> {
    let want = md.spec.replicas;
    let planned: Cond = match &o.outcome {
        PlanOutcome::Pending { reason, message } => ("Planned", "Unknown", reason, message.clone()),
        PlanOutcome::Refused { reason, message } => ("Planned", "False", reason, message.clone()),
        PlanOutcome::Planned(p) => (
            "Planned",
            "True",
            "Planned",
            format!(
                "{} KV blocks of {} tokens ({} bytes), up to {} sequences of {} tokens \
                 (planned for {}-token requests) in {} bytes from {}",
                p.plan.blocks(ferrox_plan::CacheKind::Full),
                p.plan.block_size,
                p.plan.kv_budget_bytes,
                p.plan.max_seqs,
                p.plan.max_model_len,
                p.typical_seq_len,
                p.memory.bytes,
                p.memory.from
            ),
        ),
    };
    let is_planned = matches!(o.outcome, PlanOutcome::Planned(_));
    let ready: Cond = if !is_planned {
        ("Ready", "False", "NotPlanned", "no plan, no pods".into())
    } else if want == 0 {
        (
            "Ready",
            "False",
            "ScaledToZero",
            "spec.replicas is 0".into(),
        )
    } else if o.ready_replicas >= want {
        (
            "Ready",
            "True",
            "AllReplicasReady",
            format!("{}/{want} replicas ready", o.ready_replicas),
        )
    } else if let Some(why) = &o.unschedulable {
        (
            "Ready",
            "False",
            "PodsUnschedulable",
            format!(
                "{}/{want} replicas ready; pods Pending: {why}",
                o.ready_replicas
            ),
        )
    } else {
        (
            "Ready",
            "False",
            "ReplicasNotReady",
            format!("{}/{want} replicas ready", o.ready_replicas),
        )
    };
    let rolling =
        is_planned && (o.updated_replicas < want || o.ready_replicas < want || o.replicas > want);
    let progressing: Cond = if rolling {
        (
            "Progressing",
            "True",
            "RollingOut",
            format!("{}/{want} replicas updated", o.updated_replicas),
        )
    } else {
        ("Progressing", "False", "Stable", "nothing in flight".into())
    };
    let degraded: Cond = match &o.outcome {
        PlanOutcome::Refused { reason, message } => ("Degraded", "True", reason, message.clone()),
        _ => ("Degraded", "False", "AsExpected", "".into()),
    };
    let verified = verified(md, o);
    let mut out = vec![ready, progressing, degraded, planned, verified];
    out.extend(scaled_to_zero(md));
    out
}

/// `ScaledToZero`, for a model whose autoscaling may take it to zero.
fn scaled_to_zero(md: &ModelDeployment) -> Option<Cond> {
    let a = md.spec.autoscaling.as_ref()?;
    if !a.enabled || a.min_replicas > 0 {
        return None;
    }
    Some(match md.spec.replicas {
        0 => (
            "ScaledToZero",
            "True",
            "Idle",
            "no replica; the first request through ferrox-router wakes one".into(),
        ),
        n => (
            "ScaledToZero",
            "False",
            "Awake",
            format!("{n} replicas wanted"),
        ),
    })
}

/// `PlanVerified`: the servers' reported plan against this one.
fn verified(md: &ModelDeployment, o: &Observed) -> Cond {
    let (PlanOutcome::Planned(p), Some(_)) = (&o.outcome, &o.geometry) else {
        return (
            "PlanVerified",
            "Unknown",
            "NotPlanned",
            "no plan to verify".into(),
        );
    };
    let plan = to_status(p);
    let expected = Expected {
        plan: &plan,
        kv_dtype: p.kv_dtype.name(),
    };
    let observed = md.status.as_ref().and_then(|s| s.observed_plan.as_ref());
    let (status, reason, message) = verdict(observed, &expected);
    ("PlanVerified", status, reason, message)
}

/// Why server pods are Pending, from the scheduler's `PodScheduled=False`
/// condition on them: how many, and the first one's message.
pub fn unschedulable(pods: &[k8s_openapi::api::core::v1::Pod]) -> Option<String> {
    let messages: Vec<&str> = pods
        .iter()
        .filter_map(|p| {
            let c = p
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
            Some(c.message.as_deref().unwrap_or("unschedulable"))
        })
        .collect();
    let first = messages.first()?;
    Some(format!("{} unschedulable: {first}", messages.len()))
}

/// The status patch (server-side apply body) to send, or `None` when nothing changed.
pub fn status_patch(md: &ModelDeployment, next: &ModelDeploymentStatus) -> Option<Value> {
    let current = md.status.clone().map(|s| ModelDeploymentStatus {
        autoscaler: None,
        observed_plan: None,
        adapters: Vec::new(),
        kv_tiers: Vec::new(),
        ..s
    });
    if current.as_ref() == Some(next) {
        return None;
    }
    Some(json!({
        "apiVersion": ModelDeployment::api_version(&()),
        "kind": ModelDeployment::kind(&()),
        "metadata": {"name": md.name_any()},
        "status": next,
    }))
}

/// Events for what changed between the old status and the next: every new
/// Planned verdict, becoming Ready, and losing Ready.
pub fn decisions(
    old: Option<&ModelDeploymentStatus>,
    next: &ModelDeploymentStatus,
) -> Vec<Decision> {
    let find = |s: Option<&ModelDeploymentStatus>, t: &str| {
        s.and_then(|s| s.conditions.iter().find(|c| c.type_ == t).cloned())
    };
    let mut out = Vec::new();
    if let Some(new) = find(Some(next), "Planned") {
        let old = find(old, "Planned");
        if old.is_none_or(|o| o.status != new.status || o.reason != new.reason) {
            out.push(Decision {
                warning: new.status == "False",
                reason: new.reason.clone(),
                note: new.message.clone(),
            });
        }
    }
    if let Some(new) = find(Some(next), "Ready") {
        let was_ready = find(old, "Ready").is_some_and(|o| o.status == "True");
        let is_ready = new.status == "True";
        if was_ready != is_ready {
            out.push(Decision {
                warning: !is_ready,
                reason: new.reason.clone(),
                note: new.message.clone(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::GeometrySpec;
    use crate::fixtures::{self, gpu_spec, md};
    use crate::plan::plan_offline;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    fn planned(ready: i32) -> Observed {
        let plan = plan_offline(&gpu_spec(1, "80Gi"), &fixtures::llama3_8b()).unwrap();
        Observed {
            outcome: PlanOutcome::Planned(Box::new(plan)),
            geometry: Some(ObservedGeometry {
                source: "spec".into(),
                geometry: GeometrySpec::from(&fixtures::llama3_8b()),
                devices: None,
                task: None,
                draft: None,
            }),
            replicas: ready.max(1),
            ready_replicas: ready,
            updated_replicas: ready.max(1),
            accelerator: None,
            unschedulable: None,
        }
    }

    fn cond<'a>(s: &'a ModelDeploymentStatus, t: &str) -> (&'a str, &'a str) {
        let c = s.conditions.iter().find(|c| c.type_ == t).unwrap();
        (c.status.as_str(), c.reason.as_str())
    }

    #[test]
    fn conditions_per_outcome() {
        let refused = Observed {
            outcome: PlanOutcome::Refused {
                reason: "InsufficientMemory",
                message: "needs more".into(),
            },
            ..planned(0)
        };
        let pending = Observed {
            outcome: PlanOutcome::Pending {
                reason: "Inspecting",
                message: "job running".into(),
            },
            ..planned(0)
        };
        let cases = [
            (
                "ready",
                planned(1),
                [
                    ("True", "AllReplicasReady"),
                    ("False", "Stable"),
                    ("False", "AsExpected"),
                    ("True", "Planned"),
                ],
            ),
            (
                "starting",
                planned(0),
                [
                    ("False", "ReplicasNotReady"),
                    ("True", "RollingOut"),
                    ("False", "AsExpected"),
                    ("True", "Planned"),
                ],
            ),
            (
                "refused",
                refused,
                [
                    ("False", "NotPlanned"),
                    ("False", "Stable"),
                    ("True", "InsufficientMemory"),
                    ("False", "InsufficientMemory"),
                ],
            ),
            (
                "pending",
                pending,
                [
                    ("False", "NotPlanned"),
                    ("False", "Stable"),
                    ("False", "AsExpected"),
                    ("Unknown", "Inspecting"),
                ],
            ),
        ];
        let md = md("m", gpu_spec(1, "80Gi"));
        for (name, observed, want) in cases {
            let s = desired_status(&md, &observed, None, &at(100));
            let got = ["Ready", "Progressing", "Degraded", "Planned"].map(|t| cond(&s, t));
            assert!(
                s.conditions.iter().any(|c| c.type_ == "PlanVerified"),
                "{name}"
            );
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn transitions_keep_their_time_until_status_flips() {
        let mut md = md("m", gpu_spec(1, "80Gi"));
        let first = desired_status(&md, &planned(0), None, &at(100));
        md.status = Some(first.clone());
        let same = desired_status(&md, &planned(0), None, &at(200));
        assert_eq!(same, first, "nothing changed, so nothing moves");
        assert!(status_patch(&md, &same).is_none());
        let ready = desired_status(&md, &planned(1), None, &at(300));
        let time = |s: &ModelDeploymentStatus, t: &str| {
            s.conditions
                .iter()
                .find(|c| c.type_ == t)
                .unwrap()
                .last_transition_time
                .clone()
        };
        assert_eq!(time(&ready, "Ready"), at(300));
        assert_eq!(time(&ready, "Planned"), at(100));
        assert!(status_patch(&md, &ready).is_some());
    }

    #[test]
    fn the_autoscalers_part_is_not_a_change() {
        let mut md = md("m", gpu_spec(1, "80Gi"));
        let next = desired_status(&md, &planned(1), None, &at(1));
        md.status = Some(ModelDeploymentStatus {
            autoscaler: Some(crate::crd::AutoscalerStatus {
                desired_replicas: 2,
                last_scale_time: None,
                last_wake_time: None,
                reason: "x".into(),
                observed_queue: 0.0,
                observed_pending: 0.0,
                observed_kv_usage: 0.0,
                observed_pods: 1,
            }),
            ..next.clone()
        });
        assert!(status_patch(&md, &next).is_none());
    }

    #[test]
    fn decisions_fire_on_change_only() {
        let md = md("m", gpu_spec(1, "80Gi"));
        let refused = Observed {
            outcome: PlanOutcome::Refused {
                reason: "InsufficientMemory",
                message: "needs 5 bytes".into(),
            },
            ..planned(0)
        };
        let s1 = desired_status(&md, &refused, None, &at(1));
        let d = decisions(None, &s1);
        assert_eq!(d.len(), 1);
        assert!(d[0].warning);
        assert_eq!(d[0].reason, "InsufficientMemory");
        assert!(decisions(Some(&s1), &s1).is_empty());
        let s2 = desired_status(&md, &planned(1), None, &at(2));
        let reasons: Vec<_> = decisions(Some(&s1), &s2)
            .into_iter()
            .map(|d| d.reason)
            .collect();
        assert_eq!(reasons, ["Planned", "AllReplicasReady"]);
    }

    #[test]
    fn plan_verified_follows_the_servers_reports() {
        let mut md = md("m", gpu_spec(1, "80Gi"));
        let o = planned(1);
        let PlanOutcome::Planned(p) = &o.outcome else {
            unreachable!()
        };
        let plan = to_status(p);
        let report = |kv_blocks: i64, kv_dtype: &str| crate::crd::ObservedPlanStatus {
            pods: 1,
            disagreeing_pods: i32::from(kv_blocks != plan.kv_blocks || kv_dtype != "bf16"),
            kv_blocks,
            block_size: plan.block_size,
            kv_dtype: kv_dtype.into(),
            max_seqs: Some(plan.max_seqs),
            weight_bytes: None,
            memory_bytes: None,
            memory_source: None,
            pools: vec![crate::crd::ObservedPoolStatus {
                pool: "full".into(),
                blocks: kv_blocks,
            }],
            spec_acceptance_percent: None,
        };
        let cases = [
            (None, ("Unknown", "NoServerReports")),
            (
                Some(report(plan.kv_blocks, "bf16")),
                ("True", "ServersAgree"),
            ),
            (
                Some(report(plan.kv_blocks / 2, "bf16")),
                ("False", "ServersDisagree"),
            ),
            (
                Some(report(plan.kv_blocks, "f32")),
                ("False", "ServersDisagree"),
            ),
        ];
        for (observed, want) in cases {
            md.status = Some(ModelDeploymentStatus {
                observed_plan: observed.clone(),
                ..Default::default()
            });
            let s = desired_status(&md, &o, None, &at(1));
            assert_eq!(cond(&s, "PlanVerified"), want, "{observed:?}");
            // The scraper owns observedPlan: the reconciler never writes it.
            assert_eq!(s.observed_plan, None);
        }
    }

    #[test]
    fn scaled_to_zero_and_the_url_follow_the_spec() {
        let mut spec = gpu_spec(1, "80Gi");
        spec.autoscaling = Some(fixtures::autoscaling(0, 2));
        let router = RouterService::parse("ferrox/ferrox-router").unwrap();
        for (replicas, want) in [(0, ("True", "Idle")), (1, ("False", "Awake"))] {
            spec.replicas = replicas;
            let s = desired_status(
                &md("llama", spec.clone()),
                &planned(0),
                Some(&router),
                &at(1),
            );
            assert_eq!(cond(&s, "ScaledToZero"), want, "{replicas} replicas");
            assert_eq!(
                s.url.as_deref(),
                Some("http://ferrox-router.ferrox.svc:8000")
            );
        }
        // A floor of one: no such condition.
        spec.autoscaling = Some(fixtures::autoscaling(1, 2));
        let s = desired_status(&md("llama", spec), &planned(0), None, &at(1));
        assert!(s.conditions.iter().all(|c| c.type_ != "ScaledToZero"));
        assert_eq!(s.url.as_deref(), Some("http://llama.default.svc:8000"));
    }
}
