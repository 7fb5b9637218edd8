"""The Helm chart: lint, render, schema-validate, and the properties it promises."""

import json
import subprocess

import pytest
import yaml

from helpers import CHART, ROOT, helm_template, tool, validate

ALL_ON = ("serviceMonitor.enabled=true", "podMonitor.enabled=true", "dashboard.enabled=true")


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def named(docs, kind, name):
    (d,) = [d for d in by_kind(docs, kind) if d["metadata"]["name"] == name]
    return d


def test_crd_in_chart_is_the_generated_one():
    # Helm installs charts/ferrox/crds/ as is; it must be byte-for-byte what
    # `ferrox-operator crdgen` wrote to crds/ (itself checked against the code).
    chart = (CHART / "crds" / "modeldeployment.yaml").read_bytes()
    generated = (ROOT / "crds" / "modeldeployment.yaml").read_bytes()
    assert chart == generated, "cp crds/modeldeployment.yaml charts/ferrox/crds/"


@pytest.mark.parametrize("sets", [(), ALL_ON, ("leaderElection.enabled=false",), ("router.enabled=false",)])
def test_helm_lint_strict(sets):
    args = [tool("helm"), "lint", "--strict", str(CHART)]
    for s in sets:
        args += ["--set", s]
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("sets", [(), ALL_ON, ("router.enabled=false",)])
def test_rendered_objects_pass_kubernetes_validate(sets, tmp_path):
    _, docs = helm_template(*sets)
    skipped = validate(docs, tmp_path)
    # The only kinds left unchecked are the prometheus-operator ones, and only when enabled.
    assert skipped == (["PodMonitor", "ServiceMonitor"] if sets == ALL_ON else [])


def test_operator_pod_is_restricted():
    _, docs = helm_template()
    dep = named(docs, "Deployment", "ferrox")
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["args"] == ["run", "--listen", "0.0.0.0:8080"]
    assert pod["serviceAccountName"] == "ferrox"
    env = {e["name"]: e for e in c["env"]}
    # The Lease namespace must be the one the leader-election Role grants.
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert "FERROX_NO_LEADER_ELECTION" not in env


def test_leader_election_off_drops_the_role_and_refuses_replicas():
    _, docs = helm_template("leaderElection.enabled=false")
    assert not by_kind(docs, "Role")
    env = {e["name"]: e.get("value") for e in named(docs, "Deployment", "ferrox")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["FERROX_NO_LEADER_ELECTION"] == "true"
    r = subprocess.run(
        [tool("helm"), "template", "x", str(CHART), "--set", "leaderElection.enabled=false", "--set", "replicaCount=2"],
        capture_output=True, text=True,
    )
    assert r.returncode != 0 and "needs leaderElection.enabled" in r.stderr


def test_metrics_service_targets_the_operator_port():
    _, docs = helm_template()
    svc = named(docs, "Service", "ferrox-metrics")
    dep = named(docs, "Deployment", "ferrox")
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"
    assert dep["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"] == "metrics"


def test_optional_objects_are_off_by_default_and_on_when_asked():
    _, off = helm_template()
    assert {d["kind"] for d in off} == {
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Service", "Deployment",
        "PodDisruptionBudget",  # the router's (tests/chart/test_router_chart.py)
    }
    _, on = helm_template(*ALL_ON)
    (sm,) = by_kind(on, "ServiceMonitor")
    svc = named(on, "Service", "ferrox-metrics")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    # ...and not the router's Service, which has no `metrics` port.
    router = named(on, "Service", "ferrox-router")
    assert not sm["spec"]["selector"]["matchLabels"].items() <= router["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]
    pm = named(on, "PodMonitor", "ferrox-servers")
    # The router's: its pods (the KEDA trigger from zero is its pending gauge).
    rpm = named(on, "PodMonitor", "ferrox-router")
    rdep = named(on, "Deployment", "ferrox-router")
    assert rpm["spec"]["selector"]["matchLabels"].items() <= rdep["spec"]["template"]["metadata"]["labels"].items()
    assert rpm["spec"]["podMetricsEndpoints"][0]["port"] == "http"
    # The labels and port name every server pod gets from the operator (see test_examples).
    assert pm["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "ferrox-server"}
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "http"
    (cm,) = by_kind(on, "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(cm["data"]["ferrox.json"])
    assert shipped == json.loads((CHART / "dashboards" / "ferrox.json").read_text())


def test_notes_tell_the_user_what_to_apply():
    r = subprocess.run(
        [tool("helm"), "install", "ferrox", str(CHART), "--dry-run=client", "-n", "ferrox-system"],
        capture_output=True, text=True,
    )
    assert r.returncode == 0, r.stderr
    notes = r.stdout.split("NOTES:", 1)[1]
    assert "kubectl apply -f examples/smollm2-cpu.yaml" in notes
    assert "kubectl get modeldeployments" in notes
    assert (ROOT / "examples" / "smollm2-cpu.yaml").is_file()


def test_every_value_is_used():
    # A key in values.yaml that no template reads is a setting that silently does nothing.
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    templates = "".join(p.read_text() for p in (CHART / "templates").iterdir())

    def paths(d, prefix=""):
        for k, v in d.items():
            p = f"{prefix}.{k}"
            if isinstance(v, dict) and v and k != "labels" and k != "resources":
                yield from paths(v, p)
            else:
                yield p

    unused = [p for p in paths(values) if f".Values{p}" not in templates]
    assert not unused, unused


def test_existing_service_account_is_bound_and_required():
    _, docs = helm_template("serviceAccount.create=false", "serviceAccount.name=mine")
    # Only the router's own ServiceAccount is left.
    assert [d["metadata"]["name"] for d in by_kind(docs, "ServiceAccount")] == ["ferrox-router"]
    for b in by_kind(docs, "ClusterRoleBinding") + by_kind(docs, "RoleBinding"):
        sa = "ferrox-router" if b["metadata"]["name"] == "ferrox-router" else "mine"
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": "ferrox-system"}]
    assert named(docs, "Deployment", "ferrox")["spec"]["template"]["spec"]["serviceAccountName"] == "mine"
    r = subprocess.run([tool("helm"), "template", "x", str(CHART), "--set", "serviceAccount.create=false"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "serviceAccount.name is required" in r.stderr


def test_values_schema_covers_every_value_and_refuses_bad_ones():

    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(schema["properties"]) == set(values), "schema and values.yaml name the same keys"
    assert schema["additionalProperties"] is False
    bad = {
        "replicaCount=0": "replicaCount",
        "scrapeIntervalSeconds=soon": "scrapeIntervalSeconds",
        "image.pullPolicy=Sometimes": "pullPolicy",
        "metrics.port=70000": "port",
        "prometheusAddres=http://x": "prometheusAddres",  # a typo is not silently ignored
        "serviceMonitor.interval=30": "interval",
        "router.replicaCount=0": "replicaCount",
        "router.service.port=0": "port",
        "router.image.pullPolicy=Sometimes": "pullPolicy",
        "router.podDisruptionBudget.minAvailable=half": "minAvailable",
        "router.extraArg=--x": "extraArg",  # a typo is not silently ignored
    }
    for value, needle in bad.items():
        r = subprocess.run(
            [tool("helm"), "template", "ferrox", str(CHART), "--set", value], capture_output=True, text=True
        )
        assert r.returncode != 0, f"{value} was accepted"
        assert needle in r.stderr, (value, r.stderr)
    # ...and the defaults and every optional part pass it (helm_template fails otherwise).
    helm_template("serviceMonitor.enabled=true", "podMonitor.enabled=true", "dashboard.enabled=true")
