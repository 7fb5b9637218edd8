"""The API as real clients use it: the openai SDK's optional fields, content
parts, tool turns, n, echo and prompt logprobs, logit_bias, tokenize."""

import json

import openai
import pytest
import requests

from conftest import MODEL_NAME

HELLO = [{"role": "user", "content": "Say hello."}]


def greedy_chat(c, messages, **kw):
    return c.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=8,
                                     temperature=0, **kw)


def test_fields_that_change_nothing_are_accepted_and_change_nothing(server):
    c = server.client()
    plain = greedy_chat(c, HELLO)
    decorated = greedy_chat(c, HELLO, user="u-1", store=False, metadata={"team": "a"},
                            service_tier="auto", parallel_tool_calls=False,
                            extra_body={"prompt_cache_key": "k"})
    assert decorated.choices[0].message.content == plain.choices[0].message.content
    assert decorated.usage.prompt_tokens == plain.usage.prompt_tokens


def test_text_parts_are_the_same_prompt_as_a_string(server):
    c = server.client()
    plain = greedy_chat(c, HELLO)
    parts = greedy_chat(c, [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}])
    assert parts.choices[0].message.content == plain.choices[0].message.content
    assert parts.usage.prompt_tokens == plain.usage.prompt_tokens


def test_tool_turns_and_names_are_rendered_not_dropped(server):
    c = server.client()
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Oslo"})}}
    turns = [
        {"role": "user", "content": "Weather in Oslo?", "name": "ann"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    with_tools = greedy_chat(c, turns)
    only_user = greedy_chat(c, turns[:1])
    # SmolLM2's template renders the tool result's content: more prompt.
    assert with_tools.usage.prompt_tokens > only_user.usage.prompt_tokens + 5


def test_unsupported_parts_and_fields_are_400s_that_name_them(server):
    c = server.client()
    image = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]
    with pytest.raises(openai.BadRequestError) as e:
        greedy_chat(c, image)
    assert e.value.body["param"] == "messages[0].content[0]"
    assert "image_url" in e.value.body["message"]
    r = requests.post(server.url + "/v1/chat/completions",
                      json={"messages": HELLO, "guided_grammar": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "guided_grammar"


def test_n_choices_are_independent_and_seeded_per_choice(server):
    c = server.client()
    kw = dict(model=MODEL_NAME, prompt="Once upon a time", max_tokens=12, temperature=1.0,
              seed=11, n=3, extra_body={"ignore_eos": True})
    first = c.completions.create(**kw)
    assert [ch.index for ch in first.choices] == [0, 1, 2]
    texts = [ch.text for ch in first.choices]
    assert len(set(texts)) > 1, texts
    assert first.usage.completion_tokens == 36
    # Reproducible per choice, and choice i is the single request seeded 11 + i.
    assert [ch.text for ch in c.completions.create(**kw).choices] == texts
    single = c.completions.create(**{**kw, "n": 1, "seed": 12})
    assert single.choices[0].text == texts[1]
    # Streamed, the SDK sees the same three choices.
    streamed = ["", "", ""]
    for chunk in c.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            streamed[ch.index] += ch.text
    assert streamed == texts
    chat = c.chat.completions.create(model=MODEL_NAME, messages=HELLO, max_tokens=6, n=3,
                                     temperature=0)
    assert len({ch.message.content for ch in chat.choices}) == 1


def test_echo_with_logprobs_is_what_lm_eval_reads(server):
    """lm-eval's local-completions log-likelihood: echo + logprobs + max_tokens 1."""
    c = server.client()
    tok = requests.post(server.url + "/tokenize",
                        json={"model": MODEL_NAME, "prompt": "The capital of France is Paris"})
    ids = tok.json()["tokens"]
    ctx = requests.post(server.url + "/tokenize",
                        json={"model": MODEL_NAME, "prompt": "The capital of France is"})
    ctxlen = len(ctx.json()["tokens"])
    r = c.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=1, temperature=0,
                             echo=True, logprobs=1)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(ids) + 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(x <= 0 for x in lp.token_logprobs[1:])
    assert r.choices[0].text.startswith("The capital of France is Paris")
    paris = sum(lp.token_logprobs[ctxlen:-1])
    # The same continuation scored against a worse one.
    worse = c.completions.create(
        model=MODEL_NAME, prompt=ids[:ctxlen] + requests.post(
            server.url + "/tokenize", json={"prompt": " banana", "add_special_tokens": False}
        ).json()["tokens"], max_tokens=1, temperature=0, echo=True, logprobs=1)
    banana = sum(worse.choices[0].logprobs.token_logprobs[ctxlen:-1])
    assert paris > banana, (paris, banana)
    # Each prompt entry's alternatives include the token itself (lm-eval's
    # is_greedy compares against them).
    for tok_lp, top in zip(lp.token_logprobs[1:-1], lp.top_logprobs[1:-1]):
        assert max(top.values()) >= tok_lp


def test_a_batch_of_prompts_answers_each_prompt_as_alone(server):
    """OpenAI's prompt list (lm-eval's --batch_size N sends one): choice
    p * n + i is prompt p's choice i; usage counts each prompt once."""
    c = server.client()
    prompts = ["The capital of France is", "1, 2, 3,", "Once upon a time"]
    alone = [c.completions.create(model=MODEL_NAME, prompt=p, max_tokens=6, temperature=0)
             for p in prompts]
    batch = c.completions.create(model=MODEL_NAME, prompt=prompts, n=2, max_tokens=6,
                                 temperature=0)
    assert [ch.index for ch in batch.choices] == list(range(6))
    assert [ch.text for ch in batch.choices] == [a.choices[0].text for a in alone for _ in "ab"]
    assert batch.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert batch.usage.completion_tokens == 2 * sum(a.usage.completion_tokens for a in alone)
    # Streamed: the same texts per index, and the same usage.
    texts = [""] * 3
    usage = None
    for chunk in c.completions.create(model=MODEL_NAME, prompt=prompts, max_tokens=6,
                                      temperature=0, stream=True,
                                      stream_options={"include_usage": True}):
        for ch in chunk.choices:
            texts[ch.index] += ch.text
        usage = chunk.usage or usage
    assert texts == [a.choices[0].text for a in alone]
    assert usage.prompt_tokens == batch.usage.prompt_tokens
    # Token-id prompts echoed with logprobs, as lm-eval scores a batch.
    ids = [requests.post(server.url + "/tokenize", json={"prompt": p}).json()["tokens"]
           for p in prompts[:2]]
    one = [c.completions.create(model=MODEL_NAME, prompt=x, max_tokens=1, temperature=0,
                                echo=True, logprobs=1).choices[0] for x in ids]
    both = c.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=1, temperature=0,
                                echo=True, logprobs=1).choices
    assert [ch.text for ch in both] == [ch.text for ch in one]
    assert [ch.logprobs.token_logprobs for ch in both] == \
        [ch.logprobs.token_logprobs for ch in one]
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL_NAME, prompt=[], max_tokens=1)
    assert e.value.body["param"] == "prompt"


def test_logit_bias_forces_a_token(server):
    c = server.client()
    ids = requests.post(server.url + "/tokenize",
                        json={"prompt": " banana", "add_special_tokens": False}).json()["tokens"]
    r = c.completions.create(model=MODEL_NAME, prompt="The sky is", max_tokens=3,
                             temperature=0, logit_bias={str(ids[0]): 100})
    assert r.choices[0].text.startswith(" banana" if len(ids) == 1 else r.choices[0].text)
    detok = requests.post(server.url + "/detokenize", json={"tokens": [ids[0]] * 3}).json()
    assert r.choices[0].text == detok["prompt"]
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL_NAME, prompt="x", logit_bias={"1": 101})
    assert e.value.body["param"] == "logit_bias"
