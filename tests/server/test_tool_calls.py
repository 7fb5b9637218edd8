"""Tool calling against the real server and the default 135M model, with the
openai SDK and LangChain: calls read out of the answer whole and streamed,
tool-result turns, forced choices held to the tool's schema by the grammar
engine, and the refusals."""

import json

import jsonschema
import openai
import pytest
import requests

from conftest import MODEL_NAME

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
# Greedy, the 135M model copies this back, Hermes markup and all: a real
# answer that calls a tool without any constraint.
REPEAT = [{"role": "user", "content": f"Repeat exactly, nothing else: {CALL}"}]


def chat(c, messages, **kw):
    return c.chat.completions.create(model=MODEL_NAME, messages=messages, temperature=0,
                                     max_tokens=kw.pop("max_tokens", 60), **kw)


def test_an_auto_answer_that_calls_comes_back_as_tool_calls(server):
    r = chat(server.client(), REPEAT, tools=[WEATHER])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert call.id.startswith("call_") and len(call.id) == 29
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    # Without tools (or with tool_choice "none") the same output is text.
    plain = chat(server.client(), REPEAT, tools=[WEATHER], tool_choice="none")
    assert plain.choices[0].message.tool_calls is None


def test_streamed_calls_reassemble_like_openai(server):
    c = server.client()
    whole = chat(c, REPEAT, tools=[WEATHER]).choices[0].message.tool_calls[0]
    chunks = list(chat(c, REPEAT, tools=[WEATHER], stream=True))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    calls = [d.tool_calls[0] for d in deltas if d.tool_calls]
    first = calls[0]
    assert (first.index, first.type) == (0, "function") and first.id.startswith("call_")
    assert first.function.name == "get_weather" and first.function.arguments == ""
    assert len(calls) > 2, "arguments arrive in pieces"
    assert all(t.id is None and t.function.name is None for t in calls[1:])
    assert "".join(t.function.arguments for t in calls) == whole.function.arguments
    text = "".join(d.content or "" for d in deltas)
    assert "tool_call" not in text and "get_weather" not in text, text
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # The SDK's own stream helper puts the same call together.
    with c.chat.completions.stream(model=MODEL_NAME, messages=REPEAT, tools=[WEATHER],
                                   temperature=0, max_tokens=60) as stream:
        final = stream.get_final_completion()
    [call] = final.choices[0].message.tool_calls
    assert call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}


def test_a_tool_result_turn_is_rendered_and_answered(server):
    c = server.client()
    first = chat(c, REPEAT, tools=[WEATHER]).choices[0].message
    call = first.tool_calls[0]
    turns = REPEAT + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    answer = chat(c, turns, tools=[WEATHER], max_tokens=24)
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.usage.prompt_tokens > chat(c, REPEAT, tools=[WEATHER]).usage.prompt_tokens
    # The tool's result is in the prompt the model answered.
    tokens = requests.post(server.url + "/tokenize", json={
        "model": MODEL_NAME, "messages": turns, "tools": [WEATHER]}).json()
    text = requests.post(server.url + "/detokenize", json={
        "model": MODEL_NAME, "tokens": tokens["tokens"]}).json()["prompt"]
    assert "sunny, 21 C" in text


@pytest.mark.parametrize("tools, choice, param", [
    ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
    ([{"type": "retrieval"}], "auto", "tools[0].type"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}], "auto",
     "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "has space"}}], "auto",
     "tools[0].function.name"),
    ([WEATHER], "sometimes", "tool_choice"),
    ([], "required", "tool_choice"),
])
def test_bad_tools_are_400s_that_name_the_field(server, tools, choice, param):
    with pytest.raises(openai.BadRequestError) as e:
        chat(server.client(), REPEAT, tools=tools, tool_choice=choice)
    assert e.value.body["param"] == param, e.value.body


def test_one_call_when_parallel_calls_are_off(server):
    two = [{"role": "user", "content": f"Repeat exactly, nothing else: {CALL}\n{CALL}"}]
    c = server.client()
    both = chat(c, two, tools=[WEATHER], max_tokens=80).choices[0].message.tool_calls
    one = chat(c, two, tools=[WEATHER], max_tokens=80, parallel_tool_calls=False)
    assert len(both) == 2
    assert len(one.choices[0].message.tool_calls) == 1


def test_tool_calling_off_refuses_calls_but_renders_tools(start_server):
    s = start_server("--kv-blocks", "128", "--max-model-len", "1024", "--tool-call-parser", "none")
    with pytest.raises(openai.BadRequestError) as e:
        chat(s.client(), REPEAT, tools=[WEATHER])
    assert e.value.body["param"] == "tool_choice"
    assert "--tool-call-parser none" in e.value.body["message"]
    plain = chat(s.client(), REPEAT, tools=[WEATHER], tool_choice="none")
    assert plain.choices[0].message.tool_calls is None


def test_langchain_bind_tools(server):
    from langchain_core.messages import HumanMessage
    from langchain_openai import ChatOpenAI

    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return "sunny"

    llm = ChatOpenAI(model=MODEL_NAME, base_url=server.url + "/v1", api_key="none",
                     temperature=0, max_tokens=60)
    msg = llm.bind_tools([get_weather]).invoke([HumanMessage(REPEAT[0]["content"])])
    assert [(t["name"], t["args"]) for t in msg.tool_calls] == [("get_weather", {"city": "Oslo"})]
    assert msg.tool_calls[0]["id"].startswith("call_")

TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The current time in a time zone",
    "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "enum": ["UTC", "CET", "PST"]},
        "hour24": {"type": "boolean"}}, "required": ["zone", "hour24"]}}}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


def strict(tool):
    """The tool as OpenAI's strict function definitions have it: no properties
    beyond the schema's. (Given room, the 135M model keeps adding properties
    until max_tokens; the grammar then holds it to the ones named.)"""
    f = tool["function"]
    return {"type": "function", "function": {
        **f, "parameters": {**f["parameters"], "additionalProperties": False}}}


@pytest.mark.parametrize("choice, want", [
    ("required", None),
    ({"type": "function", "function": {"name": "get_time"}}, "get_time"),
])
def test_a_forced_choice_is_a_call_whose_arguments_validate(server, choice, want):
    both = [strict(WEATHER), strict(TIME)]
    r = chat(server.client(), ASK, tools=both, tool_choice=choice, max_tokens=80)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    [call] = c.message.tool_calls
    tools = {t["function"]["name"]: t for t in both}
    assert call.function.name in tools and (want is None or call.function.name == want)
    jsonschema.validate(json.loads(call.function.arguments),
                        tools[call.function.name]["function"]["parameters"])


def test_a_forced_call_streams_and_the_sdk_reassembles_it(server):
    with server.client().chat.completions.stream(
            model=MODEL_NAME, messages=ASK, tools=[WEATHER], tool_choice="required",
            temperature=0, max_tokens=80) as stream:
        final = stream.get_final_completion()
    [call] = final.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    assert final.choices[0].finish_reason == "tool_calls"


def test_a_forced_choice_with_response_format_is_refused(server):
    with pytest.raises(openai.BadRequestError) as e:
        chat(server.client(), ASK, tools=[WEATHER], tool_choice="required",
             response_format={"type": "json_object"})
    assert e.value.body["param"] == "tool_choice"


def test_langchain_bind_tools_with_a_forced_choice(server):
    from langchain_core.messages import HumanMessage
    from langchain_openai import ChatOpenAI

    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return "sunny"

    llm = ChatOpenAI(model=MODEL_NAME, base_url=server.url + "/v1", api_key="none",
                     temperature=0, max_tokens=80)
    msg = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(
        [HumanMessage("What is the weather like in Paris today?")])
    [call] = msg.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)
