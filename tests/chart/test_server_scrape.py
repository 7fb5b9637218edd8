"""The real ferrox-server, started with the exact arguments the operator renders
for examples/smollm2-cpu.yaml: it accepts them, holds the planned pool, and its
/metrics has every series the dashboard reads.

Needs a built ferrox-server (FERROX_SERVER, or target/debug/ferrox-server); the
test is skipped, saying so, when there is none: the server is a long build that
tests/chart/run does not start on its own."""

import json
import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from helpers import CHART, ROOT, operator_bin

MODEL_IN_POD = "/models/SmolLM2-135M-Instruct.Q4_1.gguf"


def server_bin():
    # scripts/test exports FERROX_SERVER_BIN (the operator's name for it).
    path = os.environ.get("FERROX_SERVER") or os.environ.get("FERROX_SERVER_BIN") or ""
    if not Path(path).is_file():
        path = str(Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "debug" / "ferrox-server")
    if not Path(path).is_file():
        # CI (scripts/test sets FERROX_REQUIRE_MODEL=1) builds the server: there, no skipping.
        assert os.environ.get("FERROX_REQUIRE_MODEL") != "1", f"no ferrox-server binary at {path}"
        pytest.skip(f"no ferrox-server binary at {path} (set FERROX_SERVER to run this check)")
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, body=None):
    req = urllib.request.Request(url, data=body and json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read().decode()


def test_rendered_args_start_the_real_server_and_its_metrics_feed_the_dashboard(tmp_path):
    binary = server_bin()
    model = subprocess.run([str(ROOT / "scripts/fetch-model")], check=True, capture_output=True, text=True).stdout.split()[-1]
    rendered = subprocess.run([operator_bin(), "render", "-f", str(ROOT / "examples/smollm2-cpu.yaml")],
                              check=True, capture_output=True, text=True).stdout
    kv_blocks = int(re.search(r"^# plan\.kvBlocks: (\d+)$", rendered, re.M).group(1))
    (dep,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment"]
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    port = free_port()
    # Only what differs outside a pod: the model's path and the address.
    local = [model if a == MODEL_IN_POD else a for a in args]
    local[local.index("--host") + 1] = "127.0.0.1"
    local[local.index("--port") + 1] = str(port)
    assert local[0] == "serve" and model in local
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([binary, *local], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            try:
                get(base + "/v1/completions", {"model": "smollm2", "prompt": "Hello", "max_tokens": 4})
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.time() < deadline, "server never became ready"
                time.sleep(1)
        scrape = get(base + "/metrics")
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    series = {}
    for line in scrape.splitlines():
        if line and not line.startswith("#"):
            name_labels, value = line.rsplit(" ", 1)
            series.setdefault(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", name_labels).group(0), []).append(float(value))
    # The plan reached the server: its pool is the operator's kvBlocks.
    assert series["ferrox_kv_blocks_total"] == [kv_blocks]
    assert series["ferrox_generation_tokens_total"][0] >= 1
    assert sum(series["ferrox_time_to_first_token_seconds_count"]) == 1
    dashboard = (CHART / "dashboards" / "ferrox.json").read_text()
    used = set(re.findall(r"\b(ferrox_(?!operator_)[a-z0-9_]+|vllm:[a-z_]+)", dashboard))
    missing = sorted(used - set(series))
    assert not missing, f"dashboard reads series the real server does not export: {missing}"
