"""Reasoning read out of answers, through the openai SDK against the real
server: scripted tiny models (scripted_model.py) whose greedy output is a
fixed text, `<think>` blocks (SmolLM2's tokenizer, the tags spelled over
several tokens) and gpt-oss's harmony channels (its special tokens added),
whole and streamed: `reasoning_content` apart from `content`,
`include_reasoning: false`, the reasoning token count, harmony's tool calls,
its end tokens, and the Responses API's reasoning item."""

import json
import pathlib

import pytest
import requests

import scripted_model
from conftest import MODEL_NAME, Server

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The tokenizer comes from the default model's GGUF (scripts/test fetches it).
SMOLLM2 = str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
HARMONY_TEMPLATE = ROOT / "server" / "prompt" / "testdata" / "templates" / "gpt-oss" / "chat_template.jinja"
HARMONY_TOKENS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
                  "<|return|>", "<|call|>"]
FLAGS = ("--kv-blocks", "64", "--max-seqs", "4", "--max-model-len", "1024")
ASK = [{"role": "user", "content": "Pick a colour."}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


class Script:
    """A chain of token ids built piece by piece, and which of them are reasoning's."""

    def __init__(self, vocab):
        self.vocab, self.ids, self.reasoning = vocab, [], 0

    def text(self, s, reasoning=False, until=None):
        """`s` spelled; its tokens are reasoning's if `reasoning`, or those
        that start before the end of the tag `until` (which closes it)."""
        ids = self.vocab.spell(s)
        self.ids += ids
        if reasoning:
            self.reasoning += len(ids)
        elif until is not None:
            end, at = len(s[:s.index(until) + len(until)].encode()), 0
            for i in ids:
                self.reasoning += at < end
                at += len(self.vocab.tokens[i])  # one character per byte
        return self

    def special(self, token, reasoning=False):
        self.ids += self.vocab.special(token)
        self.reasoning += 1 if reasoning else 0
        return self


def think_model(dir: pathlib.Path):
    vocab = scripted_model.Vocab(SMOLLM2, [])
    # `<think>` and `</think>` are no tokens of SmolLM2's: several each. Text
    # follows `</think>` at once (SmolLM2 has `>"` but no second `>`).
    s = (Script(vocab).text("<think>The user wants a colour.", reasoning=True)
         .text('</think>"Blue" is my pick!', until="</think>")
         .special("<|im_end|>").text(" Oops"))
    # SmolLM2's template with Qwen3's `<think>` clause: auto picks `<think>`.
    template = vocab.meta["tokenizer.chat_template"][1] + \
        "{%- if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{%- endif %}"
    return scripted_model.write(dir / "think.gguf", vocab, s.ids, template), s


def opened_model(dir: pathlib.Path):
    """DeepSeek-R1's way: the template opens `<think>` for the model, which
    writes only the reasoning and `</think>`."""
    vocab = scripted_model.Vocab(SMOLLM2, [])
    s = (Script(vocab).text("The user wants a colour.", reasoning=True)
         .text('</think>"Blue" is my pick!', until="</think>").special("<|im_end|>"))
    template = vocab.meta["tokenizer.chat_template"][1].replace(
        "{{ '<|im_start|>assistant\n' }}", "{{ '<|im_start|>assistant\n<think>\n' }}")
    assert template.endswith("<think>\n' }}{% endif %}"), template[-80:]
    return scripted_model.write(dir / "opened.gguf", vocab, s.ids, template), s


def harmony_model(dir: pathlib.Path, call: bool):
    vocab = scripted_model.Vocab(SMOLLM2, HARMONY_TOKENS)
    s = Script(vocab).special("<|channel|>", True).text("analysis", True).special("<|message|>", True)
    # The reasoning's first token (in no prompt) flags the second header:
    # `<|channel|>` and `<|message|>` come twice.
    flag = len(s.ids)
    s.text("Hmm, need the weather" if call else "Hmm, the user asks for a colour", True)
    s.special("<|end|>", True).special("<|start|>").text("assistant").special("<|channel|>")
    if call:
        s.text("commentary to=functions.get_weather ").special("<|constrain|>").text("json")
        s.special("<|message|>").text('{"city": "Oslo"}').special("<|call|>")
    else:
        s.text("final").special("<|message|>").text("Blue is best!").special("<|return|>")
    s.text(" Oops")
    name = "call.gguf" if call else "harmony.gguf"
    return scripted_model.write(dir / name, vocab, s.ids, HARMONY_TEMPLATE.read_text(), flag), s


@pytest.fixture(scope="module")
def think(tmp_path_factory):
    path, script = think_model(tmp_path_factory.mktemp("think"))
    s = Server(*FLAGS, model=str(path))
    yield s, script
    s.close()


@pytest.fixture(scope="module")
def harmony(tmp_path_factory):
    dir = tmp_path_factory.mktemp("harmony")
    (plain, script), (call, call_script) = harmony_model(dir, False), harmony_model(dir, True)
    servers = Server(*FLAGS, model=str(plain)), Server(*FLAGS, model=str(call))
    yield (servers[0], script), (servers[1], call_script)
    for s in servers:
        s.close()


def chat(server, stream=False, **kw):
    return server.client().chat.completions.create(
        model=MODEL_NAME, messages=kw.pop("messages", ASK), temperature=0,
        max_tokens=kw.pop("max_tokens", 60),
        stream=stream, **({"stream_options": {"include_usage": True}} if stream else {}), **kw)


def streamed(server, **kw):
    """The stream folded: reasoning, content, calls, finish reason, usage, and
    the order of the delta kinds."""
    reasoning, content, calls, order, finish, usage = "", "", {}, [], None, None
    for chunk in chat(server, stream=True, **kw):
        usage = chunk.usage or usage
        for c in chunk.choices:
            d = c.delta
            finish = c.finish_reason or finish
            if getattr(d, "reasoning_content", None):
                reasoning += d.reasoning_content
                order.append("reasoning")
            if d.content:
                content += d.content
                order.append("content")
            for t in d.tool_calls or []:
                entry = calls.setdefault(t.index, {"name": "", "arguments": ""})
                entry["name"] += t.function.name or ""
                entry["arguments"] += t.function.arguments or ""
                order.append("call")
    return reasoning, content, calls, order, finish, usage


def test_think_blocks_split_whole_and_streamed(think):
    server, script = think
    r = chat(server)
    m = r.choices[0].message
    assert (m.reasoning_content, m.content) == ("The user wants a colour.", '"Blue" is my pick!')
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens_details.reasoning_tokens == script.reasoning
    reasoning, content, _, order, finish, usage = streamed(server)
    assert (reasoning, content, finish) == (m.reasoning_content, m.content, "stop")
    assert len(order) > 4 and order == sorted(order, key=lambda k: k != "reasoning"), order
    assert usage.completion_tokens_details.reasoning_tokens == script.reasoning


def test_a_block_the_template_opens_is_read_from_the_prompt(tmp_path):
    path, script = opened_model(tmp_path)
    server = Server(*FLAGS, model=str(path))
    try:
        r = chat(server)
        m = r.choices[0].message
        assert (m.reasoning_content, m.content) == ("The user wants a colour.", '"Blue" is my pick!')
        assert r.usage.completion_tokens_details.reasoning_tokens == script.reasoning
        reasoning, content, *_ = streamed(server)
        assert (reasoning, content) == (m.reasoning_content, m.content)
    finally:
        server.close()


def test_include_reasoning_false_drops_it(think):
    server, script = think
    r = chat(server, extra_body={"include_reasoning": False})
    m = r.choices[0].message
    assert getattr(m, "reasoning_content", None) is None
    assert m.content == '"Blue" is my pick!'
    # Still counted: the tokens were generated.
    assert r.usage.completion_tokens_details.reasoning_tokens == script.reasoning
    reasoning, content, _, order, _, _ = streamed(server, extra_body={"include_reasoning": False})
    assert (reasoning, content) == ("", m.content) and "reasoning" not in order


def test_a_structured_output_holds_the_whole_answer(think):
    # The grammar applies from the first token (docs/api.md): no `<think>`
    # can open, so the answer is all content and no token is reasoning.
    r = chat(think[0], response_format={"type": "json_object"}, max_tokens=8)
    m = r.choices[0].message
    assert getattr(m, "reasoning_content", None) is None
    assert "<think" not in (m.content or "")
    assert r.usage.completion_tokens_details.reasoning_tokens == 0


def test_harmony_channels_split_whole_and_streamed(harmony):
    (server, script), _ = harmony
    r = chat(server)
    m = r.choices[0].message
    # `<|return|>` ends the answer (the model would go on with " Oops").
    assert (m.reasoning_content, m.content) == ("Hmm, the user asks for a colour", "Blue is best!")
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens_details.reasoning_tokens == script.reasoning
    reasoning, content, _, order, finish, usage = streamed(server)
    assert (reasoning, content, finish) == (m.reasoning_content, m.content, "stop")
    assert usage.completion_tokens_details.reasoning_tokens == script.reasoning
    r = chat(server, extra_body={"include_reasoning": False})
    assert getattr(r.choices[0].message, "reasoning_content", None) is None
    assert r.choices[0].message.content == "Blue is best!"


def test_harmony_calls_become_tool_calls(harmony):
    _, (server, script) = harmony
    r = chat(server, tools=[WEATHER])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.reasoning_content == "Hmm, need the weather"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    reasoning, content, calls, order, finish, usage = streamed(server, tools=[WEATHER])
    assert (reasoning, content, finish) == ("Hmm, need the weather", "", "tool_calls")
    assert calls == {0: {"name": "get_weather", "arguments": call.function.arguments}}
    assert usage.completion_tokens_details.reasoning_tokens == script.reasoning
    # The call and its result go back through gpt-oss's template.
    follow = ASK + [choice.message.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    again = chat(server, messages=follow, tools=[WEATHER])
    assert again.choices[0].message.tool_calls
    # Sent back, the call's reasoning reaches the template (as `thinking`):
    # gpt-oss's renders it as the analysis before the call.
    def count(messages):
        r = requests.post(server.url + "/tokenize", json={
            "model": MODEL_NAME, "messages": messages, "tools": [WEATHER]}, timeout=10)
        r.raise_for_status()
        return r.json()["count"]
    bare = [dict(m) for m in follow]
    bare[1].pop("reasoning_content")
    assert count(follow) > count(bare) + 5


def test_the_responses_api_has_a_reasoning_item(harmony):
    (server, script), _ = harmony
    r = server.client().responses.create(model=MODEL_NAME, input="Pick a colour.", temperature=0)
    kinds = [item.type for item in r.output]
    assert kinds == ["reasoning", "message"], kinds
    assert r.output[0].content[0].text == "Hmm, the user asks for a colour"
    assert r.output_text == "Blue is best!"
    assert r.usage.output_tokens_details.reasoning_tokens == script.reasoning
    events = list(server.client().responses.create(
        model=MODEL_NAME, input="Pick a colour.", temperature=0, stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas == "Hmm, the user asks for a colour"
    done = events[-1].response
    assert [item.type for item in done.output] == kinds


def test_reasoning_answers_validate_against_the_api_description(harmony):
    from test_openapi import check
    _, (server, _) = harmony
    doc = requests.get(server.url + "/openapi.json", timeout=10).json()
    schema = lambda name: {"$ref": f"#/components/schemas/{name}"}
    body = {"model": MODEL_NAME, "messages": ASK, "tools": [WEATHER], "temperature": 0}
    whole = requests.post(server.url + "/v1/chat/completions", json=body, timeout=30).json()
    assert whole["choices"][0]["message"]["reasoning_content"]
    check(doc, schema("ChatCompletionResponse"), whole)
    r = requests.post(server.url + "/v1/chat/completions", timeout=30, json={
        **body, "stream": True, "stream_options": {"include_usage": True}})
    events = [line[len("data: "):] for line in r.text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and any("reasoning_content" in e for e in events)
    for data in events[:-1]:
        check(doc, schema("ChatCompletionChunk"), json.loads(data))
    response = requests.post(server.url + "/v1/responses", timeout=30, json={
        "model": MODEL_NAME, "input": "Pick a colour.", "tools": [
            # gpt-oss's template needs a description (as in transformers).
            {"type": "function", "name": "get_weather", "description": "Weather in a city",
             "parameters": WEATHER["function"]["parameters"]}],
    }).json()
    assert "output" in response, response
    assert [item["type"] for item in response["output"]] == ["reasoning", "function_call"]
    check(doc, schema("ResponseObject"), response)
