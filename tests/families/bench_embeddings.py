"""Embedding throughput of a bge-base-shaped BERT (12 layers, 768 wide,
random weights, the tiny WordPiece tokenizer; written to a temporary folder,
never committed): ferrox-server answering one request of all the texts
(batched) and one request a text in turn, against sentence-transformers on
the same texts in the same process's threads, batched and one at a time.
Alternates ferrox and sentence-transformers for `--rounds` rounds and
prints texts per second (best and median).

  FERROX_REF_PYTHON=... ; $py tests/families/bench_embeddings.py \\
      --server target/debug/ferrox-server --threads 2

With `--gguf LLAMA_SRC`, writes the same model as GGUF instead (llama.cpp's
converter, f16, then its llama-quantize to Q8_0 from `--peer`'s build) into
models/bench/bgebase-{f16,Q8_0}.gguf for scripts/bench-embeddings, and
exits; with `--reranker` too, a cross-encoder of bge-reranker-base's
geometry instead (XLMRobertaForSequenceClassification: 12 layers, 768
wide, 12 heads, 3072 MLP; random weights, a SentencePiece Unigram
vocabulary trained on the benchmark's words, so each is a piece or two)
into models/bench/bgereranker-{f16,Q8_0}.gguf, for `scripts/bench-embeddings
--rerank`."""

import argparse
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import time

import json
import urllib.request
import torch
import transformers
from sentence_transformers import SentenceTransformer, models

from embeddings import randomize, wordpiece, xlmr_tokenizer

DIR = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / "ferrox-bench-bge-base"
RERANKER = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / "ferrox-bench-bge-reranker-base"
WORDS = ("the capital of france is paris a sliding window keeps only the last few "
         "positions of the sequence name three colors red green and blue").split()


def make_model() -> None:
    if (DIR / "modules.json").exists():
        return
    tok = wordpiece()
    config = transformers.BertConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=768, num_hidden_layers=12,
        num_attention_heads=12, intermediate_size=3072, max_position_embeddings=512,
        type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12)
    model = transformers.BertModel(config, add_pooling_layer=False)
    randomize(model, 7)
    model.save_pretrained(DIR)
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
        pad_token="[PAD]", mask_token="[MASK]", model_max_length=512).save_pretrained(DIR)
    t = models.Transformer(str(DIR))
    st = SentenceTransformer(modules=[t, models.Pooling(768, pooling_mode="cls"),
                                      models.Normalize()], device="cpu")
    st.save(str(DIR))


def make_reranker() -> None:
    if (RERANKER / "config.json").exists():
        return
    RERANKER.mkdir(parents=True, exist_ok=True)
    tok = xlmr_tokenizer(RERANKER, corpus=[" ".join(WORDS)] * 8 + texts(64), vocab=200)
    config = transformers.XLMRobertaConfig(
        vocab_size=len(tok), hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=3072, max_position_embeddings=514, type_vocab_size=1,
        hidden_act="gelu", layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0,
        eos_token_id=2, num_labels=1)
    model = transformers.XLMRobertaForSequenceClassification(config)
    randomize(model, 8)
    model.save_pretrained(RERANKER)


def write_gguf(llama_src: str, peer: str, src: pathlib.Path, name: str) -> None:
    here = pathlib.Path(__file__).resolve().parent
    out = here.parents[1] / "models" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    f16, q8 = out / f"{name}-f16.gguf", out / f"{name}-Q8_0.gguf"
    if not f16.exists():
        subprocess.run([sys.executable, str(here / "convert.py"), llama_src, str(src), "--outfile",
                        str(f16), "--outtype", "f16", "--model-name", f"ferrox bench {name}"],
                       check=True)
    if not q8.exists():
        subprocess.run([peer, "quantize", str(f16), str(q8), "Q8_0"], check=True,
                       stdout=subprocess.DEVNULL)
    print(f16, q8, sep="\n")


def texts(n: int) -> list:
    # 20 to 60 words each (about 60 to 180 WordPiece tokens).
    return [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(20 + (i * 13) % 41))
            for i in range(n)]


def serve(binary: str, threads: int) -> tuple:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([binary, "serve", "--model", str(DIR), "--port", str(port),
                             "--threads", str(threads), "--max-batch-tokens", "16384"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            with urllib.request.urlopen(url + "/ready", timeout=1) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server did not get ready")


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--server")
    p.add_argument("--gguf", metavar="LLAMA_SRC", help="write the model as GGUF and exit")
    p.add_argument("--peer", default=str(pathlib.Path(__file__).resolve().parents[2].parent
                                         / "shared/tools/peer-llama"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--texts", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reranker", action="store_true",
                   help="with --gguf: the bge-reranker-base-shaped cross-encoder")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    if a.gguf and a.reranker:
        make_reranker()
        write_gguf(a.gguf, a.peer, RERANKER, "bgereranker")
        return 0
    make_model()
    if a.gguf:
        write_gguf(a.gguf, a.peer, DIR, "bgebase")
        return 0
    if not a.server:
        p.error("--server or --gguf is required")
    batch = texts(a.texts)
    st = SentenceTransformer(str(DIR), device="cpu")
    proc, url = serve(a.server, a.threads)

    def post(inp) -> None:
        body = json.dumps({"input": inp}).encode()
        req = urllib.request.Request(url + "/v1/embeddings", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            r.read()
    runs = {
        "ferrox, one request of all texts": lambda: post(batch),
        "ferrox, one request a text": lambda: [post(t) for t in batch],
        "sentence-transformers, batch_size 32": lambda: st.encode(batch, batch_size=32),
        "sentence-transformers, one a call": lambda: [st.encode([t]) for t in batch],
    }
    try:
        for f in runs.values():
            f()  # warm-up
        got = {k: [] for k in runs}
        for _ in range(a.rounds):
            for k, f in runs.items():
                got[k].append(a.texts / timed(f))
    finally:
        proc.terminate()
        proc.wait()
    tokens = sum(len(st.tokenizer(t)["input_ids"]) for t in batch)
    print(f"{a.texts} texts, {tokens} tokens, {a.threads} threads, {a.rounds} rounds")
    for k, v in got.items():
        print(f"{k}: best {max(v):.1f} texts/s, median {statistics.median(v):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
