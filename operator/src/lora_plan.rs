//! The LoRA adapters a `ModelDeployment`'s plan counts, read from its spec:
//! the plan sizes memory for them and the pods' flags carry the same limits.

use ferrox_plan::LoraPlan;

use crate::crd::ModelDeploymentSpec;

/// The adapters the plan counts: `spec.lora`, each default from the
/// number of adapters; `None` without adapters.
pub fn lora_plan(spec: &ModelDeploymentSpec) -> Option<LoraPlan> {
    let n = spec.adapters.len() as u64;
    if n == 0 {
        return None;
    }
    let l = spec.lora.clone().unwrap_or_default();
    let u = |v: i32| u64::try_from(v).unwrap_or(1).max(1);
    let max_loras = l.max_loras.map_or(n, u);
    Some(LoraPlan {
        max_loras,
        max_lora_rank: u(l.max_lora_rank),
        max_cpu_loras: l.max_cpu_loras.map_or(n, u).max(max_loras),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{AdapterSpec, LoraSpec};
    use crate::fixtures::cpu_spec;

    #[test]
    fn each_limit_defaults_to_the_number_of_adapters() {
        let mut spec = cpu_spec("4Gi");
        assert_eq!(lora_plan(&spec), None);
        spec.adapters = ["a", "b", "c"]
            .map(|n| AdapterSpec {
                name: n.into(),
                source: format!("file:///l/{n}"),
            })
            .into();
        let rank = LoraSpec::default().max_lora_rank;
        let defaults = lora_plan(&spec).unwrap();
        assert_eq!(
            (defaults.max_loras, defaults.max_cpu_loras),
            (3, 3),
            "{defaults:?}"
        );
        assert_eq!(defaults.max_lora_rank, u64::try_from(rank).unwrap());
        // The host holds at least what the device does.
        spec.lora = Some(LoraSpec {
            max_loras: Some(2),
            max_cpu_loras: Some(1),
            ..LoraSpec::default()
        });
        let given = lora_plan(&spec).unwrap();
        assert_eq!((given.max_loras, given.max_cpu_loras), (2, 2));
    }
}
