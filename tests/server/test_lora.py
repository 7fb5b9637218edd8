"""LoRA adapters on the real server, through the OpenAI client: `model`
names an adapter, /v1/models lists them under their base, a batch mixing
adapters and the base answers each as alone, and vLLM's run-time load and
unload endpoints work with the flag and are refused without it; a bad
adapter is refused with its name and reason and the server keeps serving."""

import concurrent.futures
import shutil
import subprocess
import time

import openai
import pytest
import requests

import lora_adapters
from conftest import MODEL_NAME

FLAGS = ("--kv-blocks", "256", "--max-seqs", "8", "--max-model-len", "512")
PROMPT = "The three primary colors are"


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("adapters")
    return {
        "sql": lora_adapters.write(root / "sql", rank=8, seed=1),
        "chat": lora_adapters.write(root / "chat", rank=4, seed=2),
        "extra": lora_adapters.write(root / "extra", rank=8, seed=3),
        "rank16": lora_adapters.write(root / "rank16", rank=16, seed=4),
        "small": lora_adapters.write(root / "small", rank=4, seed=5,
                                     shape=(64, 128, 2, 4, 2, 16)),
    }


def complete(c: openai.OpenAI, model: str, prompt: str = PROMPT) -> openai.types.Completion:
    return c.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0)


def post(url: str, path: str, body: dict) -> requests.Response:
    return requests.post(url + path, json=body, timeout=120)


def test_model_names_an_adapter_and_models_lists_them(start_server, adapters):
    s = start_server(*FLAGS, "--lora-modules", f"sql={adapters['sql']}",
                     f"chat={adapters['chat']}", "--max-loras", "2", "--max-lora-rank", "8")
    c = s.client()
    cards = {m.id: m for m in c.models.list().data}
    assert set(cards) == {MODEL_NAME, "sql", "chat"}
    assert cards["sql"].parent == MODEL_NAME and cards["sql"].root == str(adapters["sql"])
    assert getattr(cards[MODEL_NAME], "parent", None) is None
    base, sql = complete(c, MODEL_NAME), complete(c, "sql")
    assert sql.model == "sql" and base.model == MODEL_NAME
    assert sql.choices[0].text != base.choices[0].text, "the adapter changed nothing"
    assert complete(c, "sql").choices[0].text == sql.choices[0].text
    chat = c.chat.completions.create(model="chat", max_tokens=8, temperature=0,
                                     messages=[{"role": "user", "content": "Hi"}])
    assert chat.model == "chat" and chat.choices[0].message.content
    with pytest.raises(openai.NotFoundError) as e:
        complete(c, "nope")
    assert e.value.body["code"] == "model_not_found"
    metrics = requests.get(s.url + "/metrics", timeout=5).text
    assert 'vllm:lora_requests_info{max_lora="2"' in metrics
    assert 'ferrox_lora_requests_total{adapter="sql"} 2' in metrics
    assert 'ferrox_lora_adapter_loaded{adapter="chat"} 1' in metrics
    promtool = shutil.which("promtool")
    if promtool is not None:
        out = subprocess.run([promtool, "check", "metrics"], input=metrics.encode(),
                             capture_output=True)
        problems = [l for l in (out.stdout + out.stderr).decode().splitlines() if l.strip()]
        # Lint only, and only what test_api allows: ':' in vLLM's names, and
        # the one gauge whose name ends in _total.
        assert out.returncode in (0, 3), problems
        assert all(("should not contain ':'" in p and p.startswith("vllm:"))
                   or p.startswith("ferrox_kv_blocks_total") for p in problems), problems
    # Run-time loading is off on this server: 403 with the reason.
    r = post(s.url, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(adapters["extra"])})
    assert r.status_code == 403 and "--allow-runtime-lora-updating" in r.json()["error"]["message"]
    r = post(s.url, "/v1/unload_lora_adapter", {"lora_name": "sql"})
    assert r.status_code == 403


def test_a_batch_mixing_adapters_and_the_base_answers_each_as_alone(start_server, adapters):
    s = start_server(*FLAGS, "--lora-modules", f"sql={adapters['sql']}",
                     f"chat={adapters['chat']}", "--max-loras", "2", "--max-lora-rank", "8")
    c = s.client()
    asks = [(m, p) for m in ("sql", "chat", MODEL_NAME) for p in (PROMPT, "Once upon a time")]
    alone = {a: complete(c, *a).choices[0].text for a in asks}
    with concurrent.futures.ThreadPoolExecutor(len(asks) * 2) as pool:
        together = list(pool.map(lambda a: (a, complete(c, *a).choices[0].text), asks * 2))
    for a, text in together:
        assert text == alone[a], a


def test_adapters_load_and_unload_at_run_time_with_the_flag(start_server, adapters):
    s = start_server(*FLAGS, "--max-lora-rank", "8",
                     env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})
    c = s.client()
    started = time.monotonic()
    r = post(s.url, "/v1/load_lora_adapter", {"lora_name": "extra", "lora_path": str(adapters["extra"])})
    print(f"rank-8 adapter loaded at run time in {time.monotonic() - started:.3f} s")
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'extra' added successfully."
    assert "extra" in {m.id for m in c.models.list().data}
    assert complete(c, "extra").model == "extra"
    again = post(s.url, "/v1/load_lora_adapter", {"lora_name": "extra", "lora_path": str(adapters["extra"])})
    assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]
    r = post(s.url, "/v1/unload_lora_adapter", {"lora_name": "extra"})
    assert r.status_code == 200 and "removed successfully" in r.text
    with pytest.raises(openai.NotFoundError):
        complete(c, "extra")
    r = post(s.url, "/v1/unload_lora_adapter", {"lora_name": "extra"})
    assert r.status_code == 404


def test_bad_adapters_are_refused_with_name_and_reason_and_the_server_keeps_serving(
        start_server, adapters, tmp_path):
    s = start_server(*FLAGS, "--allow-runtime-lora-updating", "--max-lora-rank", "8")
    truncated = tmp_path / "truncated"
    truncated.mkdir()
    for f in ("adapter_config.json", "adapter_model.safetensors"):
        data = (adapters["sql"] / f).read_bytes()
        (truncated / f).write_bytes(data if f.endswith(".json") else data[: len(data) // 2])
    cases = [
        ("big", adapters["rank16"], "rank 16 is above --max-lora-rank 8"),
        ("wrong-base", adapters["small"], "the base model's is"),
        ("cut", truncated, "unreadable"),
        ("missing", tmp_path / "nowhere", "does not exist"),
        (MODEL_NAME, adapters["sql"], "is the base model's name"),
    ]
    for name, path, why in cases:
        r = post(s.url, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
        assert r.status_code == 400, (name, r.text)
        message = r.json()["error"]["message"]
        assert why in message and name in message, (name, message)
    assert complete(s.client(), MODEL_NAME).choices[0].text
    assert {m.id for m in s.client().models.list().data} == {MODEL_NAME}


def test_a_server_without_lora_refuses_the_load_endpoint(start_server, adapters):
    s = start_server(*FLAGS)
    r = post(s.url, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(adapters["sql"])})
    assert r.status_code == 400 and "--enable-lora" in r.json()["error"]["message"]


def test_a_bad_module_at_start_stops_the_server_with_its_name_and_reason(adapters):
    from conftest import Server
    with pytest.raises(RuntimeError) as e:
        Server(*FLAGS, "--lora-modules", f"big={adapters['rank16']}", "--max-lora-rank", "8")
    assert "--lora-modules big=" in str(e.value) and "rank 16 is above" in str(e.value)
