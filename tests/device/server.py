"""One ferrox-server process on loopback: started, waited for, asked, read
(its log, its /metrics) and stopped. Standard library only."""

import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A running server; `stop()` ends it (also on failure to start)."""

    def __init__(self, binary: str, model: pathlib.Path, log: pathlib.Path, flags: list,
                 ready_timeout: float, env: dict | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.name = "m"
        args = [binary, "serve", "--model", str(model), "--host", "127.0.0.1",
                "--port", str(self.port), "--served-model-name", self.name,
                # Stopping is part of the run's budget: no 30 s drain.
                "--drain-timeout", "1", *flags]
        self.command = " ".join(args)
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                         env={**os.environ, "NO_COLOR": "1", **(env or {})})
        try:
            self._wait_ready(ready_timeout)
        except Exception:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        raise TimeoutError(f"server not ready after {timeout:.0f} s: {self.log_tail()}")

    def log_text(self) -> str:
        return ANSI.sub("", self.log.read_text(errors="replace"))

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def complete(self, prompt: list, max_tokens: int, logprobs: int, timeout: float,
                 **extra) -> dict:
        """Greedy completion of a prompt given as token ids (`extra`: more
        request fields)."""
        body = {"model": self.name, "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0, "logprobs": logprobs, "ignore_eos": True, **extra}
        req = urllib.request.Request(self.url + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"HTTP {e.code}: {e.read().decode(errors='replace')}") from None

    def metrics(self) -> dict:
        """/metrics as {name{labels}: value}."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                try:
                    out[key] = float(value)
                except ValueError:
                    pass
        return out

    def plan_line(self) -> dict:
        """The fields of the `KV pool planned` log line."""
        return self.log_fields("KV pool planned")

    def log_fields(self, message: str) -> dict:
        """The fields of the first log line saying `message`."""
        for line in self.log_text().splitlines():
            if message in line:
                return {k: v.strip('"') for k, v in re.findall(r"(\w+)=(\S+)", line)}
        return {}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def device_line(self) -> str:
        """What the server logged about the device it chose."""
        for line in self.log_text().splitlines():
            if "device chosen" in line:
                return line.split("device chosen", 1)[1].strip() or line
        return "no `device chosen` line"
