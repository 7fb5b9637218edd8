"""docs/ keeps up with the code: every CRD field in docs/operator.md, every
exported metric (server, operator, router) in docs/metrics.md (and nothing
listed that is not exported)."""

import re

import yaml

from helpers import ROOT, strip_tests

OPERATOR_MD = (ROOT / "docs" / "operator.md").read_text()
METRICS_MD = (ROOT / "docs" / "metrics.md").read_text()
# Kubernetes' own types embedded in the spec: documented upstream, not field by field here.
EMBEDDED = {"resources", "nodeSelector", "tolerations", "affinity", "env", "imagePullSecrets", "conditions"}


def fields(schema, path):
    """Leaf field paths (an object with fields of its own is documented by them)."""
    for name, sub in (schema.get("properties") or {}).items():
        p = f"{path}.{name}"
        if name not in EMBEDDED and sub.get("type") == "object" and "properties" in sub:
            yield from fields(sub, p)
        else:
            yield p


# Fields holding a type whose own fields are documented under another name.
SHARED_TYPES = [
    ("status.geometry.geometry", "spec.model.geometry"),
    ("spec.speculative.draftGeometry", "spec.model.geometry"),
    ("status.geometry.draft.geometry", "spec.model.geometry"),
    ("status.geometry.draft.devices", "status.geometry.devices"),
]


def documented(p):
    """Whether docs/operator.md has a row for the CRD field at path `p`."""
    parent, leaf = p.rsplit(".", 1)
    # Either the full path, or a row listing the leaf after its parent (`status.autoscaler.desiredReplicas`, `.reason`).
    if f"`{p}`" in OPERATOR_MD or re.search(rf"`{re.escape(parent)}\.[^`]*`[^|\n]*`\.{leaf}`", OPERATOR_MD):
        return True
    if re.search(rf"`{re.escape(parent)}\.\w+`, `{re.escape(p)}`", OPERATOR_MD):
        return True
    # A field of a type documented once (the spec's GeometrySpec, the
    # inspected devices): its row, and one naming the field that holds it.
    return any(
        p.startswith(f"{holder}.") and f"`{holder}`" in OPERATOR_MD and documented(p.replace(holder, same, 1))
        for holder, same in SHARED_TYPES
    )


def test_every_crd_field_is_documented():
    crd = yaml.safe_load((ROOT / "crds" / "modeldeployment.yaml").read_text())
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    paths = list(fields(root["spec"], "spec")) + list(fields(root["status"], "status"))
    assert len(paths) > 40, paths
    missing = [p for p in paths if not documented(p)]
    assert not missing, f"CRD fields not in docs/operator.md: {missing}"


def exported(path):
    src = strip_tests((ROOT / path).read_text())
    # Names passed as literals, and names spelled inside a hand-written `# TYPE` line.
    return set(re.findall(r'"((?:ferrox_|vllm:)[a-zA-Z0-9_:]+)', src)) | set(
        re.findall(r"# TYPE ((?:ferrox_|vllm:)[a-zA-Z0-9_:]+) ", src)
    )


def test_metrics_doc_matches_the_exported_names():
    names = (exported("server/engine/src/metrics.rs") | exported("server/plan/src/contract.rs")) | exported("operator/src/metrics.rs")
    names |= exported("router/src/metrics.rs") | exported("server/engine/src/metrics/tier.rs")
    rows = set(re.findall(r"^\| `([a-z0-9_:]+)` \|", METRICS_MD, re.M))
    assert names - rows == set(), f"exported but not documented: {names - rows}"
    assert rows - names == set(), f"documented but not exported: {rows - names}"


def test_metrics_doc_types_match_the_code():
    src = strip_tests((ROOT / "server/engine/src/metrics.rs").read_text())
    for name, kind in re.findall(r"^\| `([a-z0-9_:]+)` \| (\w+) \|", METRICS_MD, re.M):
        if name.startswith(("ferrox_operator", "ferrox_router")):
            continue
        if kind == "histogram":
            assert name.endswith("_seconds"), name
        elif kind == "counter":
            assert name.endswith("_total"), name
    # Reasons the doc lists are the ones always exported.
    for const in ("FINISH_REASONS", "REJECT_REASONS"):
        (body,) = re.findall(rf"const {const}: \[&str; \d+\] = \[([^\]]*)\]", src)
        for reason in re.findall(r'"(\w+)"', body):
            assert f"`{reason}`" in METRICS_MD, (const, reason)


def test_every_script_the_docs_run_exists_and_is_executable():
    # A script named as a command (README, docs, Dockerfile) that lost its
    # executable bit fails only for the user who types it.
    texts = [ROOT / "README.md", ROOT / "Dockerfile", *sorted((ROOT / "docs").glob("*.md"))]
    named = {m for t in texts for m in re.findall(r"\bscripts/[a-z][a-z-]+\b", t.read_text())}
    assert "scripts/build-cuda" in named and "scripts/test" in named
    for name in sorted(named):
        path = ROOT / name
        assert path.is_file(), f"{name} is named in the docs but does not exist"
        assert path.stat().st_mode & 0o111 == 0o111, f"{name} is not executable"
