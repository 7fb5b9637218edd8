//! What the servers say they run with, against what the operator planned.
//! Pure: the scrape loop feeds it samples, the reconciler reads its verdict.

use ferrox_plan::CacheKind;

use crate::autoscaling::scrape::ServerPlan;
use crate::crd::{ObservedPlanStatus, ObservedPoolStatus, PlanStatus};

/// Relative difference in KV blocks or weight bytes still counted as agreement.
pub const TOLERANCE: f64 = 0.02;

/// The plan the operator made, as the servers would report it.
#[derive(Debug, Clone, PartialEq)]
pub struct Expected<'a> {
    /// `status.plan`.
    pub plan: &'a PlanStatus,
    /// The KV dtype planned with (`f16`, ...).
    pub kv_dtype: &'a str,
}

/// `status.observedPlan` from the pods that reported a plan: the first
/// disagreeing pod's numbers when there is one, else the pod with the
/// fewest blocks. `None` when no pod reported.
pub fn observe(reports: &[ServerPlan], expected: &Expected) -> Option<ObservedPlanStatus> {
    let disagreeing: Vec<&ServerPlan> = reports
        .iter()
        .filter(|r| !differences(r, expected).is_empty())
        .collect();
    let shown = disagreeing
        .first()
        .copied()
        .or_else(|| reports.iter().min_by_key(|r| r.kv_blocks))?;
    let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    Some(ObservedPlanStatus {
        spec_acceptance_percent: acceptance_percent(reports),
        pods: i32::try_from(reports.len()).unwrap_or(i32::MAX),
        disagreeing_pods: i32::try_from(disagreeing.len()).unwrap_or(i32::MAX),
        kv_blocks: n(shown.kv_blocks),
        block_size: n(shown.block_size),
        kv_dtype: shown.kv_dtype.clone(),
        max_seqs: shown.max_seqs.map(n),
        weight_bytes: shown.weight_bytes.map(n),
        memory_bytes: shown.memory_bytes.map(n),
        memory_source: shown.memory_source.clone(),
        pools: shown
            .pools
            .iter()
            .map(|&(kind, blocks)| ObservedPoolStatus {
                pool: kind.to_string(),
                blocks: n(blocks),
            })
            .collect(),
    })
}

/// Of the draft tokens `reports` verified, the percent accepted, rounded;
/// `None` when none verified any.
pub fn acceptance_percent(reports: &[ServerPlan]) -> Option<i32> {
    let (drafted, accepted) = reports
        .iter()
        .filter_map(|r| r.spec_tokens)
        .fold((0u64, 0u64), |(d, a), (rd, ra)| {
            (d.saturating_add(rd), a.saturating_add(ra.min(rd)))
        });
    (drafted > 0).then(|| (100.0 * accepted as f64 / drafted as f64).round() as i32)
}

/// How `report` differs from the plan, one phrase per difference.
pub fn differences(report: &ServerPlan, expected: &Expected) -> Vec<String> {
    let plan = expected.plan;
    let mut out = Vec::new();
    let far = |got: u64, want: i64| {
        let want = want.max(0) as f64;
        (got as f64 - want).abs() > want * TOLERANCE
    };
    if far(report.kv_blocks, plan.kv_blocks) {
        out.push(format!(
            "{} KV blocks, planned {}",
            report.kv_blocks, plan.kv_blocks
        ));
    }
    if i64::try_from(report.block_size) != Ok(plan.block_size) {
        out.push(format!(
            "block size {}, planned {}",
            report.block_size, plan.block_size
        ));
    }
    if report.kv_dtype != expected.kv_dtype {
        out.push(format!(
            "KV dtype {}, planned {}",
            report.kv_dtype, expected.kv_dtype
        ));
    }
    if let Some(s) = report
        .max_seqs
        .filter(|s| i64::try_from(*s) != Ok(plan.max_seqs))
    {
        out.push(format!("max seqs {s}, planned {}", plan.max_seqs));
    }
    if let Some(w) = report.weight_bytes.filter(|w| far(*w, plan.weight_bytes)) {
        out.push(format!("weights {w} bytes, planned {}", plan.weight_bytes));
    }
    out.extend(pool_differences(report, plan));
    out
}

/// How the reported pools differ from the planned ones, by kind: a pool
/// planned and not reported, or the reverse, is a difference (a server
/// that reports none is too old to name its pools).
fn pool_differences(report: &ServerPlan, plan: &PlanStatus) -> Vec<String> {
    let far = |got: u64, want: i64| {
        let want = want.max(0) as f64;
        (got as f64 - want).abs() > want * TOLERANCE
    };
    let reported = |name: &str| {
        let found = report.pools.iter().find(|(k, _)| k.to_string() == name);
        found.map(|&(_, blocks)| blocks)
    };
    let mut out = Vec::new();
    for p in &plan.pools {
        match reported(&p.pool) {
            None => out.push(format!("no {} pool, planned {} blocks", p.pool, p.blocks)),
            Some(blocks) if far(blocks, p.blocks) => out.push(format!(
                "{blocks} blocks in the {} pool, planned {}",
                p.pool, p.blocks
            )),
            Some(_) => {}
        }
    }
    for (kind, blocks) in &report.pools {
        let name = kind.to_string();
        if !plan.pools.iter().any(|p| p.pool == name) {
            out.push(format!("a {name} pool of {blocks} blocks, planned none"));
        }
    }
    out
}

/// The `PlanVerified` condition: status, reason and message.
pub fn verdict(
    observed: Option<&ObservedPlanStatus>,
    expected: &Expected,
) -> (&'static str, &'static str, String) {
    let Some(o) = observed else {
        return (
            "Unknown",
            "NoServerReports",
            "no ready server has reported its plan yet".into(),
        );
    };
    let pools = o
        .pools
        .iter()
        .filter_map(|p| {
            let kind: CacheKind = p.pool.parse().ok()?;
            Some((kind, u64::try_from(p.blocks).unwrap_or(0)))
        })
        .collect();
    let report = ServerPlan {
        kv_blocks: u64::try_from(o.kv_blocks).unwrap_or(0),
        block_size: u64::try_from(o.block_size).unwrap_or(0),
        kv_dtype: o.kv_dtype.clone(),
        max_seqs: o.max_seqs.and_then(|v| u64::try_from(v).ok()),
        weight_bytes: o.weight_bytes.and_then(|v| u64::try_from(v).ok()),
        pools,
        ..ServerPlan::default()
    };
    let diffs = differences(&report, expected);
    if o.disagreeing_pods == 0 && diffs.is_empty() {
        return (
            "True",
            "ServersAgree",
            format!(
                "{} ready servers run {} KV blocks of {} tokens ({}){} as planned",
                o.pods,
                o.kv_blocks,
                o.block_size,
                o.kv_dtype,
                pools_phrase(&o.pools)
            ),
        );
    }
    let source = match (&o.memory_bytes, &o.memory_source) {
        (Some(b), Some(s)) => format!("; it planned from {b} bytes ({s})"),
        _ => String::new(),
    };
    (
        "False",
        "ServersDisagree",
        format!(
            "{} of {} ready servers differ from the plan: {}{source}",
            o.disagreeing_pods.max(1),
            o.pods,
            diffs.join(", ")
        ),
    )
}

/// ` and pools window:1024=5719, state=16` (every pool besides the full
/// one, by kind), or nothing.
fn pools_phrase(pools: &[ObservedPoolStatus]) -> String {
    let others = pools
        .iter()
        .filter(|p| p.pool != CacheKind::Full.to_string());
    let parts: Vec<String> = others.map(|p| format!("{}={}", p.pool, p.blocks)).collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!(" and pools {}", parts.join(", "))
    }
}

#[cfg(test)]
mod tests;
