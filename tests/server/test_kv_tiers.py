"""The disk KV tier on the real server: a conversation evicted from a small
device pool comes back from disk (usage, metrics and the router's events say
so) with the same greedy answer; a new process on the same directory hits the
old blocks; bad tier flags are refused at start with the reason."""

import pathlib
import subprocess
import time

import pytest
import requests

from conftest import MODEL_NAME, Server, model_path, server_bin

HISTORY = ("You are a careful assistant for a shipping company. Answer in one short sentence. "
           "Parcels travel by road, rail and sea; customs can add two days; refunds take five "
           "working days. ") * 5


def ask(server, system, question="Where is my parcel?"):
    r = server.client(timeout=120).chat.completions.create(
        model=MODEL_NAME, temperature=0, max_tokens=12,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}])
    return r.choices[0].message.content, r.usage.prompt_tokens_details.cached_tokens


def flags(tier_dir):
    # 24 blocks of 16: one conversation (~300 tokens) and a little more.
    return ("--kv-blocks", "24", "--block-size", "16", "--max-model-len", "384",
            "--max-seqs", "1", "--kv-offload", f"disk={tier_dir}:64Mi")


def wait_written(server, blocks):
    deadline = time.time() + 30
    while server.metric('ferrox_kv_tier_blocks{tier="disk"}') < blocks:
        assert time.time() < deadline, server.log_text()
        time.sleep(0.1)


def evict(server):
    for i in range(3):
        ask(server, f"Another tenant's long instructions number {i}. " * 25, "Hello?")


def test_an_evicted_conversation_comes_back_from_disk_and_survives_a_restart(start_server, tmp_path):
    tier = tmp_path / "kv"
    s = start_server(*flags(tier))
    first, cached = ask(s, HISTORY)
    assert cached == 0
    wait_written(s, 13)
    evict(s)
    again, cached = ask(s, HISTORY)
    assert again == first
    assert cached >= 192 and cached % 16 == 0, cached
    assert s.metric('ferrox_kv_tier_hits_total{tier="disk"}') == cached / 16
    assert s.metric(f'vllm:external_prefix_cache_hits_total{{model_name="{MODEL_NAME}"}}') == cached
    assert s.metric("ferrox_kv_blocks_used") == 0
    # The router's view of the tier: every block it holds, by hash.
    page = requests.get(s.url + "/kv_events?tier=disk", timeout=5).json()
    assert len(page["stored"]) == s.metric('ferrox_kv_tier_blocks{tier="disk"}')
    assert requests.get(s.url + "/kv_events?tier=host", timeout=5).json()["stored"] == []
    bad = requests.get(s.url + "/kv_events?tier=ssd", timeout=5)
    assert bad.status_code == 400 and "not a KV tier" in bad.json()["error"]["message"]
    s.close()
    # A new process on the same directory: the first request hits.
    later = start_server(*flags(tier))
    back, cached = ask(later, HISTORY)
    assert back == first
    assert cached >= 192, cached
    # Another tenant (cache_salt) never does.
    r = later.client(timeout=120).chat.completions.create(
        model=MODEL_NAME, temperature=0, max_tokens=12, extra_body={"cache_salt": "tenant-b"},
        messages=[{"role": "system", "content": HISTORY}, {"role": "user", "content": "Hi"}])
    assert r.usage.prompt_tokens_details.cached_tokens == 0


@pytest.mark.parametrize("tier,reason", [
    ("disk=/proc/ferrox-kv:1Gi", "the disk KV tier at /proc/ferrox-kv: cannot create it"),
    ("disk={tmp}:999999Ti", "larger than its file system"),
    ("host=1Gi", "its KV pool is host memory already"),
    ("disk={tmp}", "a disk tier is disk=PATH:SIZE"),
])
def test_a_tier_that_cannot_be_served_is_refused_at_start(tmp_path, tier, reason):
    args = [server_bin(), "serve", "--model", model_path(), "--port", "0",
            "--kv-offload", tier.format(tmp=tmp_path)]
    p = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert reason in p.stderr + p.stdout, p.stderr + p.stdout
