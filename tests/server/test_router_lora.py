"""ferrox-router with LoRA adapters, in front of real servers on loopback:
a request for an adapter goes to a replica that has it loaded, its prompt
hashed with the adapter's key as that server caches it; /v1/models through
the router lists adapters under their model; and a request for a declared
adapter waits for a replica as its model's would (scale from zero)."""

import threading
import time
import uuid

import pytest
import requests

import lora_adapters
from conftest import MODEL_NAME, Server, free_port
from test_router import BLOCK, SERVER_FLAGS, Router


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    return lora_adapters.write(tmp_path_factory.mktemp("lora") / "sql", rank=8, seed=1)


@pytest.fixture(scope="module")
def pair(adapter):
    with_sql = Server(*SERVER_FLAGS, "--lora-modules", f"sql={adapter}", "--max-lora-rank", "8")
    plain = Server(*SERVER_FLAGS)
    r = Router(with_sql.url, plain.url, flags=("--expect-ttl", "0"))
    yield r, with_sql, plain
    r.close()
    with_sql.close()
    plain.close()


def chat(r, model, messages, max_tokens=2):
    raw = r.client().chat.completions.with_raw_response.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=0)
    return raw.parse(), raw.headers


def test_adapter_requests_go_where_it_is_loaded_and_models_lists_it(pair):
    r, with_sql, _ = pair
    deadline = time.time() + 10
    while "sql" not in {m.id for m in r.client().models.list().data}:
        assert time.time() < deadline, "the router never listed the adapter"
        time.sleep(0.1)
    cards = {m.id: m for m in r.client().models.list().data}
    assert cards["sql"].parent == MODEL_NAME and getattr(cards[MODEL_NAME], "parent", None) is None
    for i in range(6):
        got, headers = chat(r, "sql", [{"role": "user", "content": f"Question {i}?"}])
        assert got.model == "sql"
        assert headers["x-ferrox-endpoint"] == with_sql.url
    with pytest.raises(Exception) as e:
        chat(r, "nope", [{"role": "user", "content": "hi"}])
    assert "404" in str(e.value) or "model_not_found" in str(e.value)


def test_the_routers_adapter_hashes_match_what_the_server_caches(pair):
    r, with_sql, _ = pair
    system = f"[{uuid.uuid4().hex}] You answer in SQL. " + " ".join(f"table{i}" for i in range(150))
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Count rows."}]
    first, _ = chat(r, "sql", messages)
    assert first.usage.prompt_tokens > 5 * BLOCK
    time.sleep(0.5)  # the router reads the server's KV events every 50 ms
    second, headers = chat(r, "sql", messages)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= 5 * BLOCK
    assert headers["x-ferrox-predicted-hit-blocks"] == str(cached // BLOCK)
    assert headers["x-ferrox-route"] == "prefix-hit"
    # The same prompt for the base model shares none of the adapter's blocks.
    base, headers = chat(r, MODEL_NAME, messages)
    assert base.usage.prompt_tokens_details.cached_tokens == 0
    assert headers["x-ferrox-predicted-hit-blocks"] == "0"


def test_a_request_for_a_declared_adapter_waits_for_a_replica(start_server, adapter):
    port = free_port()
    r = Router(f"http://127.0.0.1:{port}", flags=("--wait-timeout", "120", "--adapter", f"{MODEL_NAME}=sql"))
    try:
        answers = []

        def ask():
            answers.append(requests.post(r.url + "/v1/chat/completions", timeout=150, json={
                "model": "sql", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))

        waiter = threading.Thread(target=ask)
        waiter.start()
        time.sleep(1.0)
        metrics = requests.get(r.url + "/metrics").text
        assert f'ferrox_router_pending_requests{{model="{MODEL_NAME}"}} 1' in metrics
        pending = requests.get(r.url + "/pending").json()
        assert pending["models"] == {MODEL_NAME: 1}
        start_server(*SERVER_FLAGS, "--lora-modules", f"sql={adapter}", "--max-lora-rank", "8", port=port)
        waiter.join()
        (got,) = answers
        assert got.status_code == 200, got.text
        assert got.json()["model"] == "sql"
    finally:
        r.close()
