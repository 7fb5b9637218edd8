//! Leader election on a coordination.k8s.io Lease, so that one replica acts.
//! The decision is pure; the loop around it reads and writes the Lease with
//! optimistic concurrency (a conflicting write loses and retries).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};

use crate::Error;

/// What this replica should do with the Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseAction {
    /// Take it (free or expired).
    Acquire,
    /// Keep it (ours).
    Renew,
    /// Someone else holds it.
    Wait {
        /// The holder.
        holder: String,
    },
}

/// Decides from the Lease's spec (pure; `now` is a parameter).
pub fn lease_action(spec: Option<&LeaseSpec>, me: &str, now: Timestamp) -> LeaseAction {
    let Some(spec) = spec else {
        return LeaseAction::Acquire;
    };
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder == me {
        return LeaseAction::Renew;
    }
    let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(15)));
    let expired = spec
        .renew_time
        .as_ref()
        .is_none_or(|t| t.0 + duration < now);
    if holder.is_empty() || expired {
        LeaseAction::Acquire
    } else {
        LeaseAction::Wait { holder }
    }
}

/// The spec this replica writes when it acquires or renews.
pub fn next_spec(
    old: Option<&LeaseSpec>,
    me: &str,
    now: Timestamp,
    duration_secs: i32,
) -> LeaseSpec {
    let ours = old.and_then(|s| s.holder_identity.as_deref()) == Some(me);
    let transitions = old.and_then(|s| s.lease_transitions).unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(me.into()),
        lease_duration_seconds: Some(duration_secs),
        acquire_time: if ours {
            old.and_then(|s| s.acquire_time.clone())
        } else {
            Some(MicroTime(now))
        },
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(if ours || old.is_none() {
            transitions
        } else {
            transitions + 1
        }),
        ..Default::default()
    }
}

/// A Lease held by one identity.
pub struct LeaderElection {
    api: Api<Lease>,
    name: String,
    me: String,
    duration_secs: i32,
}

impl LeaderElection {
    /// Election on Lease `ns/name` as `me`.
    pub fn new(client: Client, ns: &str, name: &str, me: &str, duration_secs: i32) -> Self {
        LeaderElection {
            api: Api::namespaced(client, ns),
            name: name.into(),
            me: me.into(),
            duration_secs,
        }
    }

    /// One round: true when this replica holds the Lease afterwards.
    pub async fn try_hold(&self) -> Result<bool, Error> {
        let now = Timestamp::now();
        let current = self.api.get_opt(&self.name).await?;
        let spec = current.as_ref().and_then(|l| l.spec.as_ref());
        match lease_action(spec, &self.me, now) {
            LeaseAction::Wait { .. } => return Ok(false),
            LeaseAction::Acquire | LeaseAction::Renew => {}
        }
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                resource_version: current
                    .as_ref()
                    .and_then(|l| l.metadata.resource_version.clone()),
                ..Default::default()
            },
            spec: Some(next_spec(spec, &self.me, now, self.duration_secs)),
        };
        let written = match current {
            None => self.api.create(&PostParams::default(), &lease).await,
            Some(_) => {
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
            }
        };
        match written {
            Ok(_) => Ok(true),
            // Another replica wrote first: not ours this round.
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Waits until this replica holds the Lease.
    pub async fn acquire(&self) {
        loop {
            match self.try_hold().await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "leader election"),
            }
            tokio::time::sleep(self.retry_period()).await;
        }
    }

    /// Renews until a renewal fails to hold the Lease, then returns.
    pub async fn hold(&self) {
        loop {
            tokio::time::sleep(self.retry_period()).await;
            match self.try_hold().await {
                Ok(true) => {}
                Ok(false) => return,
                Err(e) => tracing::warn!(error = %e, "lease renewal"),
            }
        }
    }

    fn retry_period(&self) -> Duration {
        Duration::from_secs((self.duration_secs / 3).max(1) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn held_by(holder: &str, renewed: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(at(renewed))),
            lease_transitions: Some(3),
            ..Default::default()
        }
    }

    #[test]
    fn decisions() {
        let other = held_by("b", 100);
        let mine = held_by("a", 100);
        let cases = [
            (None, 100, LeaseAction::Acquire),
            (Some(&mine), 200, LeaseAction::Renew),
            (Some(&other), 110, LeaseAction::Wait { holder: "b".into() }),
            (Some(&other), 116, LeaseAction::Acquire),
        ];
        for (spec, now, want) in cases {
            assert_eq!(lease_action(spec, "a", at(now)), want, "{spec:?} at {now}");
        }
    }

    #[test]
    fn taking_over_counts_a_transition_and_renewal_does_not() {
        let taken = next_spec(Some(&held_by("b", 0)), "a", at(50), 15);
        assert_eq!(taken.lease_transitions, Some(4));
        assert_eq!(taken.acquire_time, Some(MicroTime(at(50))));
        let renewed = next_spec(Some(&taken), "a", at(60), 15);
        assert_eq!(renewed.lease_transitions, Some(4));
        assert_eq!(renewed.acquire_time, Some(MicroTime(at(50))));
        assert_eq!(renewed.renew_time, Some(MicroTime(at(60))));
    }
}
