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
