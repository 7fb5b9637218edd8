"""The embedding fixtures (server/models/testdata/embeddings, written by
sentence-transformers) served by the real binary and read through the openai
SDK's `client.embeddings.create`: floats, base64 (the SDK's default, and
asked for), Matryoshka `dimensions`, a batch of mixed lengths against each
text alone, vLLM's `truncate_prompt_tokens` and `normalize`, TEI's
`prompt_name` (EmbeddingGemma's prompts), 2,048 texts in one request within
the plan's memory, and the bad inputs that are each a
400 with its reason while the server goes on."""

import base64
import json
import math
import pathlib
import re
import struct
import threading
import time
import subprocess

import openai
import pytest
import requests

from conftest import MODEL_NAME, Server, model_path, server_bin

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "server" / "models" / "testdata" / "embeddings"
# Each fixture's folder (its safetensors), and BERT's, XLM-RoBERTa's,
# NomicBERT's, ModernBERT's and EmbeddingGemma's GGUF (llama.cpp's
# converter's), checked against the same reference.
NAMES = ["bert", "bert/model.gguf", "bert_mean", "qwen3_embed", "xlmr", "xlmr/model.gguf",
         "nomic", "nomic/model.gguf", "modernbert", "modernbert/model.gguf", "embeddinggemma",
         "embeddinggemma/model.gguf"]
# The accuracy bar, float32.
COSINE, ELEMENT = 0.99999, 1e-4


def reference(name: str) -> dict:
    folder = name.split("/")[0]
    return json.loads((FIXTURES / folder / "reference.json").read_text())


def close(got: list, want: list) -> tuple:
    dot = sum(a * b for a, b in zip(got, want))
    norm = math.sqrt(sum(a * a for a in got)) * math.sqrt(sum(b * b for b in want))
    return dot / norm, max(abs(a - b) for a, b in zip(got, want))


def assert_close(what: str, got: list, want: list) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} values, want {len(want)}"
    cos, worst = close(got, want)
    assert cos >= COSINE and worst <= ELEMENT, f"{what}: cosine {cos}, worst {worst}"


@pytest.fixture(scope="module", params=NAMES)
def served(request):
    s = Server("--max-batch-tokens", "96", "--max-queue", "16",
               model=str(FIXTURES / request.param))
    yield request.param, s
    s.close()


def test_vectors_match_sentence_transformers_as_floats_and_base64(served):
    name, s = served
    ref, client = reference(name), s.client()
    floats = client.embeddings.create(model=MODEL_NAME, input=ref["texts"],
                                      encoding_format="float")
    # Without encoding_format the SDK asks for base64 and decodes it.
    decoded = client.embeddings.create(model=MODEL_NAME, input=ref["texts"])
    raw = client.embeddings.create(model=MODEL_NAME, input=ref["texts"],
                                   encoding_format="base64")
    assert floats.usage.prompt_tokens == sum(len(t) for t in ref["tokens"])
    for i, want in enumerate(ref["embeddings"]):
        assert floats.data[i].index == i
        assert_close(f"{name} text {i} float", floats.data[i].embedding, want)
        assert_close(f"{name} text {i} sdk", list(decoded.data[i].embedding), want)
        b = base64.b64decode(raw.data[i].embedding)
        assert_close(f"{name} text {i} base64", list(struct.unpack(f"<{len(b) // 4}f", b)), want)


def test_a_batch_of_mixed_lengths_equals_each_text_alone(served):
    name, s = served
    ref, client = reference(name), s.client()
    # Every fixture's texts together pass the 96-token budget: the batch
    # runs over more than one forward.
    batch = client.embeddings.create(model=MODEL_NAME, input=ref["texts"],
                                     encoding_format="float")
    for i, text in enumerate(ref["texts"]):
        alone = client.embeddings.create(model=MODEL_NAME, input=text, encoding_format="float")
        assert_close(f"{name} text {i}", batch.data[i].embedding, alone.data[0].embedding)
    # Token ids in, the same vectors out.
    by_ids = client.embeddings.create(model=MODEL_NAME, input=ref["tokens"],
                                      encoding_format="float")
    for i, want in enumerate(ref["embeddings"]):
        assert_close(f"{name} ids {i}", by_ids.data[i].embedding, want)


def test_dimensions_are_honoured_only_where_the_model_has_them(served):
    name, s = served
    ref, client = reference(name), s.client()
    # A GGUF names no Matryoshka sizes (config.json's, which llama.cpp's
    # converter does not carry).
    if "dimensions" not in ref or name.endswith(".gguf"):
        with pytest.raises(openai.BadRequestError, match="Matryoshka"):
            client.embeddings.create(model=MODEL_NAME, input="red", dimensions=16)
        return
    for d, want in ref["dimensions"].items():
        got = client.embeddings.create(model=MODEL_NAME, input=ref["texts"],
                                       dimensions=int(d), encoding_format="float")
        for i, w in enumerate(want):
            assert_close(f"{name} dims {d} text {i}", got.data[i].embedding, w)
    with pytest.raises(openai.BadRequestError, match="16, 32"):
        client.embeddings.create(model=MODEL_NAME, input="red", dimensions=24)


def test_a_gguf_is_given_its_matryoshka_sizes_by_flag():
    """llama.cpp's converter drops config.json's Matryoshka sizes: the flag
    gives them back, the vectors cut as sentence-transformers cuts them;
    sizes wider than the vectors, or for a model that generates, are
    refused at start naming the flag."""
    ref = reference("embeddinggemma")
    model = FIXTURES / "embeddinggemma" / "model.gguf"
    s = Server("--matryoshka-dimensions", "32,16", model=str(model))
    try:
        client = s.client()
        for d, want in ref["dimensions"].items():
            got = client.embeddings.create(model=MODEL_NAME, input=ref["texts"],
                                           dimensions=int(d), encoding_format="float")
            for i, w in enumerate(want):
                assert_close(f"gguf dims {d} text {i}", got.data[i].embedding, w)
        with pytest.raises(openai.BadRequestError, match=r"\[16, 32\], not 24"):
            client.embeddings.create(model=MODEL_NAME, input="red", dimensions=24)
    finally:
        s.close()
    width = len(ref["embeddings"][0])
    for args, says in [((str(model), f"{width},{width * 2}"), f"{width * 2}: wider than"),
                       ((model_path(), "16"), "has no vectors to cut")]:
        run = subprocess.run([server_bin(), "serve", "--model", args[0], "--port", "0",
                              "--matryoshka-dimensions", args[1]],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode != 0 and "--matryoshka-dimensions" in run.stderr, run.stderr
        assert says in run.stderr, run.stderr


def test_normalize_and_truncation_as_vllm_takes_them(served):
    name, s = served
    ref, client = reference(name), s.client()
    got = client.embeddings.create(model=MODEL_NAME, input=ref["texts"], encoding_format="float",
                                   extra_body={"normalize": False})
    for i, want in enumerate(ref["raw"]):
        assert_close(f"{name} raw {i}", got.data[i].embedding, want)
    cut = client.embeddings.create(model=MODEL_NAME, input=ref["texts"][2],
                                   extra_body={"truncate_prompt_tokens": 5})
    assert cut.usage.prompt_tokens == 5


@pytest.mark.parametrize("body,reason", [
    ({"input": []}, "the input is empty"),
    ({"input": ""}, "input 0 is an empty string"),
    ({"input": ["red", ""]}, "input 1 is an empty string"),
    # Past every fixture's length (NomicBERT's is 2,048 tokens).
    ({"input": "one two three " * 1000}, "more than the model's"),
    ({"input": [[1, 2], [1, 10 ** 6]]}, "outside the model's vocabulary"),
    ({"input": "red", "encoding_format": "int8"}, "float or base64"),
    ({"input": "red", "user": "u", "temperature": 0}, "unsupported field `temperature`"),
])
def test_bad_input_is_a_400_with_its_reason_and_the_server_goes_on(served, body, reason):
    _, s = served
    r = requests.post(s.url + "/v1/embeddings", json={"model": MODEL_NAME, **body}, timeout=30)
    assert r.status_code == 400, r.text
    assert reason in r.json()["error"]["message"], r.text
    ok = requests.post(s.url + "/v1/embeddings", json={"input": "red"}, timeout=30)
    assert ok.status_code == 200, ok.text


def test_a_named_prompt_goes_before_each_text_as_sentence_transformers_does():
    """EmbeddingGemma's query and document prompts (its
    config_sentence_transformers.json): prepended, pooled and counted."""
    ref = reference("embeddinggemma")
    s = Server("--max-batch-tokens", "256", model=str(FIXTURES / "embeddinggemma"))
    try:
        client = s.client()
        for name, want in ref["prompts"].items():
            got = client.embeddings.create(model=MODEL_NAME, input=ref["texts"],
                                           encoding_format="float",
                                           extra_body={"prompt_name": name})
            assert got.usage.prompt_tokens == sum(len(t) for t in want["tokens"])
            for i, w in enumerate(want["embeddings"]):
                assert_close(f"{name} text {i}", got.data[i].embedding, w)
            cut = client.embeddings.create(model=MODEL_NAME, input=ref["texts"][0],
                                           encoding_format="float", dimensions=16,
                                           extra_body={"prompt_name": name})
            assert len(cut.data[0].embedding) == 16
        # Without a name (the model has no default): the text alone.
        plain = client.embeddings.create(model=MODEL_NAME, input=ref["texts"][0],
                                         encoding_format="float")
        assert_close("no prompt", plain.data[0].embedding, ref["embeddings"][0])
        for body, reason in [
            ({"input": "red", "prompt_name": "passage"},
             'prompt_name "passage" is not one of the model\'s prompts (document, query)'),
            ({"input": [2, 3], "prompt_name": "query"}, "not token ids"),
        ]:
            r = requests.post(s.url + "/v1/embeddings", json=body, timeout=30)
            assert r.status_code == 400, r.text
            assert reason in r.json()["error"]["message"], r.text
            assert r.json()["error"]["param"] == "prompt_name", r.text
    finally:
        s.close()


def test_an_unknown_prompt_name_is_a_400_naming_it(served):
    name, s = served
    r = requests.post(s.url + "/v1/embeddings", json={"input": "red", "prompt_name": "passage"},
                      timeout=30)
    assert r.status_code == 400, r.text
    # A folder's prompts are its config_sentence_transformers.json's
    # (sentence-transformers writes empty `query` and `document` ones); a
    # GGUF carries none.
    why = "names no prompts" if name.endswith(".gguf") else "is not one of the model's prompts"
    assert f'prompt_name "passage"' in r.json()["error"]["message"], r.text
    assert why in r.json()["error"]["message"], r.text


def test_more_text_than_a_batch_can_ever_hold_is_refused():
    s = Server("--max-batch-tokens", "8", model=str(FIXTURES / "bert"))
    try:
        r = requests.post(s.url + "/v1/embeddings", json={"input": "one two three four five six"},
                          timeout=30)
        assert r.status_code == 400, r.text
        assert "--max-batch-tokens" in r.json()["error"]["message"], r.text
        assert requests.post(s.url + "/v1/embeddings", json={"input": "red"},
                             timeout=30).status_code == 200
    finally:
        s.close()


def test_two_thousand_texts_in_one_request_stay_within_the_plan():
    # The aim: one request of 2,048 texts of 128 tokens is answered
    # in batches of --max-batch-tokens, holding no more than the plan counts
    # (NomicBERT: the fixture whose positions reach 128).
    s = Server("--max-batch-tokens", "2048", "--threads", "2", model=str(FIXTURES / "nomic"))
    try:
        line = next(l for l in s.log_text().splitlines() if "pooling model planned" in l)
        total = int(re.search(r"total_bytes=(\d+)", line).group(1))
        texts = [[5 + (7 * i + j) % 80 for j in range(128)] for i in range(2048)]
        r = requests.post(s.url + "/v1/embeddings", json={"input": texts}, timeout=600)
        assert r.status_code == 200, r.text[:500]
        body = r.json()
        assert [d["index"] for d in body["data"]] == list(range(2048))
        assert body["usage"]["prompt_tokens"] >= 2048 * 128
        status = open(f"/proc/{s.proc.pid}/status").read()
        peak = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024
        assert peak <= total, f"peak resident {peak} bytes, plan {total}: {line}"
        assert requests.post(s.url + "/v1/embeddings", json={"input": "red"},
                             timeout=30).status_code == 200
    finally:
        s.close()


def test_queued_embedding_requests_are_the_series_the_autoscalers_scale_on():
    # The operator's HPA and KEDA scale on `ferrox_requests_waiting` per pod
    # (operator/src/desired/autoscaler.rs): a pooling server counts the
    # requests behind its token budget there, as a generating one does.
    s = Server("--max-batch-tokens", "1024", "--max-seqs", "8", "--threads", "2",
               model=str(FIXTURES / "nomic"))
    try:
        texts = [[5 + (3 * i + j) % 80 for j in range(128)] for i in range(256)]
        codes = []

        def one() -> None:
            codes.append(requests.post(s.url + "/v1/embeddings", json={"input": texts},
                                       timeout=600).status_code)
        clients = [threading.Thread(target=one) for _ in range(8)]
        [c.start() for c in clients]
        seen = 0.0
        while any(c.is_alive() for c in clients):
            seen = max(seen, s.metric("ferrox_requests_waiting"))
            time.sleep(0.01)
        [c.join() for c in clients]
        assert codes == [200] * 8
        assert seen >= 1, "no request was ever seen waiting"
        assert s.metric("ferrox_requests_waiting") == 0
        assert s.metric("vllm:num_requests_waiting") == 0
    finally:
        s.close()


def test_the_model_says_what_it_serves_and_refuses_generation(served):
    _, s = served
    models = requests.get(s.url + "/v1/models", timeout=10).json()
    assert models["data"][0]["task"] == "embed"
    with pytest.raises(openai.BadRequestError, match="task embed.*/v1/embeddings"):
        s.client().completions.create(model=MODEL_NAME, prompt="hi", max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="task embed"):
        s.client().chat.completions.create(model=MODEL_NAME, max_tokens=1,
                                           messages=[{"role": "user", "content": "hi"}])


def test_the_router_forwards_embeddings_to_a_ready_replica():
    from test_router import Router
    servers = [Server(model=str(FIXTURES / "bert")) for _ in range(2)]
    router = Router(*[s.url for s in servers])
    try:
        ref = reference("bert")
        got = router.client().embeddings.create(model=MODEL_NAME, input=ref["texts"],
                                                encoding_format="float")
        for i, want in enumerate(ref["embeddings"]):
            assert_close(f"router text {i}", got.data[i].embedding, want)
        r = requests.post(router.url + "/v1/embeddings", json={"input": ""}, timeout=30)
        assert r.status_code == 400, r.text
    finally:
        router.close()
        for s in servers:
            s.close()


@pytest.mark.parametrize("model,task", [
    (FIXTURES / "bert", "embed"),                 # sentence-transformers' modules.json
    (FIXTURES / "bert" / "model.gguf", "embed"),  # GGUF's pooling type
    (FIXTURES / "qwen3_embed", "embed"),          # a decoder with a pooling module
    (FIXTURES / "embeddinggemma", "embed"),       # Gemma 3, bidirectional
    (FIXTURES / "embeddinggemma" / "model.gguf", "embed"),
    (FIXTURES / "xlmr_rerank", "score"),          # *ForSequenceClassification
    (FIXTURES / "qwen3_cls", "score"),            # a decoder's *ForSequenceClassification
    (None, "generate"),                           # SmolLM2
])
def test_inspect_reports_the_task_the_files_say(model, task):
    """The operator plans a deployment without `spec.task` from this."""
    out = subprocess.run([server_bin(), "inspect", "--model", str(model or model_path()), "--json"],
                         capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout)["task"] == task, out.stdout
