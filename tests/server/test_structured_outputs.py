"""Structured outputs against the real server and the default 135M model:
the output parses and validates, streamed or not, through the openai SDK
and LangChain; what cannot compile is a 400 naming response_format."""

import json
import re

import jsonschema
import openai
import pydantic
import pytest

from conftest import MODEL_NAME

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
    },
    "required": ["name", "age", "color", "tags"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe a person called Ann as JSON."}]


def schema_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_output_validates(server, temperature):
    r = server.client().chat.completions.create(
        model=MODEL_NAME, messages=ASK, max_tokens=200, temperature=temperature, seed=3,
        response_format=schema_format(PERSON))
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice
    jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_json_object_output_parses_and_n_choices_each_do(server):
    r = server.client().chat.completions.create(
        model=MODEL_NAME, messages=ASK, max_tokens=120, temperature=1.0, seed=5, n=3,
        response_format={"type": "json_object"})
    assert len(r.choices) == 3
    for c in r.choices:
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.message.content), dict), c.message.content
        else:
            assert c.finish_reason == "length" and c.message.content.startswith("{")


def test_streamed_output_is_the_same_and_validates(server):
    kw = dict(model=MODEL_NAME, messages=ASK, max_tokens=200, temperature=0,
              response_format=schema_format(PERSON))
    whole = server.client().chat.completions.create(**kw).choices[0].message.content
    chunks = server.client().chat.completions.create(stream=True, **kw)
    text, reasons = "", []
    for ch in chunks:
        if ch.choices:
            text += ch.choices[0].delta.content or ""
            reasons.append(ch.choices[0].finish_reason)
    assert text == whole
    assert reasons[-1] == "stop"
    jsonschema.validate(json.loads(text), PERSON)


def test_completions_take_response_format_and_vllm_guided_json(server):
    c = server.client()
    for extra in ({"response_format": schema_format(PERSON)}, {"guided_json": PERSON}):
        r = c.completions.create(model=MODEL_NAME, prompt="A person as JSON:", max_tokens=200,
                                 temperature=0, extra_body=extra)
        assert r.choices[0].finish_reason == "stop", extra
        jsonschema.validate(json.loads(r.choices[0].text), PERSON)


DATE = r"20[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9])"
# Regex metacharacters in a choice are literal text.
CHOICES = ["positive", "negative", "neutral (n/a)"]


@pytest.mark.parametrize("extra", [
    {"guided_regex": DATE}, {"structured_outputs": {"regex": DATE}}])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_regex_output_matches_whole_on_both_endpoints(server, extra, temperature):
    c = server.client()
    chat = c.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "When did it happen?"}],
        max_tokens=30, temperature=temperature, seed=11, extra_body=extra)
    text = c.completions.create(
        model=MODEL_NAME, prompt="The date was", max_tokens=30, temperature=temperature,
        seed=11, extra_body=extra).choices[0]
    for choice, out in ((chat.choices[0], chat.choices[0].message.content), (text, text.text)):
        assert choice.finish_reason == "stop", choice
        assert re.fullmatch(DATE, out), out


@pytest.mark.parametrize("extra", [
    {"guided_choice": CHOICES}, {"structured_outputs": {"choice": CHOICES}}])
def test_choice_output_is_exactly_one_choice_streamed_or_not(server, extra):
    kw = dict(model=MODEL_NAME, max_tokens=20, temperature=1.0, seed=2, n=4, extra_body=extra,
              messages=[{"role": "user", "content": "Is 'I love it' positive or negative?"}])
    whole = server.client().chat.completions.create(**kw)
    texts = [ch.message.content for ch in whole.choices]
    assert all(t in CHOICES for t in texts), texts
    streamed = [""] * 4
    for ch in server.client().chat.completions.create(stream=True, **kw):
        for c in ch.choices:
            streamed[c.index] += c.delta.content or ""
    assert streamed == texts


@pytest.mark.parametrize("extra, param", [
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"guided_regex": "a", "guided_json": {"type": "object"}}, "guided_regex"),
])
def test_a_bad_regex_or_choice_is_a_400_naming_its_field(server, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        server.client().completions.create(
            model=MODEL_NAME, prompt="x", max_tokens=5, extra_body=extra)
    assert e.value.body["param"] == param, e.value.body


def test_max_tokens_cuts_with_length(server):
    r = server.client().chat.completions.create(
        model=MODEL_NAME, messages=ASK, max_tokens=3, temperature=0,
        response_format=schema_format(PERSON))
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3


@pytest.mark.parametrize("fmt", [
    schema_format({"type": "string", "pattern": "(unclosed"}),
    schema_format({"type": "frobnicate"}),
    {"type": "json_schema", "json_schema": {"name": "x"}},
    {"type": "xml"},
])
def test_what_cannot_compile_is_a_400_naming_response_format(server, fmt):
    with pytest.raises(openai.BadRequestError) as e:
        server.client().chat.completions.create(
            model=MODEL_NAME, messages=ASK, max_tokens=5, response_format=fmt)
    assert e.value.body["param"] == "response_format", e.value.body
    # The server is fine afterwards.
    ok = server.client().chat.completions.create(
        model=MODEL_NAME, messages=ASK, max_tokens=2)
    assert ok.choices[0].finish_reason == "length"


class Pet(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=30)
    kind: str = pydantic.Field(pattern="^(cat|dog|fish)$")
    age: int = pydantic.Field(ge=0, le=30)


def test_langchain_with_structured_output(server):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=server.url + "/v1", api_key="none", model=MODEL_NAME,
                     temperature=0, max_tokens=100, max_retries=0)
    pet = llm.with_structured_output(Pet, method="json_schema").invoke(
        "Invent a pet and describe it.")
    assert isinstance(pet, Pet)
    assert pet.kind in ("cat", "dog", "fish")
