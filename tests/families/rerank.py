"""Writes the tiny cross-encoder (scripts/reference-models --rerank runs
this) into server/models/testdata/embeddings/bert_rerank/: a
BertForSequenceClassification with one label and random weights through
transformers (the BERT pooler, tanh of a dense layer on [CLS], then the
classifier), saved as sentence-transformers' CrossEncoder saves it (its
activation, a sigmoid, in config.json), with the scores CrossEncoder.predict
gives (float32) for query/document pairs as reference.json: `scores` after
the activation, `logits` before it, and each pair's tokens and token types
(the tokenizer's pair template: [CLS] query [SEP] document [SEP], types 0
then 1); an XLM-RoBERTa one as bge-reranker is (xlmr_rerank/: its
head on <s> without a pooler, one token type); and a decoder reranker as
Qwen3-Reranker is (qwen3_rerank/: a Qwen3ForCausalLM whose score is
P("yes") against "no" at the last position of its prompt template, computed
as its model card does); and a decoder with a classification head
(qwen3_cls/: Qwen3ForSequenceClassification, its `score` linear on the
last non-padding token, a pair its two texts' tokens end to end as the
tokenizer joins them, no special tokens); a ModernBERT cross-encoder as
gte-reranker-modernbert is (modernbert_rerank/: its head, dense, GELU and
a bias-free LayerNorm, on the mean of the final-normed states, then the
classifier); and a NomicBERT one (nomic_rerank/: the BERT pooler, tanh of
a dense layer on [CLS], then the classifier, computed by transformers' own
NomicBertForSequenceClassification and written in nomic's layout under
`bert.`, as the published checkpoints are); and a decoder cross-encoder
with a chat template that carries the pair (qwen3_cls_chat/: as
qwen3_cls, its tokenizer with a template rendering a `query` and a
`document` message into Qwen3-Reranker's prompt, which
sentence-transformers 6 applies to each pair, no generation prompt; the
reference's tokens are the ones CrossEncoder feeds the model). With
`--llama-src`, qwen3_rerank is also written as the GGUF llama.cpp's
converter makes of it (qwen3_rerank/model.gguf, f32: pooling type `rank`,
its "yes" and "no" rows as the classifier `cls.output`), and so is
bert_rerank (bert_rerank/model.gguf: the converter drops its pooler),
xlmr_rerank (xlmr_rerank/model.gguf: no pooling type but the classifier's
labels, its head as `cls`/`cls.output`, the `t5` vocabulary, the pair
`<s> a </s></s> b </s>` from the file's BOS, EOS and separator) and
modernbert_rerank (modernbert_rerank/model.gguf: its head as `cls`,
`cls.norm`, `cls.output`, the mean as `classifier.pooling_type`).
`--only NAME...` remakes only those fixtures."""

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile

import torch
import transformers
from sentence_transformers import CrossEncoder

import tokenizer as bpe
from embeddings import (OUT, modernbert_config, modernbert_tokenizer, nomic_layout, randomize,
                        wordpiece, xlmr_tokenizer)

QUERY = "Name three colors."
DOCUMENTS = [
    "red, green and blue",
    "The capital of France is Paris.",
    "Count to five: one two three four five.",
    "A sliding window keeps only the last few positions of the sequence.",
]


def cross_encoder_dir(dir: pathlib.Path, seed: int) -> None:
    tok = wordpiece()
    config = transformers.BertConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=64, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=128, max_position_embeddings=64,
        type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12, num_labels=1)
    model = transformers.BertForSequenceClassification(config)
    randomize(model, seed)
    model.save_pretrained(dir)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
        pad_token="[PAD]", mask_token="[MASK]", model_max_length=64,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"])
    fast.save_pretrained(dir)


def xlmr_cross_encoder_dir(dir: pathlib.Path, seed: int) -> None:
    """bge-reranker's kind: XLMRobertaForSequenceClassification, whose head
    is classifier.dense, tanh and classifier.out_proj on <s> (no pooler);
    a pair is <s> a </s></s> b </s>, every token of type 0."""
    tok = xlmr_tokenizer(dir)
    config = transformers.XLMRobertaConfig(
        vocab_size=len(tok), hidden_size=64, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=128, max_position_embeddings=130,
        type_vocab_size=1, hidden_act="gelu", layer_norm_eps=1e-5, pad_token_id=1,
        bos_token_id=0, eos_token_id=2, num_labels=1)
    model = transformers.XLMRobertaForSequenceClassification(config)
    randomize(model, seed)
    model.save_pretrained(dir)


def qwen3_cross_encoder_dir(dir: pathlib.Path, seed: int) -> None:
    """A decoder cross-encoder: Qwen3ForSequenceClassification, whose
    `score` (hidden -> 1, no bias) reads the last non-padding token; its
    tokenizer (no post-processor, as Qwen's adds no specials) joins a pair
    end to end."""
    config = transformers.Qwen3Config(
        vocab_size=bpe.VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=2, head_dim=32, max_position_embeddings=512,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
        bos_token_id=2, eos_token_id=6, pad_token_id=0, num_labels=1)
    config.architectures = ["Qwen3ForSequenceClassification"]
    model = transformers.Qwen3ForSequenceClassification(config)
    randomize(model, seed)
    model.save_pretrained(dir)
    bpe.write(dir, "chatml", "<|im_end|>")
    # No chat template: with one, sentence-transformers 6 renders the pair
    # through it (qwen3_cls_chat); without, it is the tokenizer's pair, as
    # transformers' tokenizer(query, document) gives.
    config_path = dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    del config["chat_template"]
    config_path.write_text(json.dumps(config, indent=1) + "\n")


def wordpiece_pair_tokenizer(dir: pathlib.Path, names: list[str]) -> None:
    """The WordPiece tokenizer with its pair template ([CLS] a [SEP] b
    [SEP]); `names` the inputs the model's forward takes."""
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=wordpiece(), unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
        pad_token="[PAD]", mask_token="[MASK]", model_max_length=64, model_input_names=names)
    fast.save_pretrained(dir)


def modernbert_cross_encoder_dir(dir: pathlib.Path, seed: int) -> None:
    """gte-reranker-modernbert's kind: ModernBertForSequenceClassification
    pooling by the mean (`classifier_pooling`), its head `head.dense` (no
    bias), GELU, `head.norm` (no bias), then `classifier`; a local window of
    8 so the pairs slide; no token types."""
    config = modernbert_config(modernbert_tokenizer(dir), classifier_pooling="mean",
                               classifier_activation="gelu", classifier_bias=False,
                               num_labels=1)
    model = transformers.ModernBertForSequenceClassification(config)
    randomize(model, seed)
    model.save_pretrained(dir)


def nomic_cross_encoder_dir(dir: pathlib.Path, seed: int) -> None:
    """NomicBertForSequenceClassification: BERT's pooler (dense and tanh
    on [CLS]) and classifier over nomic-embed's encoder; token types 0
    then 1 as BERT's pair."""
    config = transformers.NomicBertConfig(
        vocab_size=wordpiece().get_vocab_size(), hidden_size=64, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=128, max_position_embeddings=2048,
        type_vocab_size=2, hidden_act="silu", layer_norm_eps=1e-12, pad_token_id=0,
        num_labels=1, rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
    model = transformers.NomicBertForSequenceClassification(config)
    randomize(model, seed)
    model.save_pretrained(dir)
    wordpiece_pair_tokenizer(dir, ["input_ids", "token_type_ids", "attention_mask"])


def nomic_rewrite(dir: pathlib.Path) -> None:
    """The scored checkpoint in nomic's layout: the encoder renamed as
    embeddings.py's `nomic_layout` does, under `bert.` (nomic's remote
    code's prefix), the pooler and classifier as they are."""
    from safetensors.torch import load_file, save_file
    native = load_file(dir / "model.safetensors")
    encoder = {k.removeprefix("nomic_bert."): v for k, v in native.items()
               if k.startswith("nomic_bert.") and ".pooler." not in k}
    head = {k.replace("nomic_bert.", "bert."): v for k, v in native.items()
            if not k.startswith("nomic_bert.") or ".pooler." in k}
    config = json.loads((dir / "config.json").read_text())
    save_file(encoder, dir / "model.safetensors", metadata={"format": "pt"})
    (dir / "config.json").write_text(json.dumps({**config, "architectures": ["NomicBertModel"]}))
    nomic_layout(dir)
    rewritten = load_file(dir / "model.safetensors")
    out = {f"bert.{k}": v for k, v in rewritten.items()} | head
    save_file(out, dir / "model.safetensors", metadata={"format": "pt"})
    nomic = json.loads((dir / "config.json").read_text())
    nomic["architectures"] = ["NomicBertForSequenceClassification"]
    nomic["num_labels"] = 1
    (dir / "config.json").write_text(json.dumps(nomic, indent=2) + "\n")


# A Qwen3-Reranker-shaped chat template over sentence-transformers' pair
# roles (the shape its error message suggests for a reranker's template).
PAIR_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    "and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that "
    "answer the query\n"
    "<Query>: {{ messages | selectattr(\"role\", \"eq\", \"query\") | map(attribute=\"content\") "
    "| first }}\n"
    "<Document>: {{ messages | selectattr(\"role\", \"eq\", \"document\") "
    "| map(attribute=\"content\") | first }}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n")


def qwen3_chat_cross_encoder_dir(dir: pathlib.Path, seed: int) -> None:
    """qwen3_cls with a chat template that carries the pair."""
    qwen3_cross_encoder_dir(dir, seed)
    config_path = dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = PAIR_TEMPLATE
    config_path.write_text(json.dumps(config, indent=1) + "\n")


def build(name: str, make, seed: int, after=None) -> None:
    dir = OUT / name
    dir.mkdir(parents=True, exist_ok=True)
    make(dir, seed)
    model = CrossEncoder(str(dir), device="cpu", model_kwargs={"attn_implementation": "eager"})
    model.save(str(dir))
    (dir / "README.md").unlink(missing_ok=True)
    pairs = [(QUERY, d) for d in DOCUMENTS]
    # One pair a call, so padding never enters.
    scores = [float(model.predict([p], convert_to_numpy=True)[0]) for p in pairs]
    logits = [float(model.predict([p], activation_fn=torch.nn.Identity(),
                                  convert_to_numpy=True)[0]) for p in pairs]
    if model.tokenizer.chat_template is None:
        enc = [model.tokenizer(q, d, return_token_type_ids=True) for q, d in pairs]
        tokens = [e["input_ids"] for e in enc]
        types = [e["token_type_ids"] for e in enc]
    else:
        # What CrossEncoder feeds the model: the pair through the template.
        tokens = [model[0].preprocess([p])["input_ids"][0].tolist() for p in pairs]
        types = [[0] * len(t) for t in tokens]
    ref = {"family": name, "query": QUERY, "documents": DOCUMENTS,
           "tokens": tokens, "token_types": types,
           "scores": [round(s, 7) for s in scores], "logits": [round(s, 7) for s in logits],
           "torch": torch.__version__, "transformers": transformers.__version__}
    (dir / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    if after is not None:
        after(dir)
    size = sum(p.stat().st_size for p in dir.rglob("*") if p.is_file())
    print(f"{size / 1e6:.2f} MB in {dir}")


# Qwen3-Reranker's prompt, from its model card (the server's copy is
# server/http/src/load/pair_prompt.rs).
QWEN3_PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on "
                "the Query and the Instruct provided. Note that the answer can only be \"yes\" or "
                "\"no\".<|im_end|>\n<|im_start|>user\n")
QWEN3_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
QWEN3_INSTRUCT = "Given a web search query, retrieve relevant passages that answer the query"


def qwen3_reranker(seed: int) -> None:
    dir = OUT / "qwen3_rerank"
    dir.mkdir(parents=True, exist_ok=True)
    config = transformers.Qwen3Config(
        vocab_size=bpe.VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=2, head_dim=32, max_position_embeddings=512,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
        bos_token_id=2, eos_token_id=6, pad_token_id=0)
    config.architectures = ["Qwen3ForCausalLM"]
    model = transformers.Qwen3ForCausalLM(config)
    randomize(model, seed)
    model.eval()
    model.save_pretrained(dir)
    # "yes" and "no" whole tokens, as Qwen's vocabulary has them.
    bpe.write(dir, "chatml", "<|im_end|>", extra=("yes", "no"))
    tok = transformers.PreTrainedTokenizerFast.from_pretrained(dir)
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    # Random rows give scores of 0.999 that say little at 1e-4: "no" is
    # "yes" moved a little, so the scores spread around one half.
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb[no] = emb[yes] + 0.2 * torch.randn(emb.shape[1], generator=torch.Generator().manual_seed(seed))
    model.save_pretrained(dir)
    prefix = tok.encode(QWEN3_PREFIX, add_special_tokens=False)
    suffix = tok.encode(QWEN3_SUFFIX, add_special_tokens=False)
    tokens, scores, logits = [], [], []
    for doc in DOCUMENTS:
        body = f"<Instruct>: {QWEN3_INSTRUCT}\n<Query>: {QUERY}\n<Document>: {doc}"
        ids = prefix + tok.encode(body, add_special_tokens=False) + suffix
        with torch.no_grad():
            last = model(torch.tensor([ids])).logits[0, -1]
        pair = torch.log_softmax(torch.stack([last[no], last[yes]]).float(), dim=0)
        tokens.append(ids)
        scores.append(round(float(pair[1].exp()), 7))
        logits.append(round(float(last[yes] - last[no]), 6))
    ref = {"family": "qwen3_rerank", "query": QUERY, "documents": DOCUMENTS,
           "tokens": tokens, "token_types": [[0] * len(t) for t in tokens],
           "scores": scores, "logits": logits, "yes_no": [yes, no],
           "torch": torch.__version__, "transformers": transformers.__version__}
    (dir / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    size = sum(p.stat().st_size for p in dir.rglob("*") if p.is_file())
    print(f"{size / 1e6:.2f} MB in {dir}")


def convert_reranker(src: pathlib.Path, name: str) -> None:
    """llama.cpp's GGUF of fixture `name` (f32). Its converter knows a
    Qwen3-Reranker by its folder's name, so it reads a copy named so."""
    here = pathlib.Path(__file__).resolve().parent
    with tempfile.TemporaryDirectory() as tmp:
        copy = pathlib.Path(tmp) / name.replace("qwen3_rerank", "qwen3-reranker-tiny")
        shutil.copytree(OUT / name, copy)
        out = OUT / name / "model.gguf"
        done = subprocess.run([sys.executable, str(here / "convert.py"), str(src), str(copy),
                               "--outfile", str(out), "--outtype", "f32",
                               "--model-name", "ferrox tiny reference"],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"convert_hf_to_gguf.py failed:\n{done.stderr[-3000:]}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", nargs="+", help="remake only these fixtures")
    parser.add_argument("--llama-src", type=pathlib.Path, help="llama.cpp source (peer-llama src)")
    args = parser.parse_args()
    only = args.only
    torch.manual_seed(0)
    torch.set_num_threads(1)
    fixtures = {
        "bert_rerank": lambda: build("bert_rerank", cross_encoder_dir, 2004),
        "xlmr_rerank": lambda: build("xlmr_rerank", xlmr_cross_encoder_dir, 2006),
        "qwen3_rerank": lambda: qwen3_reranker(2007),
        "qwen3_cls": lambda: build("qwen3_cls", qwen3_cross_encoder_dir, 2008),
        "modernbert_rerank": lambda: build("modernbert_rerank", modernbert_cross_encoder_dir, 2009),
        "nomic_rerank": lambda: build("nomic_rerank", nomic_cross_encoder_dir, 2010, nomic_rewrite),
        "qwen3_cls_chat": lambda: build("qwen3_cls_chat", qwen3_chat_cross_encoder_dir, 2011),
    }
    for name in only or fixtures:
        if name not in fixtures:
            raise SystemExit(f"no fixture {name} ({', '.join(fixtures)})")
        fixtures[name]()
    # What llama.cpp's converter also writes as GGUF: the Qwen3-Reranker,
    # a BERT cross-encoder without its pooler (refused), and bge-reranker's
    # kind (its head as `cls` and `cls.output`).
    for name in ["qwen3_rerank", "bert_rerank", "xlmr_rerank", "modernbert_rerank"]:
        if args.llama_src and name in (only or fixtures):
            convert_reranker(args.llama_src, name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
