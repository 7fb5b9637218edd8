"""The OpenAI API of the real server, with the real default model, on loopback."""

import concurrent.futures
import json
import re
import shutil
import signal
import subprocess
import time

import requests
import openai
import pytest

from conftest import MODEL_NAME, sse_lines

HELLO = [{"role": "user", "content": "Say hello."}]


def test_chat_completion(server):
    r = server.client().chat.completions.create(
        model=MODEL_NAME, messages=HELLO, max_tokens=12, temperature=0)
    choice = r.choices[0]
    assert r.object == "chat.completion"
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 5
    assert 0 < r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completion_max_tokens_and_usage(server):
    r = server.client().completions.create(
        model=MODEL_NAME, prompt="The capital of France is", max_tokens=7,
        temperature=0, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 7
    assert r.choices[0].text


def test_completion_from_token_ids(server):
    c = server.client()
    by_ids = c.completions.create(model=MODEL_NAME, prompt=[504, 3458, 314], max_tokens=4,
                                  temperature=0, extra_body={"ignore_eos": True})
    assert by_ids.usage.prompt_tokens == 3
    assert by_ids.usage.completion_tokens == 4


def test_greedy_is_deterministic_and_streaming_matches(server):
    c = server.client()
    kw = dict(model=MODEL_NAME, prompt="List three colors:", max_tokens=20, temperature=0)
    whole = c.completions.create(**kw).choices[0].text
    assert whole == c.completions.create(**kw).choices[0].text
    pieces, finish = [], None
    for chunk in c.completions.create(stream=True, **kw):
        if chunk.choices:
            pieces.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
    assert "".join(pieces) == whole
    assert finish in ("stop", "length")


def test_chat_stream_with_usage(server):
    chunks = list(server.client().chat.completions.create(
        model=MODEL_NAME, messages=HELLO, max_tokens=10, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].choices == []
    assert 0 < chunks[-1].usage.completion_tokens <= 10


def test_stop_string_is_excluded_and_ends_with_stop(server):
    c = server.client()
    kw = dict(model=MODEL_NAME, prompt="Count: 1, 2, 3, 4, 5, 6,", max_tokens=30, temperature=0)
    free = c.completions.create(**kw).choices[0].text
    # Stop on something the free run really produced, past its first character.
    stop = free.strip()[1:3] or free[:2]
    assert stop
    r = c.completions.create(stop=[stop], **kw)
    assert r.choices[0].finish_reason == "stop"
    assert stop not in r.choices[0].text
    assert free.startswith(r.choices[0].text)


def test_seed_reproduces_a_sample(server):
    c = server.client()
    kw = dict(model=MODEL_NAME, prompt="Tell me a story:", max_tokens=16, temperature=1.0,
              seed=1234)
    assert c.completions.create(**kw).choices[0].text == c.completions.create(**kw).choices[0].text


def test_logprobs(server):
    c = server.client()
    r = c.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=4, temperature=0,
                             logprobs=3, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 4 and len(lp.token_logprobs) == 4
    assert all(x <= 0 for x in lp.token_logprobs)
    assert all(len(t) == 3 for t in lp.top_logprobs)
    # Greedy: the chosen token is the most likely one.
    assert lp.token_logprobs[0] == pytest.approx(max(lp.top_logprobs[0].values()), abs=1e-4)
    chat = c.chat.completions.create(model=MODEL_NAME, messages=HELLO, max_tokens=3,
                                     temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert content and all(len(t.top_logprobs) == 2 for t in content)


def test_models_and_health(server):
    models = server.client().models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]
    assert requests.get(server.url + "/health").status_code == 200
    assert requests.get(server.url + "/ready").status_code == 200


@pytest.mark.parametrize("body,status", [
    (b"{not json", 400),
    (b'{"model": "smol", "prompt": "x", "n": 0}', 400),
    (b'{"model": "smol", "prompt": "x", "frobnicate": 1}', 400),
    (b'{"model": "smol", "prompt": "x", "temperature": -1}', 400),
    (b'{"model": "nope", "prompt": "x"}', 404),
    (b'{"model": "smol", "prompt": [999999999]}', 400),
])
def test_bad_requests_get_openai_errors(server, body, status):
    r = requests.post(server.url + "/v1/completions", data=body,
                      headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"]
    assert set(err) == {"message", "type", "param", "code"}


def test_oversized_prompt_is_400_with_the_numbers(server):
    with pytest.raises(openai.BadRequestError) as e:
        server.client().completions.create(model=MODEL_NAME, prompt=[5] * 1000, max_tokens=100)
    assert "1100" in str(e.value) and "1024" in str(e.value)


def test_body_too_large_is_413(server):
    r = requests.post(server.url + "/v1/completions",
                      data=b'{"prompt": "' + b"a" * (200 << 10) + b'"}')
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "body_too_large"


def test_concurrent_requests_share_decode_steps(server):
    c = server.client(timeout=120)

    def one(i):
        return c.completions.create(model=MODEL_NAME, prompt=f"Number {i}:", max_tokens=24,
                                    temperature=0, extra_body={"ignore_eos": True})

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(one, i) for i in range(8)]
        # Liveness answers at once while the model is busy.
        time.sleep(0.5)
        started = time.time()
        assert requests.get(server.url + "/health", timeout=5).status_code == 200
        health_secs = time.time() - started
        results = [f.result() for f in futures]
    assert health_secs < 0.5, f"/health took {health_secs:.3f} s under load"
    assert all(r.usage.completion_tokens == 24 for r in results)
    running = [int(m) for m in re.findall(r"Decode batch, #running-req: (\d+)", server.log_text())]
    assert max(running) > 1, "no decode step ever served more than one request"
    assert server.metric("ferrox_kv_blocks_used") == 0


def test_client_disconnect_mid_stream_frees_blocks(server):
    with requests.post(server.url + "/v1/completions", json={
        "model": MODEL_NAME, "prompt": "Write a long essay:", "max_tokens": 500,
        "ignore_eos": True, "stream": True}, stream=True, timeout=60) as r:
        lines = sse_lines(r)
        got = [next(lines) for _ in range(6)]
        assert any(l.startswith("data: ") for l in got)
        assert server.metric("ferrox_kv_blocks_used") > 0
    deadline = time.time() + 10
    while server.metric("ferrox_kv_blocks_used") != 0:
        assert time.time() < deadline, "blocks still leased after the client left"
        time.sleep(0.05)
    assert server.metric('ferrox_requests_finished_total{reason="abort"}') >= 1


def test_metrics_pass_promtool(server):
    server.client().completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2)
    text = requests.get(server.url + "/metrics").text
    for name in ["ferrox_requests_waiting", "ferrox_kv_usage_ratio",
                 "ferrox_time_to_first_token_seconds_bucket", "vllm:num_requests_running"]:
        assert name in text
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    # The text must parse (exit 1 would be a parse error; 3 is lint only),
    # and the only lint findings allowed are the two that the required names
    # themselves draw: ':' in the vLLM names (vLLM's own /metrics draws the
    # same) and the "_total" suffix of the gauge ferrox_kv_blocks_total.
    out = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True)
    problems = [l for l in (out.stdout + out.stderr).decode().splitlines() if l.strip()]
    assert out.returncode in (0, 3), problems
    allowed = [
        lambda p: p.startswith("vllm:") and "should not contain ':'" in p,
        lambda p: p.startswith("ferrox_kv_blocks_total non-counter metrics"),
    ]
    assert all(any(ok(p) for ok in allowed) for p in problems), problems


def test_queue_full_is_429_with_retry_after(start_server):
    s = start_server("--kv-blocks", "256", "--max-seqs", "1", "--max-queue", "1",
                     "--max-model-len", "1024")
    body = {"model": MODEL_NAME, "prompt": "go", "max_tokens": 400, "ignore_eos": True}

    def post(_):
        return requests.post(s.url + "/v1/completions", json=body, timeout=120)

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        statuses = [r for r in pool.map(post, range(6))]
    codes = sorted(r.status_code for r in statuses)
    assert 429 in codes and 200 in codes, codes
    limited = next(r for r in statuses if r.status_code == 429)
    assert limited.headers["retry-after"]
    assert limited.json()["error"]["code"] == "queue_full"


def test_sigterm_drains_in_flight_and_exits_zero(start_server):
    s = start_server("--kv-blocks", "256", "--max-model-len", "1024", "--drain-timeout", "60")
    with requests.post(s.url + "/v1/completions", json={
        "model": MODEL_NAME, "prompt": "Go on:", "max_tokens": 400, "ignore_eos": True,
        "stream": True}, stream=True, timeout=60) as r:
        lines = sse_lines(r)
        next(lines)
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.05)
        assert requests.get(s.url + "/ready").status_code == 503
        refused = requests.post(s.url + "/v1/completions",
                             json={"model": MODEL_NAME, "prompt": "x", "max_tokens": 1})
        assert refused.status_code == 503
        rest = [l for l in lines if l.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    last = json.loads(rest[-2][len("data: "):])
    assert last["choices"][0]["finish_reason"] == "length"
    assert s.proc.wait(timeout=30) == 0


def test_tokenizer_info_names_the_special_tokens_as_lm_eval_reads_them(server):
    # lm-eval's remote tokenizer: the EOS string from /tokenizer_info, its id
    # as the first token /tokenize gives for it without special tokens.
    info = requests.get(server.url + "/tokenizer_info", timeout=10).json()
    assert info["eos_token"] == "<|im_end|>" and info["model_max_length"] == 1024
    ids = requests.post(server.url + "/tokenize", timeout=10,
                        json={"prompt": info["eos_token"], "add_special_tokens": False}).json()
    assert ids["tokens"] == [2]


def test_min_tokens_runs_past_the_answers_end(server):
    # vLLM's min_tokens: the end tokens are masked until N tokens are out.
    c = server.client()
    kw = dict(model=MODEL_NAME, messages=HELLO, max_tokens=64, temperature=0)
    short = c.chat.completions.create(**kw)
    assert short.choices[0].finish_reason == "stop"
    n = short.usage.completion_tokens + 8
    longer = c.chat.completions.create(**kw, extra_body={"min_tokens": n})
    assert longer.usage.completion_tokens >= n, longer
    # It is the same greedy answer up to where the short one ended.
    assert longer.choices[0].message.content.startswith(short.choices[0].message.content)
    with pytest.raises(openai.BadRequestError, match="min_tokens"):
        c.chat.completions.create(**{**kw, "max_tokens": 4}, extra_body={"min_tokens": 5})


@pytest.mark.parametrize("stream", [False, True])
def test_include_stop_str_in_output_keeps_the_stop(server, stream):
    c = server.client()
    kw = dict(model=MODEL_NAME, prompt="List three colors: red, green,", max_tokens=24,
              temperature=0, extra_body={"ignore_eos": True})
    free = c.completions.create(**kw).choices[0].text
    # A stop that the greedy text really contains, after its first token.
    stop = free.strip()[2:4]
    assert len(stop) == 2 and stop in free, free

    def text(include):
        body = {**kw, "stop": [stop], "stream": stream,
                "extra_body": {**kw["extra_body"], "include_stop_str_in_output": include}}
        r = c.completions.create(**body)
        if not stream:
            return r.choices[0].text, r.choices[0].finish_reason
        parts, finish = [], None
        for chunk in r:
            if chunk.choices:
                parts.append(chunk.choices[0].text)
                finish = chunk.choices[0].finish_reason or finish
        return "".join(parts), finish

    cut = free[:free.index(stop)]
    assert text(False) == (cut, "stop")
    assert text(True) == (cut + stop, "stop")


def test_template_fields_reach_the_chat_template(server):
    # vLLM's add_generation_prompt, continue_final_message and
    # chat_template_kwargs, on /tokenize and chat alike.
    start = [{"role": "user", "content": "Finish the sentence."},
             {"role": "assistant", "content": "The capital of France is"}]

    def tokens(**fields):
        r = requests.post(server.url + "/tokenize", timeout=10,
                          json={"model": MODEL_NAME, "messages": start, **fields})
        assert r.status_code == 200, r.text
        return r.json()["tokens"]

    def text(ids):
        r = requests.post(server.url + "/detokenize", timeout=10,
                          json={"model": MODEL_NAME, "tokens": ids})
        return r.json()["prompt"]

    opened, closed = tokens(), tokens(add_generation_prompt=False)
    assert text(opened).endswith("<|im_start|>assistant\n"), text(opened)
    assert opened[:len(closed)] == closed and len(opened) > len(closed)
    cont = tokens(continue_final_message=True)
    assert text(cont).endswith("The capital of France is"), text(cont)
    # Unknown kwargs are the template's business (SmolLM2's reads none).
    assert tokens(chat_template_kwargs={"enable_thinking": False}) == opened
    c = server.client()
    kw = dict(model=MODEL_NAME, messages=start, max_tokens=6, temperature=0)
    continued = c.chat.completions.create(**kw, extra_body={"continue_final_message": True})
    # The answer continues the message: as a completion of the same tokens.
    plain = c.completions.create(model=MODEL_NAME, prompt=cont, max_tokens=6, temperature=0)
    assert continued.choices[0].message.content == plain.choices[0].text
    assert continued.usage.prompt_tokens == len(cont)
    with pytest.raises(openai.BadRequestError, match="cannot both be true"):
        c.chat.completions.create(**kw, extra_body={"continue_final_message": True,
                                                    "add_generation_prompt": True})
    r = c.chat.completions.create(**kw, extra_body={
        "chat_template_kwargs": {"enable_thinking": False}, "reasoning_effort": "low"})
    assert r.choices[0].message.content


def test_truncate_prompt_tokens_keeps_the_last_ones(server):
    c = server.client()
    ids = [504, 3458, 314, 4649, 282, 8590, 314]
    kw = dict(model=MODEL_NAME, max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    cut = c.completions.create(prompt=ids, **{**kw, "extra_body": {
        "ignore_eos": True, "truncate_prompt_tokens": 3}})
    assert cut.usage.prompt_tokens == 3
    assert cut.choices[0].text == c.completions.create(prompt=ids[-3:], **kw).choices[0].text
    chat = c.chat.completions.create(model=MODEL_NAME, messages=HELLO, max_tokens=2,
                                     extra_body={"truncate_prompt_tokens": 4})
    assert chat.usage.prompt_tokens == 4
    with pytest.raises(openai.BadRequestError, match="truncate_prompt_tokens"):
        c.completions.create(prompt=ids, **{**kw, "extra_body": {"truncate_prompt_tokens": -2}})


def test_allowed_token_ids_and_bad_words_mask_the_tokens(server):
    c = server.client()
    ids = requests.post(server.url + "/tokenize", timeout=10,
                        json={"model": MODEL_NAME, "prompt": " blue",
                              "add_special_tokens": False}).json()["tokens"]
    assert len(ids) == 1, ids
    kw = dict(model=MODEL_NAME, prompt="List three colors:", max_tokens=3, temperature=0)
    only = c.completions.create(**kw, extra_body={"ignore_eos": True, "allowed_token_ids": ids})
    assert only.choices[0].text == " blue" * 3
    free = c.completions.create(**{**kw, "max_tokens": 24}).choices[0].text
    words = [w.strip(",.") for w in free.split() if w.strip(",.").isalpha()]
    assert words, free
    banned = words[0]
    masked = c.completions.create(**{**kw, "max_tokens": 24},
                                  extra_body={"bad_words": [banned]}).choices[0].text
    assert banned not in [w.strip(",.") for w in masked.split()], (banned, free, masked)
    assert masked != free
    with pytest.raises(openai.BadRequestError, match="allowed_token_ids"):
        c.completions.create(**kw, extra_body={"allowed_token_ids": []})


def test_return_tokens_as_token_ids_names_tokens_by_id(server):
    c = server.client()
    kw = dict(model=MODEL_NAME, prompt="The capital of France is", max_tokens=3, temperature=0,
              logprobs=2)
    by_text = c.completions.create(**kw).choices[0].logprobs
    by_id = c.completions.create(**kw, extra_body={"return_tokens_as_token_ids": True}) \
        .choices[0].logprobs
    assert len(by_id.tokens) == 3 and all(re.fullmatch(r"token_id:\d+", t) for t in by_id.tokens)
    assert by_id.token_logprobs == by_text.token_logprobs
    texts = requests.post(server.url + "/detokenize", timeout=10, json={
        "tokens": [int(t.split(":")[1]) for t in by_id.tokens]}).json()["prompt"]
    assert texts == "".join(by_text.tokens)
    chat = c.chat.completions.create(model=MODEL_NAME, messages=HELLO, max_tokens=2,
                                     temperature=0, logprobs=True, top_logprobs=1,
                                     extra_body={"return_tokens_as_token_ids": True})
    entry = chat.choices[0].logprobs.content[0]
    assert entry.token.startswith("token_id:") and entry.top_logprobs[0].token.startswith("token_id:")


def test_skip_special_tokens_false_shows_them(server):
    c = server.client()
    kw = dict(model=MODEL_NAME, messages=HELLO, max_tokens=40, temperature=0)
    shown = c.chat.completions.create(**kw, extra_body={"ignore_eos": True,
                                                        "skip_special_tokens": False})
    hidden = c.chat.completions.create(**kw, extra_body={"ignore_eos": True})
    # Past its end of turn the model writes ChatML's markers: text only when asked.
    assert "<|im_end|>" in shown.choices[0].message.content, shown
    assert "<|im_" not in hidden.choices[0].message.content, hidden
    r = c.chat.completions.create(**kw, extra_body={"spaces_between_special_tokens": False})
    assert r.choices[0].message.content


@pytest.mark.parametrize("stream", [False, True])
def test_chat_echo_opens_the_answer_with_the_continued_message(server, stream):
    c = server.client()
    start = [{"role": "user", "content": "Finish the sentence."},
             {"role": "assistant", "content": "The capital of France is"}]
    kw = dict(model=MODEL_NAME, messages=start, max_tokens=6, temperature=0, stream=stream)

    def content(extra):
        r = c.chat.completions.create(**kw, extra_body=extra)
        if not stream:
            return r.choices[0].message.content
        return "".join(ch.choices[0].delta.content or "" for ch in r if ch.choices)

    plain = content({"continue_final_message": True})
    echoed = content({"continue_final_message": True, "echo": True})
    assert echoed == "The capital of France is" + plain
    # After a user message there is nothing of the answer's role to echo.
    user_only = [{"role": "user", "content": "Say hello."}]
    r = c.chat.completions.create(model=MODEL_NAME, messages=user_only, max_tokens=4,
                                  temperature=0, extra_body={"echo": True})
    assert not r.choices[0].message.content.startswith("Say hello.")


def test_prompt_logprobs_score_every_prompt_token(server):
    ids = [504, 3458, 314, 4649, 282]
    body = {"model": MODEL_NAME, "prompt": ids, "max_tokens": 1, "temperature": 0,
            "prompt_logprobs": 2}
    r = requests.post(server.url + "/v1/completions", json=body, timeout=30).json()
    plp = r["choices"][0]["prompt_logprobs"]
    assert len(plp) == len(ids) and plp[0] is None, plp
    for tok, entry in zip(ids[1:], plp[1:]):
        mine = entry[str(tok)]
        assert mine["logprob"] <= 0 and mine["rank"] >= 1 and mine["decoded_token"]
        # The top 2 alternatives are ranks 1 and 2 (the token may be one).
        assert {1, 2} <= {e["rank"] for e in entry.values()}, entry
    # The same numbers as echo's prompt logprobs.
    echo = requests.post(server.url + "/v1/completions", timeout=30, json={
        **{k: v for k, v in body.items() if k != "prompt_logprobs"},
        "echo": True, "logprobs": 2}).json()["choices"][0]["logprobs"]["token_logprobs"]
    assert [round(e[str(t)]["logprob"], 4) for t, e in zip(ids[1:], plp[1:])] == \
        [round(x, 4) for x in echo[1:len(ids)]]
    chat = requests.post(server.url + "/v1/chat/completions", timeout=30, json={
        "model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
        "prompt_logprobs": 0}).json()
    assert chat["prompt_logprobs"][0] is None
    assert len(chat["prompt_logprobs"]) == chat["usage"]["prompt_tokens"]
    bad = requests.post(server.url + "/v1/completions", timeout=30,
                        json={**body, "stream": True})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt_logprobs"


def test_request_ids_reach_the_answer_and_the_status_lines(server):
    r = requests.post(server.url + "/v1/chat/completions", timeout=30,
                      headers={"X-Request-Id": "trace-7f3a"},
                      json={"model": MODEL_NAME, "messages": HELLO, "max_tokens": 2,
                            "request_id": "body-id"})
    assert r.json()["id"] == "chatcmpl-trace-7f3a"
    c = server.client()
    done = c.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=2,
                                extra_body={"request_id": "job-42"})
    assert done.id == "cmpl-job-42"
    lines = [l for l in server.log_text().splitlines() if "Prefill batch" in l]
    assert any("ids: chatcmpl-trace-7f3a" in l for l in lines), lines[-3:]
    assert any("ids: cmpl-job-42" in l for l in lines), lines[-3:]


def test_vllm_histogram_and_counter_names_count_what_ferrox_counts(server):
    server.client().chat.completions.create(model=MODEL_NAME, messages=HELLO, max_tokens=3)
    label = f'{{model_name="{MODEL_NAME}"}}'
    pairs = [("ferrox_time_to_first_token_seconds_count", f"vllm:time_to_first_token_seconds_count{label}"),
             ("ferrox_inter_token_latency_seconds_count", f"vllm:inter_token_latency_seconds_count{label}"),
             ("ferrox_inter_token_latency_seconds_count", f"vllm:time_per_output_token_seconds_count{label}"),
             ("ferrox_e2e_request_latency_seconds_count", f"vllm:e2e_request_latency_seconds_count{label}"),
             ("ferrox_prompt_tokens_total", f"vllm:prompt_tokens_total{label}"),
             ("ferrox_generation_tokens_total", f"vllm:generation_tokens_total{label}")]
    for ours, vllms in pairs:
        assert server.metric(vllms) == server.metric(ours) > 0, (ours, vllms)
