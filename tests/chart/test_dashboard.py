"""The Grafana dashboard names only metrics the programs really export."""

import json
import re

from helpers import CHART, ROOT, strip_tests

DASHBOARD = json.loads((CHART / "dashboards" / "ferrox.json").read_text())
HIST_SUFFIX = re.compile(r"_(bucket|sum|count)$")


def exported(path):
    """Metric names in a metrics.rs: string literals that name a series, tests excluded."""
    src = strip_tests((ROOT / path).read_text())
    return set(re.findall(r'"((?:ferrox_|vllm:)[a-zA-Z0-9_:]+)', src))


def histograms(path):
    src = strip_tests((ROOT / path).read_text())
    return set(re.findall(r'"(ferrox_\w+_seconds)"', src))


def dashboard_metrics():
    exprs = [t["expr"] for p in DASHBOARD["panels"] for t in p["targets"]]
    exprs.append(json.dumps(DASHBOARD["templating"]))
    names = set()
    for e in exprs:
        names |= set(re.findall(r"\b((?:ferrox_|vllm:)[a-zA-Z0-9_:]+)", e))
    return names


def test_every_dashboard_metric_is_exported():
    server = (exported("server/engine/src/metrics.rs") | exported("server/plan/src/contract.rs"))
    operator = exported("operator/src/metrics.rs")
    hist = histograms("server/engine/src/metrics.rs")
    assert "ferrox_requests_waiting" in server and "ferrox_operator_scale_writes_total" in operator
    unknown = []
    for name in dashboard_metrics():
        base = HIST_SUFFIX.sub("", name)
        if name in server or name in operator:
            continue
        if base != name and base in hist:
            continue
        unknown.append(name)
    assert not unknown, f"dashboard uses metrics nobody exports: {unknown}"


def test_dashboard_has_the_promised_panels():
    text = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in DASHBOARD["panels"]}
    wanted = {
        "Queue depth": "ferrox_requests_waiting",
        "KV cache usage": "ferrox_kv_usage_ratio",
        "Time to first token": "ferrox_time_to_first_token_seconds_bucket",
        "Inter-token latency": "ferrox_inter_token_latency_seconds_bucket",
        "Tokens per second": "rate(ferrox_generation_tokens_total",
        "Replicas": "ferrox_kv_blocks_total",
    }
    for prefix, metric in wanted.items():
        (title,) = [t for t in text if t.startswith(prefix)]
        assert metric in text[title], (title, text[title])
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))


def test_model_deployment_label_comes_from_the_pod_monitor():
    # Panels group by model_deployment; the chart's PodMonitor is what sets it.
    assert "targetLabel: model_deployment" in (CHART / "templates" / "monitoring.yaml").read_text()
