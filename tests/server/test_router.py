"""ferrox-router in front of two real servers on loopback (static endpoints):
the openai SDK through the router, whole and streamed; the router's block
hashes agree with what the server caches; shared prefixes stay on one
replica; a client hanging up frees the server's blocks; requests wait for a
replica that is not up yet, and get OpenAI-shaped 503s past the bounds.

FERROX_ROUTER_BIN: the binary (default: $CARGO_TARGET_DIR or
target/debug/ferrox-router).
"""

import json
import os
import pathlib
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid

import pytest
import requests

from conftest import MODEL_NAME, ROOT, Server, free_port

import openai

BLOCK = 16
SERVER_FLAGS = ("--kv-blocks", "256", "--max-seqs", "4", "--max-model-len", "1024")


def router_bin() -> str:
    if os.environ.get("FERROX_ROUTER_BIN"):
        return os.environ["FERROX_ROUTER_BIN"]
    target = os.environ.get("CARGO_TARGET_DIR", str(ROOT / "target"))
    return str(pathlib.Path(target) / "debug" / "ferrox-router")


class Router:
    """One running router process in front of `urls`."""

    def __init__(self, *urls: str, flags: tuple = (), poll_ms: int = 50):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="ferrox-router-", suffix=".log", delete=False)
        args = [router_bin(), "--listen", f"127.0.0.1:{self.port}", "--poll-interval-ms", str(poll_ms),
                *[f"--endpoint={MODEL_NAME}={u}" for u in urls], *flags]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"router exited {self.proc.returncode}:\n{self.log_text()}")
            try:
                if requests.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"router not up:\n{self.log_text()}")

    def log_text(self) -> str:
        return pathlib.Path(self.log.name).read_text(errors="replace")

    def client(self, api_key: str = "none") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        pathlib.Path(self.log.name).unlink(missing_ok=True)


@pytest.fixture(scope="module")
def servers():
    started = [Server(*SERVER_FLAGS) for _ in range(2)]
    yield started
    for s in started:
        s.close()


@pytest.fixture(scope="module")
def router(servers):
    # No expectations: a predicted hit is only what a server reported holding.
    r = Router(*[s.url for s in servers], flags=("--expect-ttl", "0"))
    yield r
    r.close()


def by_url(servers, url):
    return next(s for s in servers if s.url == url)


def hits(server) -> float:
    return server.metric(f'vllm:prefix_cache_hits_total{{model_name="{MODEL_NAME}"}}')


def system_prompt(words: int = 150) -> str:
    tag = uuid.uuid4().hex
    return f"[{tag}] You are a careful assistant. " + " ".join(f"rule{i}" for i in range(words))


def chat(router, messages, **kw):
    raw = router.client().chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=messages, max_tokens=kw.pop("max_tokens", 2), temperature=0, **kw)
    return raw.parse(), raw.headers


def test_whole_and_streamed_chat_and_models(router):
    models = router.client().models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]
    r, headers = chat(router, [{"role": "user", "content": "Say hi."}], max_tokens=8)
    assert r.choices[0].message.content
    assert r.usage.completion_tokens > 0
    assert headers["x-ferrox-endpoint"].startswith("http://127.0.0.1:")
    stream = router.client().chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Count to five."}],
        max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) > 3 and text
    assert chunks[-1].usage.completion_tokens > 0
    done = router.client().completions.create(model=MODEL_NAME, prompt="Once upon a", max_tokens=4)
    assert done.choices[0].text


def test_router_hashes_match_the_blocks_the_server_caches(router, servers):
    messages = [{"role": "system", "content": system_prompt()},
                {"role": "user", "content": "Name a colour."}]
    first, h1 = chat(router, messages)
    assert first.usage.prompt_tokens > 5 * BLOCK
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert h1["x-ferrox-predicted-hit-blocks"] == "0"
    time.sleep(0.5)  # the router reads each server's KV events every 50 ms
    second, h2 = chat(router, messages)
    cached = second.usage.prompt_tokens_details.cached_tokens
    # The server's own count of reused blocks, from the blocks it reported:
    # only an exact hash agreement predicts every one of them.
    assert cached >= 5 * BLOCK
    assert h2["x-ferrox-predicted-hit-blocks"] == str(cached // BLOCK)
    assert h2["x-ferrox-route"] == "prefix-hit"
    assert h2["x-ferrox-endpoint"] == h1["x-ferrox-endpoint"]
    # The same prompt through /tokenize of the server: the router counted
    # every cacheable block of it.
    count = requests.post(h1["x-ferrox-endpoint"] + "/tokenize",
                          json={"model": MODEL_NAME, "messages": messages}).json()["count"]
    assert count == first.usage.prompt_tokens
    assert cached // BLOCK == (count - 1) // BLOCK


def test_shared_prefixes_stay_on_one_replica(router, servers):
    prompts = [system_prompt() for _ in range(4)]
    before = [hits(s) for s in servers]
    homes = {}
    for round_ in range(3):
        for i, p in enumerate(prompts):
            _, h = chat(router, [{"role": "system", "content": p},
                                 {"role": "user", "content": f"Question {round_}."}])
            homes.setdefault(i, set()).add(h["x-ferrox-endpoint"])
            time.sleep(0.15)
    assert all(len(v) == 1 for v in homes.values()), homes
    # Every repeat hit its system prompt's blocks on its replica.
    gained = sum(hits(s) for s in servers) - sum(before)
    assert gained >= 4 * 2 * 5 * BLOCK, gained


ABORTS = 'ferrox_requests_finished_total{reason="abort"}'


def wait_idle(servers, within=10.0):
    """True once no server runs a request or holds a KV block."""
    deadline = time.time() + within
    while time.time() < deadline:
        if all(s.metric("vllm:num_requests_running") == 0 and s.metric("ferrox_kv_blocks_used") == 0
               for s in servers):
            return True
        time.sleep(0.1)
    return False


def test_a_client_hanging_up_frees_the_servers_blocks(router, servers):
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Write a long story."}],
            "max_tokens": 600, "stream": True, "ignore_eos": True}
    r = requests.post(router.url + "/v1/chat/completions", json=body, stream=True, timeout=30)
    assert r.status_code == 200
    server = by_url(servers, r.headers["x-ferrox-endpoint"])
    lines = r.iter_lines()
    got = [next(lines) for _ in range(6)]
    assert any(line.startswith(b"data: ") for line in got)
    assert server.metric("vllm:num_requests_running") >= 1
    r.close()
    assert wait_idle(servers)
    assert server.metric(ABORTS) >= 1


def test_a_client_hanging_up_before_a_whole_answer_frees_the_servers_blocks(router, servers):
    assert wait_idle(servers)
    aborts = sum(s.metric(ABORTS) for s in servers)
    body = json.dumps({"model": MODEL_NAME, "messages": [{"role": "user", "content": "Write a long story."}],
                       "max_tokens": 600, "ignore_eos": True}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode()
    sock = socket.create_connection(("127.0.0.1", router.port), timeout=10)
    sock.sendall(head + body)
    deadline = time.time() + 10
    while sum(s.metric("vllm:num_requests_running") for s in servers) < 1:
        assert time.time() < deadline, "the request never started upstream"
        time.sleep(0.05)
    sock.close()  # before any answer: a non-streamed body comes only at the end
    assert wait_idle(servers), "the upstream request ran on after the client left"
    assert sum(s.metric(ABORTS) for s in servers) == aborts + 1


def test_keys_size_and_model_are_checked_like_the_server(servers):
    r = Router(servers[0].url, flags=("--api-key", "sk-r", "--max-body", "2000"))
    try:
        url = r.url + "/v1/chat/completions"
        msg = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        cases = [
            ({}, msg, 401, "invalid_api_key"),
            ({"Authorization": "Bearer sk-r"}, {**msg, "model": "nope"}, 404, "model_not_found"),
            ({"Authorization": "Bearer sk-r"}, {**msg, "messages": [{"role": "user", "content": "x" * 3000}]},
             413, "body_too_large"),
        ]
        for headers, body, status, code in cases:
            got = requests.post(url, json=body, headers=headers, timeout=30)
            assert got.status_code == status, got.text
            assert got.json()["error"]["code"] == code
        ok = requests.post(url, json=msg, headers={"Authorization": "Bearer sk-r"}, timeout=60)
        assert ok.status_code == 200, ok.text
    finally:
        r.close()


def test_a_request_waits_for_a_replica_that_is_not_up_yet(start_server):
    port = free_port()
    r = Router(f"http://127.0.0.1:{port}", flags=("--wait-timeout", "120", "--max-pending", "2"))
    try:
        answers = []

        def ask():
            t0 = time.time()
            got = requests.post(r.url + "/v1/chat/completions", timeout=150, json={
                "model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
            answers.append((got, time.time() - t0))

        waiters = [threading.Thread(target=ask) for _ in range(2)]
        for w in waiters:
            w.start()
        time.sleep(1.0)
        pending = requests.get(r.url + "/metrics").text
        assert f'ferrox_router_pending_requests{{model="{MODEL_NAME}"}} 2' in pending
        # The line is full: a third is refused at once.
        full = requests.post(r.url + "/v1/chat/completions", timeout=10, json={
            "model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}]})
        assert full.status_code == 503 and full.headers["Retry-After"]
        assert full.json()["error"]["type"] == "service_unavailable"
        start_server(*SERVER_FLAGS, port=port)
        for w in waiters:
            w.join()
        for got, secs in answers:
            assert got.status_code == 200, got.text
            print(f"answered {secs:.1f} s after the request (server start included)")
    finally:
        r.close()


def test_a_wait_past_its_timeout_is_a_503_with_retry_after():
    r = Router(f"http://127.0.0.1:{free_port()}", flags=("--wait-timeout", "1"))
    try:
        t0 = time.time()
        got = requests.post(r.url + "/v1/completions", timeout=30,
                            json={"model": MODEL_NAME, "prompt": "x"})
        assert 0.9 <= time.time() - t0 < 10
        assert got.status_code == 503
        assert int(got.headers["Retry-After"]) > 0
        assert "within 1 s" in got.json()["error"]["message"]
        pending = requests.get(r.url + "/metrics").text
        assert f'ferrox_router_pending_requests{{model="{MODEL_NAME}"}} 0' in pending
    finally:
        r.close()


def test_the_pending_long_poll_answers_on_the_first_waiting_request():
    # The operator's wake: it holds GET /pending and scales 0 -> 1 on its answer.
    r = Router(f"http://127.0.0.1:{free_port()}", flags=("--wait-timeout", "3"))
    try:
        first = requests.get(r.url + "/pending", timeout=10).json()
        assert first["models"] == {}
        polled = {}

        def poll():
            t0 = time.time()
            got = requests.get(r.url + "/pending", timeout=30,
                               params={"since": first["version"], "wait_ms": 20000})
            polled.update(got.json(), secs=time.time() - t0)

        poller = threading.Thread(target=poll)
        poller.start()
        time.sleep(0.5)
        asked = time.time()
        waiter = threading.Thread(target=lambda: requests.post(
            r.url + "/v1/completions", timeout=30, json={"model": MODEL_NAME, "prompt": "x"}))
        waiter.start()
        poller.join()
        assert polled["models"] == {MODEL_NAME: 1}, polled
        assert polled["version"] > first["version"]
        print(f"the long-poll answered {time.time() - asked:.3f} s after the request")
        assert time.time() - asked < 1.0
        # Not the version it was asked about: at once; the same one: held to wait_ms.
        t0 = time.time()
        assert requests.get(r.url + "/pending", timeout=10,
                            params={"since": first["version"], "wait_ms": 5000}).json()["models"]
        assert time.time() - t0 < 1.0
        waiter.join()
        after = requests.get(r.url + "/pending", timeout=10).json()
        assert after["models"] == {} and after["version"] > polled["version"]
        t0 = time.time()
        same = requests.get(r.url + "/pending", timeout=10,
                            params={"since": after["version"], "wait_ms": 300}).json()
        assert same == after and 0.25 <= time.time() - t0 < 5
        bad = requests.get(r.url + "/pending", params={"since": "x"}, timeout=10)
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    finally:
        r.close()


def test_a_replica_that_dies_is_passed_over_at_once(servers, start_server):
    doomed = start_server(*SERVER_FLAGS)
    # Polled once at start, then not for a minute: only the refused
    # connection tells the router that the replica is gone.
    r = Router(doomed.url, servers[0].url, poll_ms=60000)
    try:
        # Both ready: new prefixes (a random first block: the system
        # message's) reach each.
        seen = set()
        for _ in range(20):
            _, h = chat(r, [{"role": "system", "content": system_prompt(20)},
                            {"role": "user", "content": "hi"}])
            seen.add(h["x-ferrox-endpoint"])
            if len(seen) == 2:
                break
        assert seen == {doomed.url, servers[0].url}
        doomed.proc.kill()
        doomed.proc.wait()
        for _ in range(12):
            _, h = chat(r, [{"role": "system", "content": system_prompt(20)},
                            {"role": "user", "content": "hi"}])
            assert h["x-ferrox-endpoint"] == servers[0].url
        # Some of them were placed on the dead one first (1 in 4096 not).
        assert "trying another" in r.log_text()
    finally:
        r.close()


def test_a_replica_killed_mid_answer_is_retried_on_another(servers, start_server):
    doomed = start_server(*SERVER_FLAGS)
    # Polled once at start, then not for a minute: the router learns of
    # the death only from the dropped connections.
    r = Router(doomed.url, servers[0].url, poll_ms=60000)
    try:
        # A system message whose key homes on the doomed replica: sent
        # again, its long requests go there (the rest spill over by load).
        doomed_system = None
        for _ in range(40):
            system = system_prompt(20)
            _, h = chat(r, [{"role": "system", "content": system},
                            {"role": "user", "content": "Write a long story."}])
            if h["x-ferrox-endpoint"] == doomed.url:
                doomed_system = system
                break
        assert doomed_system is not None, "no prompt was placed on the doomed replica"
        answers = []

        def ask():
            got = requests.post(r.url + "/v1/chat/completions", timeout=120, json={
                "model": MODEL_NAME, "max_tokens": 200, "ignore_eos": True, "temperature": 0,
                "messages": [{"role": "system", "content": doomed_system},
                             {"role": "user", "content": "Write a long story."}]})
            answers.append(got)

        askers = [threading.Thread(target=ask) for _ in range(6)]
        for a in askers:
            a.start()
        deadline = time.time() + 30
        while doomed.metric("vllm:num_requests_running") < 1:
            assert time.time() < deadline, "no request reached the doomed replica"
            time.sleep(0.05)
        # Non-streamed: no byte of an answer has left the replica yet.
        doomed.proc.kill()
        doomed.proc.wait()
        for a in askers:
            a.join(timeout=150)
        assert len(answers) == 6
        for got in answers:
            assert got.status_code == 200, got.text
            assert got.headers["x-ferrox-endpoint"] == servers[0].url
            assert got.json()["usage"]["completion_tokens"] == 200
        assert "Dropped" in r.log_text()
    finally:
        r.close()
