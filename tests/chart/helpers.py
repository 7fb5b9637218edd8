"""Shared by the chart tests: paths, the real tools, rendering and validation."""

import os
import re
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "ferrox"
K8S_SCHEMA = os.environ.get("K8S_SCHEMA_VERSION", "1.34.0")
# Kinds from CRDs (prometheus-operator, KEDA): kubernetes-validate ships only
# the built-in API's schemas, so it cannot check these; their fields are
# asserted by the tests that render them instead.
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "ScaledObject"}


def tool(name):
    """Path of helm/kubectl as tests/chart/setup-tools installs them."""
    bin_dir = subprocess.run(
        [str(ROOT / "tests/chart/setup-tools")], check=True, capture_output=True, text=True
    ).stdout.strip().splitlines()[-1]
    return str(Path(bin_dir) / name)


def operator_bin():
    """The ferrox-operator binary the run script built (or FERROX_OPERATOR)."""
    path = os.environ.get("FERROX_OPERATOR") or str(
        Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "debug" / "ferrox-operator"
    )
    assert Path(path).is_file(), f"no operator binary at {path}; tests/chart/run builds it"
    return path


def helm_template(*sets, namespace="ferrox-system", release="ferrox"):
    args = [tool("helm"), "template", release, str(CHART), "--namespace", namespace]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return out, [d for d in yaml.safe_load_all(out) if d]


def validate(docs, tmp_path):
    """kubernetes-validate --strict on every built-in kind; returns the kinds skipped."""
    skipped = sorted({d["kind"] for d in docs if d["kind"] in CRD_KINDS})
    checked = [d for d in docs if d["kind"] not in CRD_KINDS]
    f = tmp_path / "objects.yaml"
    f.write_text(yaml.safe_dump_all(checked))
    r = subprocess.run(
        ["kubernetes-validate", "--strict", "-k", K8S_SCHEMA, str(f)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return skipped


def strip_tests(text):
    """Rust source without its `#[cfg(test)]` module(s): tests are not API calls."""
    return re.split(r"#\[cfg\(test\)\]", text)[0]


def operator_source():
    """Every non-test line of operator/src, per file."""
    out = {}
    for p in sorted((ROOT / "operator" / "src").rglob("*.rs")):
        if p.name == "tests.rs" or p.name == "fixtures.rs":
            continue
        out[str(p.relative_to(ROOT))] = strip_tests(p.read_text())
    return out
