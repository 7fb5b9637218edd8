"""The prefix cache on the real server: a second request with the same long
system prompt takes it from the cache (the status line, the vLLM counters and
the answer's usage say so) and answers exactly as a server with the cache off
does."""

import re

import openai
import pytest
import requests

from conftest import MODEL_NAME

SYSTEM = ("You are a careful assistant for a shipping company. Answer in one short sentence. "
          "Never invent tracking numbers. Parcels travel by road, rail and sea; customs can add "
          "two days; refunds take five working days. ") * 4


def ask(server, question):
    r = server.client(timeout=120).chat.completions.create(
        model=MODEL_NAME, temperature=0, max_tokens=16,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])
    return r.choices[0].message.content, r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens


def cached_tokens(server):
    return [int(n) for n in re.findall(r"#cached-token: (\d+)", server.log_text())]


def test_a_shared_system_prompt_is_computed_once_and_answers_the_same(start_server):
    flags = ("--kv-blocks", "256", "--max-model-len", "1024", "--block-size", "16")
    on = start_server(*flags)
    off = start_server(*flags, "--prefix-caching", "off")
    questions = ["Where is my parcel?", "How long do refunds take?"]
    answers = {}
    for name, s in (("on", on), ("off", off)):
        answers[name] = [ask(s, q) for q in questions]
    prompt_tokens = answers["on"][1][1]
    assert prompt_tokens > 200, prompt_tokens
    # The first request found nothing; the second took the system prompt's
    # full blocks (everything before where the questions differ).
    first, second = cached_tokens(on)[-2:]
    assert first == 0
    assert second >= 160 and second % 16 == 0 and second < prompt_tokens, second
    assert on.metric(f'vllm:prefix_cache_hits_total{{model_name="{MODEL_NAME}"}}') == second
    queries = on.metric(f'vllm:prefix_cache_queries_total{{model_name="{MODEL_NAME}"}}')
    assert queries == answers["on"][0][1] + prompt_tokens
    assert on.metric("ferrox_prefix_cache_hits_total") == second
    # Each answer's usage says what it took from the cache (OpenAI's
    # usage.prompt_tokens_details.cached_tokens).
    assert [a[2] for a in answers["on"]] == [0, second]
    assert [a[2] for a in answers["off"]] == [0, 0]
    assert cached_tokens(off) == [0, 0]
    assert off.metric("ferrox_prefix_cache_hits_total") == 0
    assert [a[:2] for a in answers["on"]] == [a[:2] for a in answers["off"]]
    # Its blocks stay cached, unpinned, once nothing runs.
    assert on.metric("ferrox_kv_blocks_used") == 0
    assert on.metric("ferrox_kv_blocks_pinned") == 0
    assert on.metric("ferrox_kv_blocks_cached") >= second / 16
    assert off.metric("ferrox_kv_blocks_cached") == 0


def test_the_plan_is_exported(server):
    text = requests.get(server.url + "/metrics", timeout=5).text
    info = next(l for l in text.splitlines() if l.startswith("vllm:cache_config_info{"))
    labels = dict(re.findall(r'(\w+)="([^"]*)"', info))
    assert labels == {"block_size": "16", "cache_dtype": labels["cache_dtype"], "num_gpu_blocks": "256",
                      "gpu_memory_utilization": labels["gpu_memory_utilization"],
                      "enable_prefix_caching": "True", "sliding_window": "None"}, info
    assert info.endswith(" 1")
    assert server.metric("ferrox_plan_max_model_len") == 1024
    assert server.metric("ferrox_plan_max_seqs") == 8
    assert server.metric("ferrox_plan_kv_block_bytes") > 0
    assert server.metric("ferrox_plan_weight_bytes") > 50e6
    # The memory the plan was checked against: the host's, above the plan.
    text = requests.get(server.url + "/metrics", timeout=5).text
    source = re.search(r'^ferrox_plan_memory_bytes\{source="([a-z0-9-]+)"\}', text, re.M).group(1)
    assert source in ("cgroup-v2", "cgroup-v1", "meminfo"), source
    assert server.metric("ferrox_plan_memory_bytes") > \
        256 * server.metric("ferrox_plan_kv_block_bytes") + server.metric("ferrox_plan_weight_bytes")


def test_a_chat_without_max_tokens_reserves_the_default_not_the_context(start_server):
    s = start_server("--kv-blocks", "256", "--max-model-len", "1024", "--default-max-tokens", "8")
    r = s.client(timeout=120).chat.completions.create(
        model=MODEL_NAME, temperature=0, messages=[{"role": "user", "content": "Count to fifty."}],
        extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 8
    assert r.choices[0].finish_reason == "length"


def test_cache_salt_parts_tenants(start_server):
    # vLLM's cache_salt: requests share cached blocks only with the same salt,
    # so one tenant cannot learn another's prompts from its time to first token.
    s = start_server("--kv-blocks", "256", "--max-model-len", "1024", "--block-size", "16")
    c = s.client(timeout=120)

    def cached(salt, question):
        extra = {} if salt is None else {"cache_salt": salt}
        r = c.chat.completions.create(
            model=MODEL_NAME, temperature=0, max_tokens=4, extra_body=extra,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])
        return r.usage.prompt_tokens_details.cached_tokens

    assert cached("tenant-a", "Where is my parcel?") == 0
    assert cached("tenant-b", "How long do refunds take?") == 0
    assert cached(None, "Can I pay by card?") == 0
    assert cached("tenant-a", "How long do refunds take?") >= 160
    assert cached("tenant-b", "Where is my parcel?") >= 160
    with pytest.raises(openai.BadRequestError, match="cache_salt"):
        cached("", "Hi")
