"""OpenAI's Responses API (`POST /v1/responses`) through the openai SDK's
`client.responses`, against the real server and the default model: whole
and streamed, with a function tool and with a json_schema format."""

import json

import openai
import pytest

from conftest import MODEL_NAME

WEATHER = {"type": "function", "name": "get_weather",
           "description": "The current weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"], "additionalProperties": False},
           "strict": True}


def test_a_string_input_is_answered_as_chat_answers_it(server):
    c = server.client()
    r = c.responses.create(model=MODEL_NAME, input="Name three colors.", max_output_tokens=16,
                           temperature=0, instructions="Answer in one line.", store=False)
    chat = c.chat.completions.create(
        model=MODEL_NAME, max_tokens=16, temperature=0,
        messages=[{"role": "system", "content": "Answer in one line."},
                  {"role": "user", "content": "Name three colors."}])
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == chat.choices[0].message.content
    assert r.output[0].type == "message" and r.output[0].role == "assistant"
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    assert r.instructions == "Answer in one line." and r.max_output_tokens == 16


def test_streamed_events_rebuild_the_whole_answer(server):
    c = server.client()
    kw = dict(model=MODEL_NAME, input="Name three colors.", max_output_tokens=16, temperature=0)
    whole = c.responses.create(**kw)
    events = list(c.responses.create(**kw, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text
    done = [e for e in events if e.type == "response.output_text.done"]
    assert [d.text for d in done] == [whole.output_text]
    final = events[-1].response
    assert final.output_text == whole.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_function_call_and_its_output(server, stream):
    c = server.client()
    ask = [{"role": "user", "content": "What is the weather in Oslo?"}]
    kw = dict(model=MODEL_NAME, input=ask, tools=[WEATHER], max_output_tokens=64, temperature=0,
              tool_choice={"type": "function", "name": "get_weather"})
    if stream:
        events = list(c.responses.create(**kw, stream=True))
        added = [e.item for e in events if e.type == "response.output_item.added"]
        assert [i.type for i in added] == ["function_call"]
        args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        call = events[-1].response.output[-1]
        assert call.arguments == args
    else:
        r = c.responses.create(**kw)
        call = [o for o in r.output if o.type == "function_call"][0]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    assert isinstance(json.loads(call.arguments)["city"], str)
    # The call and its output go back as input items, as the Agents SDK sends them.
    follow = c.responses.create(
        model=MODEL_NAME, max_output_tokens=24, temperature=0, tools=[WEATHER],
        input=ask + [{"type": "function_call", "call_id": call.call_id, "name": call.name,
                      "arguments": call.arguments},
                     {"type": "function_call_output", "call_id": call.call_id,
                      "output": "sunny, 21 C"}])
    assert follow.output_text


def test_a_json_schema_format_holds(server):
    c = server.client()
    schema = {"type": "object", "properties": {"color": {"type": "string", "enum": ["red", "blue"]}},
              "required": ["color"], "additionalProperties": False}
    r = c.responses.create(model=MODEL_NAME, input="Pick a color.", max_output_tokens=32,
                           temperature=0,
                           text={"format": {"type": "json_schema", "name": "pick",
                                            "schema": schema, "strict": True}})
    assert json.loads(r.output_text)["color"] in ("red", "blue")
    assert r.text.format.type == "json_schema"


@pytest.mark.parametrize("extra,param", [
    ({"store": True}, "store"),
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"tools": [{"type": "web_search"}]}, None),
])
def test_what_is_not_served_is_a_clear_400(server, extra, param):
    c = server.client()
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=MODEL_NAME, input="Hi", max_output_tokens=4, **extra)
    if param:
        assert e.value.body["param"] == param, e.value.body


def test_the_openai_agents_sdk_runs_a_tool_loop(server):
    # The OpenAI Agents SDK (PyPI openai-agents) speaks the Responses API: a
    # forced call of our tool, its output sent back, then the final answer.
    import agents
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool

    agents.set_tracing_disabled(True)
    seen = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        seen.append(city)
        return f"sunny in {city}"

    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none")
    agent = Agent(name="weather", instructions="Answer briefly.", tools=[get_weather],
                  model=OpenAIResponsesModel(model=MODEL_NAME, openai_client=client),
                  model_settings=ModelSettings(tool_choice="required", temperature=0,
                                               max_tokens=48))
    result = Runner.run_sync(agent, "What is the weather in Oslo?", max_turns=4)
    assert len(seen) >= 1 and all(isinstance(c, str) and c for c in seen), seen
    assert isinstance(result.final_output, str) and result.final_output


def test_a_client_that_hangs_up_mid_stream_cancels_the_request(server):
    import time

    import requests

    body = {"model": MODEL_NAME, "input": "Write a long story about the sea.", "stream": True,
            "max_output_tokens": 400, "temperature": 0}
    aborted = 'ferrox_requests_finished_total{reason="abort"}'
    before = server.metric(aborted)
    with requests.post(server.url + "/v1/responses", json=body, stream=True, timeout=30) as r:
        lines = r.iter_lines()
        deltas = 0
        for line in lines:
            if line.startswith(b"data: ") and b"output_text.delta" in line:
                deltas += 1
                if deltas == 3:
                    break
    # Hung up after 3 of up to 400 tokens: the server cancels and frees the blocks.
    deadline = time.time() + 10
    while time.time() < deadline and (server.metric("ferrox_kv_blocks_used")
                                      or server.metric("ferrox_requests_running")):
        time.sleep(0.1)
    assert server.metric("ferrox_kv_blocks_used") == 0
    assert server.metric("ferrox_requests_running") == 0
    # Ended as a cancel, not by running to its limit.
    assert server.metric(aborted) == before + 1
