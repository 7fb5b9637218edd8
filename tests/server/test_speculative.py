"""Speculative decoding (n-gram prompt lookup) on the real server: greedy
answers are the same token for token with it on and off, alone and sixteen
at once, with the prefix cache on and prompts prefilled in chunks, and when a
client goes away in the middle of a verified step; its counters and status
line say what it verified; bad configurations are refused at start."""

import json
import re
import threading

import pytest
import requests

from conftest import MODEL_NAME, Server

NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 5,
                    "prompt_lookup_max": 4, "prompt_lookup_min": 2})
FLAGS = ("--kv-blocks", "512", "--max-seqs", "16", "--max-model-len", "1024",
         "--prefill-chunk", "48", "--decode-log-interval", "1")

CODE = '''def merge_intervals(intervals):
    """Merge overlapping closed intervals and return them sorted by start."""
    if not intervals:
        return []
    ordered = sorted(intervals, key=lambda pair: pair[0])
    merged = [list(ordered[0])]
    for start, end in ordered[1:]:
        last = merged[-1]
        if start <= last[1]:
            last[1] = max(last[1], end)
        else:
            merged.append([start, end])
    return [tuple(pair) for pair in merged]
'''

PROSE = ("The old lighthouse stood at the end of a narrow spit of rock, and for more than a century its "
         "keepers had climbed the one hundred and twelve steps every evening to light the lamp. The last "
         "keeper, a quiet man named Thomas Hale, kept a logbook in which he wrote down the weather, the "
         "ships that passed and the birds that rested on the gallery rail.")

COPY = [f"Repeat the following text exactly, without changing anything:\n\n{t}" for t in (CODE, PROSE)]
CHAT = ["Write a short story about a dragon who learns to bake bread.",
        "What are three good habits for writing maintainable code?",
        "Explain why the sky is blue in two sentences.",
        "List four fruits and one fact about each."]
MESSAGES = [COPY[i % 2] if i % 2 == 0 else CHAT[i % 4] for i in range(16)]


def answer(server, content, max_tokens=48, **extra):
    r = requests.post(server.url + "/v1/chat/completions", timeout=600, json={
        "model": MODEL_NAME, "temperature": 0, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": content}], **extra})
    assert r.status_code == 200, r.text
    body = r.json()
    return body["choices"][0]["message"]["content"], body["usage"]["completion_tokens"]


def answers_together(server, messages, max_tokens=48):
    out = [None] * len(messages)

    def one(i):
        out[i] = answer(server, messages[i], max_tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(messages))]
    [t.start() for t in threads]
    [t.join() for t in threads]
    return out


def metric(server, name):
    return server.metric(f'{name}{{model_name="{MODEL_NAME}"}}')


@pytest.fixture(scope="module")
def servers():
    off = Server(*FLAGS)
    on = Server(*FLAGS, "--speculative-config", NGRAM)
    yield off, on
    off.close()
    on.close()


def test_greedy_answers_are_the_same_token_for_token_alone_and_sixteen_at_once(servers):
    off, on = servers
    want = [answer(off, m) for m in MESSAGES]
    # Alone, one after the other: the copy prompts' second round is taken
    # from the prefix cache.
    for m, w in zip(MESSAGES[:4] + MESSAGES[:2], want[:4] + want[:2]):
        assert answer(on, m) == w, m[:60]
    assert on.metric("ferrox_prefix_cache_hits_total") > 0
    # Sixteen at once, prompts prefilled in chunks of 48 beside the
    # decoding rows.
    assert answers_together(on, MESSAGES) == want
    drafts = metric(on, "vllm:spec_decode_num_drafts_total")
    accepted = metric(on, "vllm:spec_decode_num_accepted_tokens_total")
    drafted = metric(on, "vllm:spec_decode_num_draft_tokens_total")
    assert drafts > 0 and 0 < accepted <= drafted, (drafts, accepted, drafted)
    first = on.metric(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="{MODEL_NAME}",position="0"}}')
    assert 0 < first <= drafts
    lens = [float(x) for x in re.findall(r"mean accept len: ([0-9.]+)", on.log_text())]
    assert lens and max(lens) > 1.5, lens
    assert on.metric("ferrox_kv_blocks_used") == 0
    # A server without speculation exports none of it.
    assert "spec_decode" not in requests.get(off.url + "/metrics", timeout=5).text


def test_a_request_may_opt_out_and_answers_the_same(servers):
    off, on = servers
    before = metric(on, "vllm:spec_decode_num_drafts_total")
    got = answer(on, COPY[1], disable_spec_decode=True)
    assert got == answer(off, COPY[1])
    assert metric(on, "vllm:spec_decode_num_drafts_total") == before


def stream_then_drop(server, content, chunks):
    """Streams an answer and closes the connection after `chunks` chunks."""
    with requests.post(server.url + "/v1/chat/completions", stream=True, timeout=600, json={
            "model": MODEL_NAME, "temperature": 0, "max_tokens": 200, "stream": True,
            "messages": [{"role": "user", "content": content}]}) as r:
        seen = 0
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                seen += 1
                if seen == chunks:
                    break


def test_a_client_gone_in_the_middle_of_a_verified_run_leaves_the_others_exact(servers):
    off, on = servers
    others = [MESSAGES[0], MESSAGES[1], MESSAGES[2]]
    want = [answer(off, m, 96) for m in others]
    aborted = on.metric('ferrox_requests_finished_total{reason="abort"}')
    out = [None] * len(others)

    def one(i):
        out[i] = answer(on, others[i], 96)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(others))]
    threads.append(threading.Thread(target=stream_then_drop, args=(on, COPY[0], 12)))
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert out == want
    for _ in range(50):
        if on.metric('ferrox_requests_finished_total{reason="abort"}') == aborted + 1:
            break
        threading.Event().wait(0.1)
    assert on.metric('ferrox_requests_finished_total{reason="abort"}') == aborted + 1
    assert on.metric("ferrox_kv_blocks_used") == 0


@pytest.mark.parametrize("config,why", [
    ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens must be 1 to 16, not 0"),
    ('{"method": "ngram", "num_speculative_tokens": 17}', "num_speculative_tokens must be 1 to 16, not 17"),
    ('{"method": "suffix", "num_speculative_tokens": 4}', "method `suffix` is not served"),
])
def test_a_bad_speculative_config_is_refused_at_start_with_the_reason(config, why):
    with pytest.raises(RuntimeError) as e:
        Server("--speculative-config", config).close()
    assert "--speculative-config" in str(e.value) and why in str(e.value), str(e.value)
