//! What the servers say they run with, against what the operator planned.
//! Pure: the scrape loop feeds it samples, the reconciler reads its verdict.

use crate::autoscaling::scrape::ServerPlan;
use crate::crd::{ObservedPlanStatus, PlanStatus};

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
        pods: i32::try_from(reports.len()).unwrap_or(i32::MAX),
        disagreeing_pods: i32::try_from(disagreeing.len()).unwrap_or(i32::MAX),
        kv_blocks: n(shown.kv_blocks),
        block_size: n(shown.block_size),
        kv_dtype: shown.kv_dtype.clone(),
        max_seqs: shown.max_seqs.map(n),
        weight_bytes: shown.weight_bytes.map(n),
        memory_bytes: shown.memory_bytes.map(n),
        memory_source: shown.memory_source.clone(),
        window_blocks: (!shown.window_blocks.is_empty())
            .then(|| shown.window_blocks.iter().map(|&(_, b)| n(b)).collect()),
    })
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
    out.extend(window_differences(report, plan));
    out
}

/// How the reported window pools differ from the planned ones (a server
/// that reports none while the plan has some is too old to have them).
fn window_differences(report: &ServerPlan, plan: &PlanStatus) -> Vec<String> {
    let planned = plan.windows.as_deref().unwrap_or_default();
    let far = |got: u64, want: i64| {
        let want = want.max(0) as f64;
        (got as f64 - want).abs() > want * TOLERANCE
    };
    let mut out = Vec::new();
    for w in planned {
        let got = report
            .window_blocks
            .iter()
            .find(|&&(window, _)| i64::try_from(window) == Ok(w.window));
        match got {
            None => out.push(format!(
                "no window pool for the {}-token window, planned {} blocks",
                w.window, w.kv_blocks
            )),
            Some(&(_, blocks)) if far(blocks, w.kv_blocks) => out.push(format!(
                "{blocks} window blocks for the {}-token window, planned {}",
                w.window, w.kv_blocks
            )),
            Some(_) => {}
        }
    }
    for &(window, blocks) in &report.window_blocks {
        if !planned
            .iter()
            .any(|w| i64::try_from(window) == Ok(w.window))
        {
            out.push(format!(
                "a window pool of {blocks} blocks for a {window}-token window, planned none"
            ));
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
    // The observed windows are listed smallest first, as the plan's are.
    let planned_windows = expected.plan.windows.as_deref().unwrap_or_default();
    let window_blocks = o
        .window_blocks
        .iter()
        .flatten()
        .zip(planned_windows)
        .map(|(&b, w)| {
            (
                u64::try_from(w.window).unwrap_or(0),
                u64::try_from(b).unwrap_or(0),
            )
        })
        .collect();
    let report = ServerPlan {
        kv_blocks: u64::try_from(o.kv_blocks).unwrap_or(0),
        block_size: u64::try_from(o.block_size).unwrap_or(0),
        kv_dtype: o.kv_dtype.clone(),
        max_seqs: o.max_seqs.and_then(|v| u64::try_from(v).ok()),
        weight_bytes: o.weight_bytes.and_then(|v| u64::try_from(v).ok()),
        window_blocks,
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
                windows_phrase(o.window_blocks.as_deref(), planned_windows)
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

/// ` and window pools of 5719 blocks (1024-token window)`, or nothing.
fn windows_phrase(blocks: Option<&[i64]>, planned: &[crate::crd::WindowPlanStatus]) -> String {
    let parts: Vec<String> = blocks
        .unwrap_or_default()
        .iter()
        .zip(planned)
        .map(|(b, w)| format!("{b} blocks ({}-token window)", w.window))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!(" and window pools of {}", parts.join(", "))
    }
}

#[cfg(test)]
mod tests;
