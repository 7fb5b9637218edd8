"""Starts the real ferrox-server binary on loopback for each test module.

FERROX_SERVER_BIN: the binary (default: $CARGO_TARGET_DIR or target/debug/ferrox-server).
FERROX_MODEL: the model (default: models/SmolLM2-135M-Instruct.Q4_1.gguf).
"""

import os
import pathlib
import signal
import socket
import subprocess
import tempfile
import time

import requests
import openai
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL_NAME = "smol"


def server_bin() -> str:
    if os.environ.get("FERROX_SERVER_BIN"):
        return os.environ["FERROX_SERVER_BIN"]
    target = os.environ.get("CARGO_TARGET_DIR", str(ROOT / "target"))
    return str(pathlib.Path(target) / "debug" / "ferrox-server")


def model_path() -> str:
    return os.environ.get("FERROX_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))


def sse_lines(response):
    """A streamed response's lines, split on newlines only as SSE is: text can hold
    U+2028 or U+0085, which `iter_lines(decode_unicode=True)` would split on."""
    for raw in response.iter_lines():
        yield raw.decode("utf-8")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One running server process, its URL and its log."""

    def __init__(self, *flags: str, model: str | None = None, env: dict | None = None,
                 port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="ferrox-", suffix=".log", delete=False)
        args = [
            server_bin(), "serve",
            "--model", model or model_path(),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--served-model-name", MODEL_NAME,
            *flags,
        ]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})
        self.wait_ready()

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}:\n{self.log_text()}")
            try:
                if requests.get(self.url + "/ready", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not ready after {timeout}s:\n{self.log_text()}")

    def log_text(self) -> str:
        return pathlib.Path(self.log.name).read_text(errors="replace")

    def client(self, api_key: str = "none", **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, **kw)

    def metric(self, name: str) -> float:
        text = requests.get(self.url + "/metrics", timeout=5).text
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def close(self) -> None:
        """Stops the server and removes its log (a failed test has already
        shown what it needed from it)."""
        self.stop()
        pathlib.Path(self.log.name).unlink(missing_ok=True)


@pytest.fixture(scope="module")
def server():
    s = Server("--kv-blocks", "256", "--max-seqs", "8", "--max-model-len", "1024",
               "--decode-log-interval", "1", "--max-queue", "64", "--max-body", "64KiB")
    yield s
    s.close()


@pytest.fixture
def start_server():
    started = []

    def start(*flags: str, **kw) -> Server:
        s = Server(*flags, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        s.close()
