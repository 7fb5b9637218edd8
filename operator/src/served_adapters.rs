//! `status.adapters`: each adapter of the spec and how many ready replicas
//! serve it, from what the scraped servers list (pure).

use crate::autoscaling::scrape::PodSample;
use crate::crd::{AdapterSpec, AdapterStatus};

/// The spec's adapters in its order, each with the number of `samples`
/// (one a ready pod) that list it.
pub fn served(spec: &[AdapterSpec], samples: &[PodSample]) -> Vec<AdapterStatus> {
    spec.iter()
        .map(|a| {
            let n = samples
                .iter()
                .filter(|s| s.adapters.contains(&a.name))
                .count();
            AdapterStatus {
                name: a.name.clone(),
                replicas: i32::try_from(n).unwrap_or(i32::MAX),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autoscaling::scrape::parse_metrics;

    #[test]
    fn each_adapter_counts_the_ready_servers_that_list_it() {
        let spec: Vec<AdapterSpec> = ["sql", "chat", "new"]
            .map(|n| AdapterSpec {
                name: n.into(),
                source: format!("hf://o/{n}"),
            })
            .into();
        let pod = |adapters: &[(&str, u8)]| {
            let mut text = "ferrox_requests_waiting 0\n".to_string();
            for (a, held) in adapters {
                text += &format!("ferrox_lora_adapter_loaded{{adapter=\"{a}\"}} {held}\n");
            }
            parse_metrics(&text).unwrap()
        };
        // Held in memory or read in on demand, a listed adapter is served.
        let samples = [
            pod(&[("sql", 1), ("chat", 0)]),
            pod(&[("sql", 1)]),
            pod(&[]),
        ];
        let got: Vec<(String, i32)> = served(&spec, &samples)
            .into_iter()
            .map(|s| (s.name, s.replicas))
            .collect();
        assert_eq!(
            got,
            [("sql".into(), 2), ("chat".into(), 1), ("new".into(), 0)]
        );
        assert!(served(&[], &samples).is_empty());
    }
}
