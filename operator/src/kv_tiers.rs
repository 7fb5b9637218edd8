//! `status.kvTiers`: each lower KV tier's blocks, capacity, hits and misses,
//! summed over what the scraped servers report (pure).

use ferrox_plan::KvTier;

use crate::autoscaling::scrape::PodSample;
use crate::crd::KvTierStatus;

/// Every lower tier some sample reports, in tier order, its numbers summed
/// over `samples` (one a ready pod); empty when none reports a tier.
pub fn observe(samples: &[PodSample]) -> Vec<KvTierStatus> {
    let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    KvTier::LOWER
        .iter()
        .filter_map(|&tier| {
            let each = samples
                .iter()
                .flat_map(|s| &s.tiers)
                .filter(|t| t.tier == tier);
            let sum = each.fold(None, |acc: Option<[u64; 4]>, t| {
                let [b, c, h, m] = acc.unwrap_or_default();
                Some([
                    b.saturating_add(t.blocks),
                    c.saturating_add(t.capacity_blocks),
                    h.saturating_add(t.hits),
                    m.saturating_add(t.misses),
                ])
            })?;
            Some(KvTierStatus {
                tier: tier.name().into(),
                blocks: n(sum[0]),
                capacity_blocks: n(sum[1]),
                hits: n(sum[2]),
                misses: n(sum[3]),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autoscaling::scrape::parse_metrics;

    /// A server's exposition with `tiers` as (tier, blocks, capacity, hits, misses).
    fn pod(tiers: &[(&str, u64, u64, u64, u64)]) -> PodSample {
        let mut text = "ferrox_requests_waiting 0\n".to_string();
        for (t, b, c, h, m) in tiers {
            text += &format!(
                "# TYPE ferrox_kv_tier_blocks gauge\nferrox_kv_tier_blocks{{tier=\"{t}\"}} {b}\n\
                 ferrox_kv_tier_capacity_blocks{{tier=\"{t}\"}} {c}\n\
                 # TYPE ferrox_kv_tier_hits_total counter\nferrox_kv_tier_hits_total{{tier=\"{t}\"}} {h}\n\
                 ferrox_kv_tier_misses_total{{tier=\"{t}\"}} {m}\n"
            );
        }
        parse_metrics(&text).unwrap()
    }

    fn status(tier: &str, [blocks, capacity_blocks, hits, misses]: [i64; 4]) -> KvTierStatus {
        KvTierStatus {
            tier: tier.into(),
            blocks,
            capacity_blocks,
            hits,
            misses,
        }
    }

    #[test]
    fn each_tier_sums_over_the_servers_that_report_it() {
        let host = ("host", 10, 100, 7, 3);
        let disk = ("disk", 40, 1000, 20, 5);
        let cases: Vec<(Vec<PodSample>, Vec<KvTierStatus>)> = vec![
            (vec![], vec![]),
            // A server without lower tiers (or too old to report them).
            (vec![pod(&[])], vec![]),
            (vec![pod(&[host])], vec![status("host", [10, 100, 7, 3])]),
            // Summed over pods, in tier order whatever order they came in.
            (
                vec![pod(&[disk, host]), pod(&[host]), pod(&[])],
                vec![
                    status("host", [20, 200, 14, 6]),
                    status("disk", [40, 1000, 20, 5]),
                ],
            ),
            // A device tier (or one it does not know) is not a lower tier.
            (
                vec![pod(&[("device", 1, 1, 1, 1), ("ssd", 1, 1, 1, 1)])],
                vec![],
            ),
        ];
        for (samples, want) in cases {
            assert_eq!(observe(&samples), want, "{samples:?}");
        }
    }

    #[test]
    fn a_tier_missing_a_series_reads_zero_there() {
        let text = "ferrox_requests_waiting 0\nferrox_kv_tier_blocks{tier=\"disk\"} 9\n";
        let got = observe(&[parse_metrics(text).unwrap()]);
        assert_eq!(got, [status("disk", [9, 0, 0, 0])]);
    }
}
