//! Which ModelDeployments scaled to zero should wake, and to what: pure.

use std::collections::BTreeMap;

use crate::crd::ModelDeployment;
use crate::served_name::served_name;

/// Whether a model at `current` replicas, with `pending` requests waiting in
/// the router and a floor of `min_replicas`, wakes now (0 -> 1, no window:
/// someone is waiting).
pub fn wakes(min_replicas: i32, current: i32, pending: u64) -> bool {
    min_replicas == 0 && current == 0 && pending > 0
}

/// The built-in-autoscaled ModelDeployments at zero that `totals` (waiting
/// requests by servedName) says to wake, with the requests waiting for each.
pub fn to_wake<'a>(
    mds: &'a [ModelDeployment],
    totals: &BTreeMap<String, u64>,
) -> Vec<(&'a ModelDeployment, u64)> {
    mds.iter()
        .filter(|md| md.metadata.deletion_timestamp.is_none())
        .filter_map(|md| {
            let spec = md.builtin_autoscaling()?;
            let pending = totals.get(&served_name(md)).copied().unwrap_or(0);
            wakes(spec.min_replicas, md.spec.replicas, pending).then_some((md, pending))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::AutoscalingMode;
    use crate::fixtures::{autoscaling, gpu_spec, md};
    use kube::ResourceExt;

    fn at(name: &str, replicas: i32, min: i32, mode: AutoscalingMode) -> ModelDeployment {
        let mut spec = gpu_spec(1, "80Gi");
        spec.model.served_name = Some(name.into());
        spec.replicas = replicas;
        spec.autoscaling = Some(crate::crd::AutoscalingSpec {
            mode,
            ..autoscaling(min, 3)
        });
        md(name, spec)
    }

    #[test]
    fn only_builtin_models_at_zero_with_someone_waiting_wake() {
        let mds = [
            at("asleep", 0, 0, AutoscalingMode::Builtin),
            at("awake", 1, 0, AutoscalingMode::Builtin),
            at("keda", 0, 0, AutoscalingMode::Keda),
            at("nobody-waits", 0, 0, AutoscalingMode::Builtin),
        ];
        let totals = BTreeMap::from([
            ("asleep".to_string(), 2),
            ("awake".to_string(), 5),
            ("keda".to_string(), 1),
        ]);
        let woken: Vec<_> = to_wake(&mds, &totals)
            .into_iter()
            .map(|(md, n)| (md.namespace().unwrap(), md.name_any(), n))
            .collect();
        assert_eq!(woken, [("default".to_string(), "asleep".to_string(), 2)]);
        let mut gone = mds[0].clone();
        gone.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
        );
        assert!(to_wake(&[gone], &totals).is_empty());
    }

    #[test]
    fn the_rule() {
        for (min, current, pending, want) in [
            (0, 0, 1, true),
            (0, 0, 0, false),
            (0, 1, 9, false),
            (1, 0, 9, false),
        ] {
            assert_eq!(
                wakes(min, current, pending),
                want,
                "{min} {current} {pending}"
            );
        }
    }
}
