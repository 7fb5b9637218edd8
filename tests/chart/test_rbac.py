"""The chart grants exactly the API calls operator/src makes: no more, no fewer.

operator/src exposes no list of its calls, so the list is derived from its
source. Two checks meet in the middle:

* EXPECTED names each (group, resource, verb) with the source pattern that
  makes the call. A grant whose pattern no longer matches is a grant the code
  no longer needs (fails); a rule in the chart that is not in EXPECTED, or the
  reverse, fails.
* Every kind the source builds an `Api` for, and every kube `Api` method it
  calls, must be accounted for in EXPECTED: a new kind or a new kind of call
  (say `.replace(` on Deployments) fails until the chart and this table learn it.

tests/e2e/run.sh then runs the operator with the chart's ServiceAccount token
under RBAC and checks every call it makes against the same rules (audit log).
"""

import re

from helpers import helm_template, operator_source

# operator/src/router/poll.rs: an Api of EndpointSlices, then a watcher on it.
ROUTER_SLICES = r"Api<EndpointSlice> = Api::namespaced\([^;]*;[\s\S]{0,400}?watcher\(api,"

# (apiGroup, resource, verb) -> regex over operator/src (tests excluded) that makes the call.
# Server-side apply (`apply()`, a PATCH) creating an absent object is authorized
# as `create` as well, so every applied kind needs both (see SSA below).
EXPECTED = {
    # Controller::new(Api::<ModelDeployment>::all) lists and watches; the autoscaler lists.
    ("ferrox.dev", "modeldeployments", "list"): r"Controller::new\(mds|api\.list\(",
    ("ferrox.dev", "modeldeployments", "watch"): r"Controller::new\(mds",
    # autoscaling/run.rs: the scraper reads the object again after scraping.
    ("ferrox.dev", "modeldeployments", "get"): r"api\.get\(&md\.name_any\(\)\)",
    ("ferrox.dev", "modeldeployments/status", "patch"): r"\.patch_status\(",
    ("ferrox.dev", "modeldeployments/scale", "patch"): r"\.patch_scale\(",
    # .owns(Api::<K>::all(..)) lists and watches K; apply() is a server-side-apply patch.
    ("apps", "deployments", "list"): r"\.owns\(\s*Api::<Deployment>",
    ("apps", "deployments", "watch"): r"\.owns\(\s*Api::<Deployment>",
    ("apps", "deployments", "patch"): r"apply\(&Api::namespaced\(client\.clone\(\), ns\), &d\.deployment\)",
    ("", "services", "list"): r"\.owns\(\s*Api::<Service>",
    ("", "services", "watch"): r"\.owns\(\s*Api::<Service>",
    ("", "services", "patch"): r"apply::<Service>\(",
    ("batch", "jobs", "list"): r"\.owns\(\s*Api::<Job>",
    ("batch", "jobs", "watch"): r"\.owns\(\s*Api::<Job>",
    ("batch", "jobs", "get"): r"jobs\.get_opt\(",
    ("batch", "jobs", "patch"): r"apply\(&jobs,",
    ("", "pods", "list"): r"pods\s*\.list\(",
    ("policy", "poddisruptionbudgets", "list"): r"\.owns\(\s*Api::<PodDisruptionBudget>",
    ("policy", "poddisruptionbudgets", "watch"): r"\.owns\(\s*Api::<PodDisruptionBudget>",
    ("policy", "poddisruptionbudgets", "patch"): r"apply::<PodDisruptionBudget>\(",
    ("policy", "poddisruptionbudgets", "get"): r"delete_owned::<PodDisruptionBudget>\(",
    ("policy", "poddisruptionbudgets", "delete"): r"delete_owned::<PodDisruptionBudget>\(",
    ("autoscaling", "horizontalpodautoscalers", "list"): r"\.owns\(\s*Api::<HorizontalPodAutoscaler>",
    ("autoscaling", "horizontalpodautoscalers", "watch"): r"\.owns\(\s*Api::<HorizontalPodAutoscaler>",
    ("autoscaling", "horizontalpodautoscalers", "patch"): r"apply::<HorizontalPodAutoscaler>\(",
    ("autoscaling", "horizontalpodautoscalers", "get"): r"delete_owned::<HorizontalPodAutoscaler>\(",
    ("autoscaling", "horizontalpodautoscalers", "delete"): r"delete_owned::<HorizontalPodAutoscaler>\(",
    ("keda.sh", "scaledobjects", "patch"): r"apply\(&scaled_objects\(",
    ("keda.sh", "scaledobjects", "get"): r"delete_owned\(&scaled_objects\(",
    ("keda.sh", "scaledobjects", "delete"): r"delete_owned\(&scaled_objects\(",
    ("inference.networking.k8s.io", "inferencepools", "patch"): r"apply\(&inference_pools\(",
    ("inference.networking.k8s.io", "inferencepools", "get"): r"delete_owned\(&inference_pools\(",
    ("inference.networking.k8s.io", "inferencepools", "delete"): r"delete_owned\(&inference_pools\(",
    ("", "persistentvolumeclaims", "patch"): r"apply::<PersistentVolumeClaim>\(",
    ("", "persistentvolumeclaims", "get"): r"delete_owned::<PersistentVolumeClaim>\(",
    ("", "persistentvolumeclaims", "delete"): r"delete_owned::<PersistentVolumeClaim>\(",
    # node_watch.rs: a reflector (list, then watch) of every node.
    ("", "nodes", "list"): r"watcher\(Api::<Node>::all\(",
    ("", "nodes", "watch"): r"watcher\(Api::<Node>::all\(",
    # kube-runtime's Recorder::publish: create, then a merge patch for a repeat (events.rs).
    ("events.k8s.io", "events", "create"): r"Recorder::new\(",
    ("events.k8s.io", "events", "patch"): r"Recorder::new\(",
    # Leader election (lease.rs): get_opt, create when absent, replace (PUT = update).
    ("coordination.k8s.io", "leases", "get"): r"self\.api\.get_opt\(",
    ("coordination.k8s.io", "leases", "create"): r"self\.api\.create\(",
    ("coordination.k8s.io", "leases", "update"): r"\.replace\(\s*&self\.name",
    # router/poll.rs: a reflector (list, then watch) of the router Service's
    # EndpointSlices (FERROX_ROUTER_SERVICE), in its namespace.
    ("discovery.k8s.io", "endpointslices", "list"): ROUTER_SLICES,
    ("discovery.k8s.io", "endpointslices", "watch"): ROUTER_SLICES,
}
SSA = {k for k, pat in EXPECTED.items() if k[2] == "patch" and "apply" in pat}
EXPECTED.update({(g, r, "create"): EXPECTED[(g, r, v)] for g, r, v in SSA})

# Kinds the source names in Api<K>/Api::<K>/apply::<K>/delete_owned::<K>, or by GVK.
KIND_RESOURCE = {
    "ModelDeployment": ("ferrox.dev", "modeldeployments"),
    "Deployment": ("apps", "deployments"),
    "Service": ("", "services"),
    "Job": ("batch", "jobs"),
    "Pod": ("", "pods"),
    "PodDisruptionBudget": ("policy", "poddisruptionbudgets"),
    "HorizontalPodAutoscaler": ("autoscaling", "horizontalpodautoscalers"),
    "ScaledObject": ("keda.sh", "scaledobjects"),
    "InferencePool": ("inference.networking.k8s.io", "inferencepools"),
    "PersistentVolumeClaim": ("", "persistentvolumeclaims"),
    "Node": ("", "nodes"),
    "Lease": ("coordination.k8s.io", "leases"),
    "Event": ("events.k8s.io", "events"),
    "EndpointSlice": ("discovery.k8s.io", "endpointslices"),
}
# kube Api methods -> the verbs they need. `K` is a type parameter of the helpers.
METHOD_VERBS = {
    "list": {"list"}, "get_opt": {"get"}, "create": {"create"}, "replace": {"update"},
    "patch": {"patch"}, "patch_status": {"patch"}, "patch_scale": {"patch"}, "delete": {"delete"},
}
GENERIC = {"K", "DynamicObject"}
CLUSTER_SCOPED_ONLY_IN_ROLE = {("coordination.k8s.io", "leases")}


def is_router(d):
    return d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "router"


def chart_rules():
    """The operator's grants (the router's read-only ClusterRole is
    tests/chart/test_router_chart.py's)."""
    _, docs = helm_template()
    granted = {}
    for d in docs:
        if d["kind"] not in ("ClusterRole", "Role") or is_router(d):
            continue
        for r in d["rules"]:
            assert set(r) == {"apiGroups", "resources", "verbs"}, f"no wildcards or names: {r}"
            for g in r["apiGroups"]:
                for res in r["resources"]:
                    for v in r["verbs"]:
                        assert "*" not in (g, res, v), r
                        granted[(g, res, v)] = d["kind"]
    return granted


def test_chart_grants_exactly_the_expected_calls():
    granted = chart_rules()
    extra = sorted(set(granted) - set(EXPECTED))
    missing = sorted(set(EXPECTED) - set(granted))
    assert not extra, f"chart grants calls the operator does not make: {extra}"
    assert not missing, f"operator makes calls the chart does not grant: {missing}"


def test_leases_only_in_the_release_namespace():
    for key, kind in chart_rules().items():
        if key[:2] in CLUSTER_SCOPED_ONLY_IN_ROLE:
            assert kind == "Role", key
        else:
            assert kind == "ClusterRole", key


def test_every_expected_call_is_in_the_source():
    src = "\n".join(operator_source().values())
    stale = [k for k, pat in EXPECTED.items() if not re.search(pat, src)]
    assert not stale, f"granted for code that is gone: {stale}"


def test_every_kind_and_method_in_the_source_is_accounted_for():
    src = "\n".join(operator_source().values())
    kinds = set(re.findall(r"\bApi(?:::)?<\s*(\w+)\s*>", src))
    kinds |= set(re.findall(r"\b(?:apply|delete_owned)::<(\w+)>", src))
    kinds |= set(re.findall(r'gvk\(\s*"[^"]*",\s*"[^"]*",\s*"(\w+)"\s*\)', src))
    if "Recorder::new(" in src:
        kinds.add("Event")
    kinds -= GENERIC
    unknown = kinds - set(KIND_RESOURCE)
    assert not unknown, f"new kinds in operator/src, add them to the chart and EXPECTED: {unknown}"
    resources_used = {KIND_RESOURCE[k] for k in kinds}
    resources_granted = {(g, r.split("/")[0]) for g, r, _ in set(EXPECTED)}
    assert resources_used == resources_granted, (resources_used ^ resources_granted)
    # kube Api methods called anywhere (receiver-agnostic) must map to verbs the table grants.
    methods = set(re.findall(r"\.(list|get_opt|get|create|replace|patch|patch_status|patch_scale|delete|watch|evict|entry)\(", src))
    api_methods = methods & set(METHOD_VERBS)
    verbs_needed = set().union(*(METHOD_VERBS[m] for m in api_methods))
    verbs_granted = {v for _, _, v in EXPECTED} - {"watch"}
    assert verbs_needed == verbs_granted, (verbs_needed ^ verbs_granted)
