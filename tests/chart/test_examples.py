"""examples/: each renders with `ferrox-operator render`, passes kubernetes-validate,
and carries its capacity plan into the server's arguments."""

import json
import math
import re
import subprocess

import pytest
import yaml

from helpers import ROOT, helm_template, operator_bin, validate

EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.yaml"))
DTYPE_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "fp8": 1}
GiB = 1 << 30


def render(name):
    r = subprocess.run([operator_bin(), "render", "-f", str(ROOT / "examples" / name)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # The plan is the status's, as a comment block of YAML (`# plan.` lines).
    block = "\n".join(l.removeprefix("# plan.") for l in r.stdout.splitlines() if l.startswith("# plan."))
    plan = yaml.safe_load(block)
    return plan, [d for d in yaml.safe_load_all(r.stdout) if d]


def test_the_examples_exist():
    assert EXAMPLES == ["deepseek-v2-lite-h100.yaml", "gemma-3-4b-gpu.yaml", "keda-autoscaling.yaml", "llama-3.1-8b-draft.yaml",
                        "llama-3.1-8b-gpu.yaml", "llama-70b-q4-h100.yaml", "smollm2-cpu-kv-tier.yaml", "smollm2-cpu.yaml",
                        "smollm2-lora.yaml"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_renders_valid_objects_with_its_plan(name, tmp_path):
    md = yaml.safe_load((ROOT / "examples" / name).read_text())
    spec = md["spec"]
    plan, docs = render(name)
    skipped = validate(docs, tmp_path)
    mode = (spec.get("autoscaling") or {}).get("mode", "builtin")
    assert skipped == (["ScaledObject"] if mode == "keda" else [])

    # The plan is the design's formula over the example's geometry: the
    # full-attention layers in the KV pool, each sliding window in its own;
    # latent attention caches its latent vector, not K and V per head.
    g = spec["model"]["geometry"]
    per_layer = g.get("kvLatentDim") or 2 * g["kvHeads"] * g["headDim"]
    layer_token = per_layer * DTYPE_BYTES[g["kvDtype"]]
    windowed = g.get("slidingWindows", [])
    per_token = (g["layers"] - sum(w["layers"] for w in windowed)) * layer_token
    assert plan["kvBytesPerToken"] == per_token
    assert plan["weightBytes"] == g["weightBytes"]
    engine = spec.get("engine", {})
    assert plan["maxModelLen"] == engine.get("maxModelLen", g["contextLength"])
    bs, chunk = plan["blockSize"], engine.get("prefillChunk", 512)
    # Every pool by kind: `full`, then `window:W` smallest first.
    pools = {p["pool"]: p for p in plan["pools"]}
    windows = [p for p in plan["pools"] if p["pool"].startswith("window:")]
    assert [(int(w["pool"].split(":")[1]), w["layers"]) for w in windows] == \
        [(w["window"], w["layers"]) for w in windowed]
    for w in windows:
        assert w["blockBytes"] == bs * w["layers"] * layer_token
    assert list(pools) == (["full"] if per_token else []) + [w["pool"] for w in windows]
    assert plan["kvBlocks"] == (pools["full"]["blocks"] if "full" in pools else 0)
    assert sum(p["blocks"] * p["blockBytes"] for p in plan["pools"]) == plan["kvBudgetBytes"]
    assert plan["kvBlocks"] * bs * per_token + sum(w["blocks"] * w["blockBytes"] for w in windows) \
        == plan["kvBudgetBytes"]
    # One full-length sequence fits; maxSeqs counts typical (2048-token) requests.
    assert plan["kvBlocks"] >= math.ceil(plan["maxModelLen"] / bs)
    typical = min(engine.get("typicalSeqLen", 2048), plan["maxModelLen"])
    assert plan["typicalSeqLen"] == typical
    # Per pool: blocks a typical request reserves; a window's is its window
    # plus a prefill chunk, page-aligned, when that is less.
    fits = [plan["kvBlocks"] // math.ceil(typical / bs)] if "full" in pools else []
    for w in windows:
        reserve = math.ceil((int(w["pool"].split(":")[1]) + chunk - 1) / bs) + 1
        assert w["blocksPerSeq"] == min(math.ceil(plan["maxModelLen"] / bs), reserve)
        assert w["blocks"] >= w["blocksPerSeq"]
        fits.append(w["blocks"] // min(math.ceil(typical / bs), reserve))
    # Absent, maxSeqs is the server's own default on the device (ferrox-plan).
    default_seqs = 256 if spec.get("accelerator") else 16
    assert plan["maxSeqs"] == min(engine.get("maxSeqs", default_seqs), *fits)
    assert plan["maxSeqs"] >= 1
    acc = spec.get("accelerator")
    assert not acc or acc["count"] == 1, "one device per replica (TensorParallelUnsupported)"
    memory = int(acc["memoryPerDevice"].removesuffix("Gi")) * GiB if acc else \
        int(spec["resources"]["limits"]["memory"].removesuffix("Gi")) * GiB
    assert plan["memoryBytes"] == memory
    parts = plan["kvBudgetBytes"] + plan["weightBytes"] + plan["activationReserveBytes"] + \
        plan["overheadBytes"] + plan.get("adapterBytes", 0) + plan.get("draftBytes", 0)
    assert plan["totalBytes"] == parts <= memory * 0.9
    # A draft model: its weights, and a draft block beside each KV block.
    draft = (spec.get("speculative") or {}).get("draftGeometry")
    if draft:
        draft_token = draft["layers"] * 2 * draft["kvHeads"] * draft["headDim"] * DTYPE_BYTES[g["kvDtype"]]
        assert plan["draftBytes"] == draft["weightBytes"] + plan["kvBlocks"] * bs * draft_token
    else:
        assert "draftBytes" not in plan

    # ...and the numbers reach the server's command line.
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    args = c["args"]
    flag = lambda f: args[args.index(f) + 1]
    # Every pool by kind, in the plan's order; no alias.
    told = [args[i + 1] for i, a in enumerate(args) if a == "--pool"]
    assert told == [f'{p["pool"]}={p["blocks"]}' for p in plan["pools"]]
    assert "--kv-blocks" not in args and "--window-blocks" not in args
    assert flag("--max-seqs") == str(plan["maxSeqs"])
    assert flag("--block-size") == str(plan["blockSize"])
    assert flag("--max-model-len") == str(plan["maxModelLen"])
    assert flag("--served-model-name") == spec["model"]["servedName"]
    if draft:
        told = json.loads(flag("--speculative-config"))
        assert told == {"model": spec["speculative"]["model"],
                        "num_speculative_tokens": spec["speculative"]["numSpeculativeTokens"]}
    if spec.get("adapters"):
        at = args.index("--lora-modules") + 1
        assert [a.split("=", 1)[0] for a in args[at:]] == [a["name"] for a in spec["adapters"]]
        assert plan["adapterBytes"] > 0
    res = c["resources"]
    mib = lambda b: f"{math.ceil(b / (1 << 20))}Mi"
    if acc:
        assert res["limits"]["nvidia.com/gpu"] in (acc["count"], str(acc["count"]))
        # The host's share: far below the device, at least the CPU runtime.
        assert res["requests"]["memory"] == mib(plan["podMemoryBytes"])
        assert 32 << 20 <= plan["podMemoryBytes"] < 2 << 30
    else:
        # The memory planned from is both the request and the limit (the
        # plan uses 90% of it; the rest is the cgroup's headroom).
        assert res["requests"]["memory"] == res["limits"]["memory"] == mib(plan["memoryBytes"])
        assert plan["podMemoryBytes"] == plan["memoryBytes"] > plan["totalBytes"]
    # The chart's PodMonitor finds these pods by this label and port name.
    assert dep["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == "ferrox-server"
    assert any(p.get("name") == "http" for p in c["ports"])


def test_keda_example_targets_the_scale_subresource():
    _, docs = render("keda-autoscaling.yaml")
    (so,) = [d for d in docs if d["kind"] == "ScaledObject"]
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    target = so["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("ModelDeployment", "smollm2-keda")
    assert so["spec"]["maxReplicaCount"] == 8
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    query = trigger["metadata"]["query"]
    assert "ferrox_requests_waiting" in query
    # Prometheus only has the labels the query selects on if the chart's
    # PodMonitor writes them onto the series: every label in the query must be one.
    _, chart = helm_template("podMonitor.enabled=true")
    (pm,) = [d for d in chart if d["kind"] == "PodMonitor" and d["metadata"]["name"].endswith("-servers")]
    written = {r["targetLabel"] for r in pm["spec"]["podMetricsEndpoints"][0]["relabelings"]}
    written.add("namespace")  # prometheus-operator adds it to every target
    selected = set(re.findall(r"(\w+)=\"", query))
    assert selected and selected <= written, (selected, written)


def test_examples_pass_the_crd_schema_shape():
    # Every example's spec keys are fields of the generated CRD (a typo would be pruned silently).
    crd = yaml.safe_load((ROOT / "crds" / "modeldeployment.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]

    def check(obj, sch, path):
        props = sch.get("properties")
        if not isinstance(obj, dict) or props is None:
            return
        for k, v in obj.items():
            assert k in props, f"{path}.{k} is not a CRD field"
            check(v, props[k], f"{path}.{k}")

    for name in EXAMPLES:
        check(yaml.safe_load((ROOT / "examples" / name).read_text())["spec"], schema, f"{name}:spec")
