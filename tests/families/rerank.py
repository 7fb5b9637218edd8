"""Writes the tiny cross-encoder (scripts/reference-models --rerank runs
this) into server/models/testdata/embeddings/bert_rerank/: a
BertForSequenceClassification with one label and random weights through
transformers (the BERT pooler, tanh of a dense layer on [CLS], then the
classifier), saved as sentence-transformers' CrossEncoder saves it (its
activation, a sigmoid, in config.json), with the scores CrossEncoder.predict
gives (float32) for query/document pairs as reference.json: `scores` after
the activation, `logits` before it, and each pair's tokens and token types
(the tokenizer's pair template: [CLS] query [SEP] document [SEP], types 0
then 1); and an XLM-RoBERTa one as bge-reranker is (xlmr_rerank/: its
head on <s> without a pooler, one token type)."""

import json
import pathlib

import torch
import transformers
from sentence_transformers import CrossEncoder

from embeddings import OUT, randomize, unigram, wordpiece

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
    tok = unigram()
    config = transformers.XLMRobertaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=64, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=128, max_position_embeddings=130,
        type_vocab_size=1, hidden_act="gelu", layer_norm_eps=1e-5, pad_token_id=1,
        bos_token_id=0, eos_token_id=2, num_labels=1)
    model = transformers.XLMRobertaForSequenceClassification(config)
    randomize(model, seed)
    model.save_pretrained(dir)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="<pad>", cls_token="<s>", sep_token="</s>", model_max_length=128)
    fast.save_pretrained(dir)


def build(name: str, make, seed: int) -> None:
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
    enc = [model.tokenizer(q, d, return_token_type_ids=True) for q, d in pairs]
    ref = {"family": name, "query": QUERY, "documents": DOCUMENTS,
           "tokens": [e["input_ids"] for e in enc],
           "token_types": [e["token_type_ids"] for e in enc],
           "scores": [round(s, 7) for s in scores], "logits": [round(s, 7) for s in logits],
           "torch": torch.__version__, "transformers": transformers.__version__}
    (dir / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    size = sum(p.stat().st_size for p in dir.rglob("*") if p.is_file())
    print(f"{size / 1e6:.2f} MB in {dir}")


def main() -> int:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    build("bert_rerank", cross_encoder_dir, 2004)
    build("xlmr_rerank", xlmr_cross_encoder_dir, 2006)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
