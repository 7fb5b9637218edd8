"""The chart's ferrox-router: <fullname>-router's Deployment, Service, PDB,
ServiceAccount and read-only ClusterRole, and the operator told where it is."""

import subprocess

import pytest

from helpers import CHART, helm_template, tool, validate

NS = "ferrox-system"
ROUTER = "ferrox-router"  # release `ferrox`: the full name is the release's
ALL = {"ServiceAccount", "Deployment", "Service", "PodDisruptionBudget", "ClusterRole", "ClusterRoleBinding"}
READ = ["get", "list", "watch"]
# Exactly what ferrox-router --kubernetes reads (router/src/kube_source.rs), nothing to write.
ROUTER_RULES = [
    {"apiGroups": ["ferrox.dev"], "resources": ["modeldeployments"], "verbs": READ},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": READ},
]


def router_objects(docs, name=ROUTER):
    return {d["kind"]: d for d in docs if d["metadata"]["name"] == name}


def operator_deployment(docs):
    (dep,) = [d for d in docs if d["kind"] == "Deployment"
              and d["metadata"]["labels"]["app.kubernetes.io/name"] == "ferrox-operator"]
    return dep


def operator_env(docs):
    (c,) = operator_deployment(docs)["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in c["env"]}


def operator_grants(docs, name="ferrox"):
    (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == name]
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


# The operator's reflector of the router Service's EndpointSlices (test_rbac.py checks it against the code).
SLICES = {("discovery.k8s.io", "endpointslices", v) for v in ("list", "watch")}


# sets -> (the router objects rendered, the operator's FERROX_ROUTER_SERVICE or None)
CASES = {
    "defaults": ((), ALL, f"{NS}/{ROUTER}"),
    "disabled": (("router.enabled=false",), set(), None),
    "no RBAC": (("rbac.create=false",), ALL - {"ClusterRole", "ClusterRoleBinding"}, f"{NS}/{ROUTER}"),
    # One replica: no PDB (minAvailable 1 would make it unevictable).
    "one replica": (("router.replicaCount=1",), ALL - {"PodDisruptionBudget"}, f"{NS}/{ROUTER}"),
}


@pytest.mark.parametrize("case", CASES)
def test_router_objects_and_the_operator_env(case, tmp_path):
    sets, kinds, service = CASES[case]
    _, docs = helm_template(*sets)
    assert set(router_objects(docs)) == kinds
    assert not [d for d in docs if d["kind"] not in kinds and d["metadata"]["name"] == ROUTER]
    assert operator_env(docs).get("FERROX_ROUTER_SERVICE") == service
    if "rbac.create=false" not in sets:
        # The operator reads the router Service's EndpointSlices only when there is one.
        assert (SLICES <= operator_grants(docs)) == bool(kinds), operator_grants(docs) & SLICES
    validate(docs, tmp_path)


# release -> the router's name: <fullname>-router, capped at a Service name's 63 characters.
NAMES = {
    "ferrox": "ferrox-router",
    "edge": "edge-ferrox-router",
    # Helm's longest release name: <release>-ferrox cut to 56, then -router.
    "a" * 53: "a" * 53 + "-fe-router",
}


@pytest.mark.parametrize("release", NAMES)
def test_operator_is_told_the_router_service_in_its_namespace(release):
    name = NAMES[release]
    _, docs = helm_template(namespace="models", release=release)
    objs = router_objects(docs, name)
    assert set(objs) == ALL
    assert len(name) <= 63
    assert operator_env(docs)["FERROX_ROUTER_SERVICE"] == f"models/{name}"
    assert objs["Service"]["metadata"]["namespace"] == "models"


def test_router_deployment():
    _, docs = helm_template()
    dep = router_objects(docs)["Deployment"]
    assert dep["apiVersion"] == "apps/v1"
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == ROUTER
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532  # the Dockerfile's router USER
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["containers"]
    assert c["image"] == "ghcr.io/ferrox/ferrox-router:0.1.0"  # tag "" = appVersion
    assert c["imagePullPolicy"] == "IfNotPresent"
    assert c["args"] == ["--kubernetes"]
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert c["resources"] == {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}
    for key in ("nodeSelector", "tolerations", "affinity"):
        assert key not in pod


def test_router_values_reach_the_pod_and_only_its_pod(tmp_path):
    _, docs = helm_template(
        "router.image.repository=localhost/ferrox-router", "router.image.tag=latest",
        "router.image.pullPolicy=Never", "router.replicaCount=3",
        "router.extraArgs={--max-pending,512}", "router.nodeSelector.pool=edge",
        "router.tolerations[0].key=edge", "router.tolerations[0].operator=Exists",
        "router.resources.requests.cpu=10m", "router.podDisruptionBudget.minAvailable=50%",
    )
    objs = router_objects(docs)
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert objs["Deployment"]["spec"]["replicas"] == 3
    assert (c["image"], c["imagePullPolicy"]) == ("localhost/ferrox-router:latest", "Never")
    # Numbers too are passed as strings (container args must be).
    assert c["args"] == ["--kubernetes", "--max-pending", "512"]
    assert pod["nodeSelector"] == {"pool": "edge"}
    assert pod["tolerations"] == [{"key": "edge", "operator": "Exists"}]
    assert c["resources"]["requests"]["cpu"] == "10m"
    assert objs["PodDisruptionBudget"]["spec"]["minAvailable"] == "50%"
    op = operator_deployment(docs)["spec"]["template"]["spec"]
    assert "nodeSelector" not in op and "tolerations" not in op
    validate(docs, tmp_path)


def test_router_and_operator_selectors_do_not_overlap():
    _, docs = helm_template()
    objs = router_objects(docs)
    router_pod = objs["Deployment"]["spec"]["template"]["metadata"]["labels"]
    op = operator_deployment(docs)
    op_pod = op["spec"]["template"]["metadata"]["labels"]
    assert router_pod["app.kubernetes.io/component"] == "router"
    matches = lambda selector, labels: selector.items() <= labels.items()
    router_sel = objs["Deployment"]["spec"]["selector"]["matchLabels"]
    assert matches(router_sel, router_pod) and not matches(router_sel, op_pod)
    op_sel = op["spec"]["selector"]["matchLabels"]
    assert matches(op_sel, op_pod) and not matches(op_sel, router_pod)
    # Every Service selects one Deployment's pods only.
    for svc in (d for d in docs if d["kind"] == "Service"):
        sel = svc["spec"]["selector"]
        assert matches(sel, router_pod) != matches(sel, op_pod), svc["metadata"]["name"]
    assert objs["Service"]["spec"]["selector"] == router_sel
    assert objs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"] == router_sel


@pytest.mark.parametrize("port", [8000, 80])
def test_router_service_port_is_the_clients_and_the_pods_stay_on_8000(port):
    _, docs = helm_template(f"router.service.port={port}")
    objs = router_objects(docs)
    svc = objs["Service"]
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["ports"] == [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}]
    (c,) = objs["Deployment"]["spec"]["template"]["spec"]["containers"]
    # The operator long-polls the pods on 8000 (ferrox_plan::contract::router::PORT).
    assert c["ports"][0]["containerPort"] == 8000 and "--listen" not in c["args"]


def test_router_pdb():
    _, docs = helm_template()
    pdb = router_objects(docs)["PodDisruptionBudget"]
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["metadata"]["namespace"] == NS


def test_router_cluster_role_is_read_only_and_bound_to_its_service_account():
    _, docs = helm_template()
    objs = router_objects(docs)
    assert objs["ClusterRole"]["rules"] == ROUTER_RULES
    binding = objs["ClusterRoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ROUTER}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": ROUTER, "namespace": NS}]
    assert objs["ServiceAccount"]["metadata"]["namespace"] == NS
    # No other role grants the router anything.
    for b in (d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding") and d is not binding):
        assert all(s["name"] != ROUTER for s in b["subjects"]), b["metadata"]["name"]


# sets -> what NOTES must say about where clients reach the models.
NOTES = {
    (): ["http://ferrox-router.ferrox-system.svc:8000   (status.url", "port-forward service/ferrox-router 8000:8000"],
    # The operator's status.url names 8000 whatever the Service's port: NOTES does not claim it then.
    ("router.service.port=80",): ["http://ferrox-router.ferrox-system.svc:80\n", "service/ferrox-router 8000:80"],
    ("router.enabled=false",): ["kubectl port-forward service/smollm2 8000:8000"],
}


@pytest.mark.parametrize("sets", NOTES)
def test_notes_say_where_clients_reach_the_models(sets):
    args = [tool("helm"), "install", "ferrox", str(CHART), "--dry-run=client", "-n", NS]
    for s in sets:
        args += ["--set", s]
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    notes = r.stdout.split("NOTES:", 1)[1]
    for needle in NOTES[sets]:
        assert needle in notes, (needle, notes)
    assert ("ferrox-router" in notes) == ("router.enabled=false" not in sets)
