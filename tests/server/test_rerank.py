"""The tiny cross-encoders (server/models/testdata/embeddings/bert_rerank,
xlmr_rerank and modernbert_rerank (and llama.cpp's GGUF of both),
nomic_rerank, and qwen3_cls and
qwen3_cls_chat, a decoder's head with the tokenizer's pair or with its chat
template's, written by sentence-transformers' CrossEncoder) and the
decoder reranker (qwen3_rerank: P("yes") as Qwen3-Reranker's card computes
it with transformers) served by the real binary:
a Cohere-shaped and a Jina-shaped rerank over HTTP (/v1/rerank and
/rerank), vLLM's /score with one and many pairs, each score within 1e-4 of
CrossEncoder.predict's; the bad inputs that are each a 400 with its reason
while the server goes on; and a rerank on an embedding model refused."""

import json
import pathlib
import subprocess

import pytest
import requests

from conftest import MODEL_NAME, Server, server_bin

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "server" / "models" / "testdata" / "embeddings"
REF = json.loads((FIXTURES / "bert_rerank" / "reference.json").read_text())
ELEMENT = 1e-4


# Each fixture and its flags: a decoder reranker (Qwen3-Reranker's way,
# its files a causal LM's) is told to score, and its prompt is ~250 tokens.
SERVED = {
    "bert_rerank": ["--max-batch-tokens", "64"],
    "xlmr_rerank": ["--max-batch-tokens", "64"],
    # llama.cpp's GGUF of bge-reranker's kind: its classifier labels say it
    # scores; the pair is the file's BOS, EOS and separator.
    "xlmr_rerank/model.gguf": ["--max-batch-tokens", "64"],
    "qwen3_rerank": ["--task", "score", "--max-batch-tokens", "1024", "--max-model-len", "320"],
    # llama.cpp's GGUF of it: pooling type `rank` says it scores, with no
    # --task; its classifier is the "yes" and "no" rows.
    "qwen3_rerank/model.gguf": ["--max-batch-tokens", "1024", "--max-model-len", "320"],
    # A decoder with a classification head scores as its files say.
    "qwen3_cls": ["--max-batch-tokens", "64", "--max-model-len", "64"],
    # ModernBERT's head on the mean of the states, NomicBERT's pooler on
    # [CLS] (nomic is trained for 2,048 positions: held to 64 here).
    "modernbert_rerank": ["--max-batch-tokens", "64"],
    # Its GGUF: the head's pooling from `classifier.pooling_type`.
    "modernbert_rerank/model.gguf": ["--max-batch-tokens", "64"],
    "nomic_rerank": ["--max-batch-tokens", "64", "--max-model-len", "64"],
    # A decoder cross-encoder whose chat template carries the pair (a query
    # and a document message, as sentence-transformers 6 renders it).
    "qwen3_cls_chat": ["--max-batch-tokens", "1024", "--max-model-len", "320"],
}


@pytest.fixture(scope="module", params=list(SERVED))
def served(request):
    s = Server(*SERVED[request.param], "--max-queue", "16",
               model=str(FIXTURES / request.param))
    # The query and documents are the fixtures' same; the tokens and
    # scores are each model's.
    fixture = FIXTURES / request.param.removesuffix("/model.gguf")
    s.ref = json.loads((fixture / "reference.json").read_text())
    s.name = request.param
    yield s
    s.close()


def post(s, path, body):
    r = requests.post(s.url + path, json=body, timeout=30)
    return r.status_code, r.json()


# How each cross-encoder pools before its head: an encoder's first token
# (ModernBERT's as its `classifier_pooling` says), a decoder's last.
HEAD_POOLING = {"bert_rerank": "cls", "xlmr_rerank": "cls", "xlmr_rerank/model.gguf": "cls",
                "qwen3_rerank": "last",
                "qwen3_rerank/model.gguf": "last",
                "qwen3_cls": "last", "modernbert_rerank": "mean",
                "modernbert_rerank/model.gguf": "mean", "nomic_rerank": "cls",
                "qwen3_cls_chat": "last"}


def test_the_model_scores_as_its_files_say(served):
    models = requests.get(served.url + "/v1/models", timeout=10).json()
    assert models["data"][0]["task"] == "score"
    # The start-up line reports the head's pooling, not an embedder's.
    line = next(l for l in served.log_text().splitlines() if "pooling model planned" in l)
    assert f"pooling={HEAD_POOLING[served.name]}" in line, line


@pytest.mark.parametrize("path,documents", [
    # Cohere: strings; Jina: objects with a text.
    ("/v1/rerank", REF["documents"]),
    ("/rerank", [{"text": d} for d in REF["documents"]]),
])
def test_rerank_ranks_the_documents_by_cross_encoder_score(served, path, documents):
    code, got = post(served, path, {"model": MODEL_NAME, "query": REF["query"],
                                    "documents": documents})
    assert code == 200, got
    results = got["results"]
    assert sorted(r["index"] for r in results) == list(range(len(documents)))
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    for r in results:
        assert abs(r["relevance_score"] - served.ref["scores"][r["index"]]) <= ELEMENT, r
        assert r["document"]["text"] == REF["documents"][r["index"]]
    assert got["usage"]["total_tokens"] == sum(len(t) for t in served.ref["tokens"])
    # top_n keeps the best; return_documents false leaves them out.
    code, top = post(served, path, {"query": REF["query"], "documents": documents,
                                    "top_n": 2, "return_documents": False})
    assert code == 200, top
    assert [r["index"] for r in top["results"]] == [r["index"] for r in results[:2]]
    assert all("document" not in r for r in top["results"])


def test_score_takes_one_pair_or_many(served):
    code, one = post(served, "/score", {"text_1": REF["query"], "text_2": REF["documents"][0]})
    assert code == 200, one
    assert abs(one["data"][0]["score"] - served.ref["scores"][0]) <= ELEMENT
    code, many = post(served, "/score", {"text_1": [REF["query"]] * len(REF["documents"]),
                                         "text_2": REF["documents"]})
    assert code == 200, many
    assert [d["index"] for d in many["data"]] == list(range(len(REF["documents"])))
    for d in many["data"]:
        assert d["object"] == "score"
        assert abs(d["score"] - served.ref["scores"][d["index"]]) <= ELEMENT, d


@pytest.mark.parametrize("path,body,reason", [
    ("/v1/rerank", {"query": "red", "documents": []}, "documents is empty"),
    ("/v1/rerank", {"query": "red", "documents": ["blue"], "top_n": -1}, "top_n must be"),
    ("/rerank", {"documents": ["blue"]}, "query is required"),
    ("/v1/rerank", {"query": "red", "documents": ["blue", ""]}, "pair 1 has an empty text"),
    ("/v1/rerank", {"query": "red", "documents": ["one two three " * 40]}, "more than the model's"),
    ("/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_1 has 2 texts"),
    ("/score", {"text_1": "a", "text_2": "b", "temperature": 0}, "unsupported field `temperature`"),
])
def test_bad_input_is_a_400_with_its_reason_and_the_server_goes_on(served, path, body, reason):
    code, got = post(served, path, body)
    assert code == 400, got
    assert reason in got["error"]["message"], got
    code, ok = post(served, "/score", {"text_1": "red", "text_2": "blue"})
    assert code == 200, ok


def test_a_scorer_refuses_embeddings_and_an_embedder_refuses_rerank(served):
    code, got = post(served, "/v1/embeddings", {"input": "red"})
    assert code == 400 and "task score" in got["error"]["message"], got
    s = Server(model=str(FIXTURES / "bert"))
    try:
        for path in ["/v1/rerank", "/rerank"]:
            code, got = post(s, path, {"query": "red", "documents": ["blue"]})
            assert code == 400, got
            assert "task embed" in got["error"]["message"] and path in got["error"]["message"]
        code, got = post(s, "/score", {"text_1": "red", "text_2": "blue"})
        assert code == 400 and "/v1/embeddings" in got["error"]["message"], got
    finally:
        s.close()


def test_the_router_forwards_rerank_and_score_to_a_ready_replica():
    from test_router import Router
    servers = [Server(model=str(FIXTURES / "bert_rerank")) for _ in range(2)]
    router = Router(*[s.url for s in servers])
    try:
        for path in ["/v1/rerank", "/rerank"]:
            code, got = post(router, path, {"model": MODEL_NAME, "query": REF["query"],
                                            "documents": REF["documents"]})
            assert code == 200, got
            for r in got["results"]:
                assert abs(r["relevance_score"] - REF["scores"][r["index"]]) <= ELEMENT
        code, got = post(router, "/score", {"model": MODEL_NAME, "text_1": REF["query"],
                                            "text_2": REF["documents"]})
        assert code == 200, got
        assert [round(d["score"], 4) for d in got["data"]] == [round(x, 4) for x in REF["scores"]]
        code, got = post(router, "/v1/rerank", {"model": MODEL_NAME, "query": "red",
                                                "documents": []})
        assert code == 400, got
    finally:
        router.close()
        for s in servers:
            s.close()


def test_pooling_requests_count_under_vllms_names(served):
    def total(name, label=""):
        text = requests.get(served.url + "/metrics", timeout=5).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name) and label in line
                   and line[len(name)] in " {")
    names = ["vllm:prompt_tokens_total", "vllm:e2e_request_latency_seconds_count",
             "vllm:request_queue_time_seconds_count"]
    before = [total(n) for n in names]
    stop = total("vllm:request_success_total", 'finished_reason="stop"')
    code, got = post(served, "/score", {"text_1": REF["query"], "text_2": REF["documents"]})
    assert code == 200, got
    after = [total(n) for n in names]
    assert after[0] - before[0] == got["usage"]["prompt_tokens"] == sum(map(len, served.ref["tokens"]))
    assert after[1] - before[1] == 1 and after[2] - before[2] == 1
    assert total("vllm:request_success_total", 'finished_reason="stop"') - stop == 1


def test_a_decoder_without_yes_and_no_tokens_is_refused_at_start_with_the_reason():
    model = ROOT / "server" / "models" / "testdata" / "families" / "llama"
    out = subprocess.run([server_bin(), "serve", "--model", str(model), "--task", "score",
                          "--port", "0"], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0, out.stderr
    assert 'the vocabulary has no "yes"' in out.stderr, out.stderr
    assert "panicked" not in out.stderr


def test_a_gguf_cross_encoder_without_its_pooler_is_refused_at_start_naming_it():
    # llama.cpp's converter drops a BERT cross-encoder's pooler: its
    # classifier's labels say it scores, and the head it lacks is named.
    model = FIXTURES / "bert_rerank" / "model.gguf"
    out = subprocess.run([server_bin(), "serve", "--model", str(model), "--port", "0"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0, out.stderr
    assert "task=score" in out.stderr, out.stderr
    assert 'missing tensor "cls.weight"' in out.stderr, out.stderr
    assert "panicked" not in out.stderr
