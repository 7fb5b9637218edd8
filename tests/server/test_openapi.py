"""/openapi.json against the real server: the document is valid OpenAPI 3.1,
and a real request and response of every route validate against the
schemas of its operation (streamed events against the chunk schemas)."""

import json

import pytest
import requests
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate

from conftest import MODEL_NAME
from test_tool_calls import REPEAT, WEATHER

CHAT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0}

# (method, path, JSON body or None, expected status, chunk schema of a stream)
CASES = [
    ("POST", "/v1/completions", {"model": MODEL_NAME, "prompt": "The sky is", "max_tokens": 4,
                                 "temperature": 0, "n": 2, "stop": ["\n"]}, 200, None),
    ("POST", "/v1/completions", {"prompt": "The sky is", "max_tokens": 1, "echo": True,
                                 "logprobs": 1, "temperature": 0}, 200, None),
    ("POST", "/v1/completions", {"prompt": [504, 3658], "max_tokens": 3, "stream": True,
                                 "stream_options": {"include_usage": True}}, 200, "CompletionChunk"),
    ("POST", "/v1/completions", {"prompt": "x", "n": 0}, 400, None),
    ("POST", "/v1/completions", {"prompt": "x", "model": "other"}, 404, None),
    ("POST", "/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 2}, 200, None),
    ("POST", "/v1/chat/completions", {**CHAT, "stream": True, "n": 2, "seed": 1,
                                      "stream_options": {"include_usage": True}},
     200, "ChatCompletionChunk"),
    ("POST", "/v1/chat/completions", {"messages": []}, 400, None),
    # Answers that call a tool, whole and streamed (see test_tool_calls.py).
    ("POST", "/v1/chat/completions", {"messages": REPEAT, "tools": [WEATHER], "max_tokens": 60,
                                      "temperature": 0}, 200, None),
    ("POST", "/v1/chat/completions", {"messages": REPEAT, "tools": [WEATHER], "max_tokens": 60,
                                      "temperature": 0, "stream": True}, 200,
     "ChatCompletionChunk"),
    ("POST", "/v1/responses", {"model": MODEL_NAME, "input": "Say hi.", "max_output_tokens": 4,
                               "temperature": 0, "instructions": "Be brief."}, 200, None),
    ("POST", "/v1/responses", {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "Pick one."}]}], "max_output_tokens": 24,
        "text": {"format": {"type": "json_schema", "name": "p", "schema": {
            "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}},
     200, None),
    ("POST", "/v1/responses", {"input": "Hi", "store": True}, 400, None),
    # A generating model refuses the pooling routes, naming what it serves
    # (test_embeddings.py and test_rerank.py run them on pooling models).
    ("POST", "/v1/embeddings", {"input": "hi"}, 400, None),
    ("POST", "/v1/rerank", {"query": "a", "documents": ["b"]}, 400, None),
    ("POST", "/rerank", {"query": "a", "documents": [{"text": "b"}]}, 400, None),
    ("POST", "/score", {"text_1": "a", "text_2": ["b", "c"]}, 400, None),
    ("GET", "/v1/models", None, 200, None),
    # A server without LoRA refuses vLLM's run-time adapter routes (test_lora.py runs them).
    ("POST", "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/nowhere"}, 400, None),
    ("POST", "/v1/unload_lora_adapter", {"lora_name": "x"}, 400, None),
    ("POST", "/tokenize", {"prompt": "Hello world", "return_token_strs": True}, 200, None),
    ("POST", "/tokenize", {"messages": CHAT["messages"], "add_generation_prompt": True}, 200, None),
    ("POST", "/detokenize", {"tokens": [19556, 905]}, 200, None),
    ("GET", "/tokenizer_info", None, 200, None),
    ("GET", "/prefix_spec", None, 200, None),
    ("GET", "/kv_events", None, 200, None),
    ("GET", "/health", None, 200, None),
    ("GET", "/ready", None, 200, None),
    ("GET", "/metrics", None, 200, None),
    ("GET", "/openapi.json", None, 200, None),
]


@pytest.fixture(scope="module")
def doc(server):
    r = requests.get(server.url + "/openapi.json", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    return r.json()


def check(doc: dict, schema: dict, instance) -> None:
    """Validates `instance` against `schema`, whose refs point into `doc`."""
    rooted = {**schema, "components": doc["components"]}
    errors = sorted(OAS31Validator(rooted).iter_errors(instance), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors[:5])


def media(content: dict, content_type: str) -> dict:
    """The media type entry that the response's Content-Type is."""
    base = content_type.split(";")[0].strip()
    for name, entry in content.items():
        if name.split(";")[0].strip() == base:
            return entry
    raise AssertionError(f"{content_type} is not among {list(content)}")


def response_spec(op: dict, status: int) -> dict:
    """The operation's response for `status`, exact or by range."""
    responses = op["responses"]
    return responses.get(str(status)) or responses[f"{status // 100}XX"]


def test_the_document_is_valid_openapi_3_1(doc):
    assert doc["openapi"] == "3.1.0"
    validate(doc)
    # Without keys there is no security scheme to send.
    assert "securitySchemes" not in doc.get("components", {})


def test_every_route_in_the_document_is_exercised_here(doc):
    documented = {(m.upper(), p) for p, item in doc["paths"].items() for m in item}
    exercised = {(m, p) for m, p, *_ in CASES}
    assert documented == exercised


@pytest.mark.parametrize("method,path,body,status,chunk", CASES,
                         ids=[f"{c[0]} {c[1]} {c[3]}" for c in CASES])
def test_real_requests_and_responses_validate(server, doc, method, path, body, status, chunk):
    op = doc["paths"][path][method.lower()]
    if body is not None:
        check(doc, op["requestBody"]["content"]["application/json"]["schema"], body)
    r = requests.request(method, server.url + path, json=body, timeout=60)
    assert r.status_code == status, r.text
    spec = response_spec(op, status)
    entry = media(spec["content"], r.headers["content-type"])
    if r.headers["content-type"].startswith("application/json"):
        check(doc, entry["schema"], r.json())
        return
    check(doc, entry["schema"], r.text)
    if chunk is None:
        assert not r.headers["content-type"].startswith("text/event-stream")
        return
    assert f"`{chunk}`" in spec["description"]
    events = [line[len("data: "):] for line in r.text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and len(events) > 2, r.text
    for data in events[:-1]:
        check(doc, {"$ref": f"#/components/schemas/{chunk}"}, json.loads(data))


def test_with_keys_the_document_is_public_and_names_the_bearer_scheme(start_server):
    s = start_server("--api-key", "sk-openapi", "--kv-blocks", "64", "--max-model-len", "1024")
    r = requests.get(s.url + "/openapi.json", timeout=10)
    assert r.status_code == 200
    doc = r.json()
    validate(doc)
    assert doc["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    for path, item in doc["paths"].items():
        for method, op in item.items():
            unauthenticated = requests.request(method.upper(), s.url + path, json={}, timeout=10)
            assert (unauthenticated.status_code == 401) == ("security" in op), (method, path)
            if "security" in op:
                spec = response_spec(op, 401)["content"]["application/json"]["schema"]
                check(doc, spec, unauthenticated.json())
