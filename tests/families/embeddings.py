"""Writes the tiny embedding models (scripts/reference-models --embeddings
runs this) into server/models/testdata/embeddings/: random weights through
transformers, wrapped by sentence-transformers with their pooling modules
and saved as sentence-transformers saves them (modules.json,
1_Pooling/config.json, ...), with the vectors sentence-transformers gives
(float32) for a few texts of mixed lengths as reference.json:

- bert: BertModel with a WordPiece tokenizer ([CLS] ... [SEP]), CLS
  pooling, normalized; no Matryoshka dimensions.
- bert_mean: the same kind of encoder, mean pooling, not normalized.
- xlmr: XLMRobertaModel with a SentencePiece Unigram tokenizer as
  bge-m3's (<s> ... </s>, the `nmt_nfkc` normalization table; two more
  texts that it changes), positions from pad_token_id + 1, one token
  type, mean pooling, normalized.
- nomic: NomicBertModel (nomic-embed-text v1.5's shape: RoPE, SwiGLU,
  post-LN, no linear biases) with the WordPiece tokenizer, mean pooling,
  normalized. transformers' own NomicBERT (5.x) computes the reference;
  the checkpoint is written as nomic's (`Wqkv`, `fc11`/`fc12`/`fc2`,
  `norm1`/`norm2`, `emb_ln`, its config keys), the layout of the published
  models and the one llama.cpp converts, and read back through
  transformers' own renaming of that layout to check the rewrite.
- modernbert: ModernBertModel (gte-modernbert's shape: alternating global
  and local attention, a local window of 8 so the longer texts slide, two
  RoPE bases, GeGLU, bias-free pre-LN) with a byte-level BPE tokenizer
  as ModernBERT's ([CLS] ... [SEP]), CLS pooling, normalized.
- qwen3_embed: a Qwen3 decoder (Qwen3Model, no `model.` prefix, as
  Qwen3-Embedding ships), <|endoftext|> appended by the tokenizer,
  last-token pooling, normalized, Matryoshka dimensions 16 and 32.
- embeddinggemma: EmbeddingGemma's shape (Gemma3TextModel with
  `use_bidirectional_attention`, five sliding layers and one global, a
  window of 8 so every longer text slides both ways), <bos> text <eos>,
  mean pooling, two bias-free identity Dense modules (32 -> 64 -> 32),
  normalized, Matryoshka dimensions 16 and 32, and its query and document
  prompts (config_sentence_transformers.json), whose vectors are in the
  reference's `prompts` too.

With `--llama-src` (scripts/reference-models --embeddings passes `peer-llama
src`), five are also written as the GGUF llama.cpp's converter makes of
them (f32, so the same bar holds): `bert/model.gguf`, `nomic/model.gguf`,
`xlmr/model.gguf` (`bert` with a `t5` vocabulary and the compiled
normalization table), `modernbert/model.gguf` and
`embeddinggemma/model.gguf` (its Dense modules as `dense_2`/`dense_3`, the
converter's `--sentence-transformers-dense-modules`). `--only NAME...`
remakes only those fixtures.

Each reference has `embeddings` (what the model outputs), `raw` (pooled and
through any Dense modules, before the Normalize module) and, for a Matryoshka model, `dimensions`: each
size's truncated and renormalized vectors."""

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

import torch
import transformers
from sentence_transformers import SentenceTransformer, models
from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece

import tokenizer as bpe

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "server" / "models" / "testdata" / "embeddings"
TEXTS = [
    "The capital of France is Paris.",
    "red",
    "A sliding window keeps only the last few positions of the sequence, and small random "
    "models answer the same way twice: one two three four five.",
    "Count to five: one two three four five. Name three colors: red, green and blue.",
]
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def wordpiece() -> Tokenizer:
    """A WordPiece tokenizer as BERT's: lowercased, [CLS] text [SEP]. Its
    vocabulary is written, not trained (the trainer breaks ties in hash
    order): the specials, every character alone and as a `##` suffix, and
    the corpus's words of four letters or more, so long words split."""
    normalizer = normalizers.BertNormalizer(lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    words = set()
    for line in bpe.CORPUS:
        words.update(w for w, _ in pre.pre_tokenize_str(normalizer.normalize_str(line)))
    chars = sorted({c for w in words for c in w})
    vocab = BERT_SPECIALS + chars + [f"##{c}" for c in chars]
    vocab += sorted(w for w in words if len(w) >= 4 and w not in vocab)
    tok = Tokenizer(WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.WordPiece()
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return tok


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Weights with spread: matrices of unit gain, norms around 1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            r = torch.randn(p.shape, generator=g)
            if "norm" in name.lower() and name.endswith("weight"):
                p.copy_(0.2 * r + 1.0)
            elif name.endswith("bias"):
                p.copy_(0.2 * r)
            elif "embed" in name:
                p.copy_(0.5 * r)
            else:
                p.copy_(r * 1.2 / p.shape[-1] ** 0.5)


def bert_dir(dir: pathlib.Path, seed: int) -> None:
    tok = wordpiece()
    config = transformers.BertConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=64, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=128, max_position_embeddings=64,
        type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12)
    model = transformers.BertModel(config, add_pooling_layer=False)
    randomize(model, seed)
    model.save_pretrained(dir)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
        pad_token="[PAD]", mask_token="[MASK]", model_max_length=64)
    fast.save_pretrained(dir)


def bert_tokenizer(dir: pathlib.Path, max_len: int) -> None:
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=wordpiece(), unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
        pad_token="[PAD]", mask_token="[MASK]", model_max_length=max_len)
    fast.save_pretrained(dir)


def nomic_dir(dir: pathlib.Path, seed: int) -> None:
    config = transformers.NomicBertConfig(
        vocab_size=wordpiece().get_vocab_size(), hidden_size=64, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=128, max_position_embeddings=2048,
        type_vocab_size=2, hidden_act="silu", layer_norm_eps=1e-12, pad_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
    model = transformers.NomicBertModel(config)
    randomize(model, seed)
    model.save_pretrained(dir)
    bert_tokenizer(dir, 2048)


def nomic_layout(dir: pathlib.Path) -> None:
    """Rewrites the transformers-saved NomicBERT in `dir` as nomic's
    checkpoints are (the inverse of transformers' conversion mapping for
    `nomic_bert`), then loads that back through the mapping and checks the
    same hidden states come out."""
    from safetensors.torch import load_file, save_file
    native = load_file(dir / "model.safetensors")
    config = json.loads((dir / "config.json").read_text())
    renames = [("embeddings.LayerNorm", "emb_ln"), ("self_attn.o_proj", "attn.out_proj"),
               ("mlp.up_proj", "mlp.fc11"), ("mlp.gate_proj", "mlp.fc12"),
               ("mlp.down_proj", "mlp.fc2"), ("post_attention_layernorm", "norm1"),
               ("post_mlp_layernorm", "norm2")]
    out = {}
    for name, t in native.items():
        if ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
            continue
        if ".self_attn.q_proj." in name:
            parts = [native[name.replace("q_proj", p)] for p in ("q_proj", "k_proj", "v_proj")]
            name, t = name.replace("self_attn.q_proj", "attn.Wqkv"), torch.cat(parts)
        for a, b in renames:
            name = name.replace(a, b)
        if name.startswith("layers."):
            name = "encoder." + name
        out[name] = t.contiguous()
    check = pathlib.Path(tempfile.mkdtemp(prefix="ferrox-nomic-"))
    (check / "config.json").write_text(json.dumps(config))
    save_file(out, check / "model.safetensors", metadata={"format": "pt"})
    # nomic-embed-text-v1.5's config.json, at this size.
    nomic = {
        "architectures": ["NomicBertModel"], "model_type": "nomic_bert",
        "activation_function": "swiglu", "n_embd": config["hidden_size"],
        "n_head": config["num_attention_heads"], "n_inner": config["intermediate_size"],
        "n_layer": config["num_hidden_layers"], "n_positions": 8192,
        "max_trained_positions": 2048, "vocab_size": config["vocab_size"],
        "layer_norm_epsilon": config["layer_norm_eps"], "rotary_emb_base": 1000,
        "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
        "rotary_emb_scale_base": None, "rotary_scaling_factor": None, "prenorm": False,
        "qkv_proj_bias": False, "mlp_fc1_bias": False, "mlp_fc2_bias": False, "causal": False,
        "type_vocab_size": config["type_vocab_size"], "pad_token_id": 0,
        "torch_dtype": "float32"}
    ids = torch.tensor([[2, 10, 11, 12, 3]])
    want = transformers.NomicBertModel.from_pretrained(dir).eval()(ids).last_hidden_state
    got = transformers.NomicBertModel.from_pretrained(check).eval()(ids).last_hidden_state
    if not torch.allclose(want, got, atol=1e-6):
        raise SystemExit("nomic's layout does not load back as the same model")
    save_file(out, dir / "model.safetensors", metadata={"format": "pt"})
    (dir / "config.json").write_text(json.dumps(nomic, indent=2) + "\n")


def modernbert_tokenizer(dir: pathlib.Path) -> transformers.PreTrainedTokenizerFast:
    """ModernBERT's kind of tokenizer: byte-level BPE (the fixtures' shared
    one, its specials and BERT's) with [CLS] text [SEP], the pair [CLS] a
    [SEP] b [SEP] (b's of type 1, which ModernBERT does not read); what
    llama.cpp's converter reads as GPT-2's vocabulary."""
    tok = bpe.build(extra=("[CLS]", "[SEP]", "[MASK]", "[UNK]"))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
        pad_token="<pad>", mask_token="[MASK]", model_max_length=128,
        model_input_names=["input_ids", "attention_mask"])
    fast.save_pretrained(dir)
    return fast


def modernbert_config(tok, **over) -> transformers.ModernBertConfig:
    """gte-modernbert's shape, tiny: alternating global and local layers (a
    window of 8), two RoPE bases, GeGLU, bias-free norms."""
    cls, sep = tok.convert_tokens_to_ids(["[CLS]", "[SEP]"])
    return transformers.ModernBertConfig(
        vocab_size=len(tok), hidden_size=64, num_hidden_layers=3,
        num_attention_heads=4, intermediate_size=96, max_position_embeddings=128,
        global_attn_every_n_layers=2, local_attention=8, hidden_activation="gelu",
        norm_eps=1e-5, norm_bias=False, pad_token_id=0, cls_token_id=cls, sep_token_id=sep,
        bos_token_id=cls, eos_token_id=sep,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 160000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        **over)


def modernbert_dir(dir: pathlib.Path, seed: int) -> None:
    tok = modernbert_tokenizer(dir)
    config = modernbert_config(tok, classifier_pooling="cls")
    model = transformers.ModernBertModel(config)
    randomize(model, seed)
    # The longest text must reach past the local window, so the fixture
    # tests the local layers' mask: all-global, the same weights differ.
    everywhere = transformers.ModernBertConfig(**{
        **config.to_dict(), "layer_types": ["full_attention"] * config.num_hidden_layers})
    wide = transformers.ModernBertModel(everywhere)
    wide.load_state_dict(model.state_dict())
    ids = torch.tensor([tok(TEXTS[2])["input_ids"]])
    gap = (model.eval()(ids).last_hidden_state - wide.eval()(ids).last_hidden_state).abs().max()
    if len(ids[0]) <= config.local_attention or gap < 1e-3:
        raise SystemExit(f"the local window is not exercised ({len(ids[0])} tokens, {gap})")
    model.save_pretrained(dir)


def xlmr_tokenizer(dir: pathlib.Path, corpus=None, vocab=120):
    """XLM-RoBERTa's tokenizer as bge-m3 ships it: a SentencePiece Unigram
    model (`sentencepiece.bpe.model`, trained on `corpus`, by default the
    fixtures', with SentencePiece's own `nmt_nfkc` normalization; a small
    vocabulary, so words split) and the `tokenizer.json` transformers makes
    of it (the compiled normalization table, <s> text </s>, fairseq's
    ids)."""
    import io
    import sentencepiece as spm
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus or bpe.CORPUS + TEXTS), model_writer=buf, vocab_size=vocab,
        model_type="unigram", normalization_rule_name="nmt_nfkc", character_coverage=1.0,
        hard_vocab_limit=False, num_threads=1, minloglevel=2)
    (dir / "sentencepiece.bpe.model").write_bytes(buf.getvalue())
    (dir / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "XLMRobertaTokenizer", "model_max_length": 128}))
    tok = transformers.AutoTokenizer.from_pretrained(dir)
    tok.save_pretrained(dir)
    return tok


def xlmr_dir(dir: pathlib.Path, seed: int) -> None:
    tok = xlmr_tokenizer(dir)
    config = transformers.XLMRobertaConfig(
        vocab_size=len(tok), hidden_size=64, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=128, max_position_embeddings=130,
        type_vocab_size=1, hidden_act="gelu", layer_norm_eps=1e-5, pad_token_id=1,
        bos_token_id=0, eos_token_id=2)
    model = transformers.XLMRobertaModel(config, add_pooling_layer=False)
    randomize(model, seed)
    model.save_pretrained(dir)


def qwen3_dir(dir: pathlib.Path, seed: int) -> None:
    config = transformers.Qwen3Config(
        vocab_size=bpe.VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=2, head_dim=32, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
        bos_token_id=2, eos_token_id=7, pad_token_id=0)
    config.architectures = ["Qwen3ForCausalLM"]
    config.matryoshka_dimensions = [16, 32]
    model = transformers.Qwen3Model(config)
    randomize(model, seed)
    model.save_pretrained(dir)
    tok = bpe.build()
    eot = tok.token_to_id("<|endoftext|>")
    # Qwen3-Embedding's tokenizer appends <|endoftext|>: the token pooled.
    tok.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", pair="$A <|endoftext|> $B:1 <|endoftext|>:1",
        special_tokens=[("<|endoftext|>", eot)])
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<pad>",
        padding_side="left", model_max_length=256)
    fast.save_pretrained(dir)


# EmbeddingGemma's prompts (its config_sentence_transformers.json), two of them.
GEMMA_PROMPTS = {"query": "task: search result | query: ", "document": "title: none | text: "}


def gemma_config(**over) -> transformers.Gemma3TextConfig:
    config = transformers.Gemma3TextConfig(**{
        "vocab_size": bpe.VOCAB, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 6, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 8,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
        "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
        "use_bidirectional_attention": True, "bos_token_id": 2, "eos_token_id": 1,
        "pad_token_id": 0,
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        **over})
    config.architectures = ["Gemma3TextModel"]
    return config


def gemma_dir(dir: pathlib.Path, seed: int) -> None:
    config = gemma_config()
    config.matryoshka_dimensions = [16, 32]
    model = transformers.Gemma3TextModel(config)
    randomize(model, seed)
    # The longest text must slide past the window both ways: causal, or
    # with every layer global, the same weights differ.
    tok = bpe.build()
    bos, eos = tok.token_to_id("<bos>"), tok.token_to_id("<eos>")
    ids = torch.tensor([[bos] + tok.encode(TEXTS[2]).ids + [eos]])
    want = model.eval()(ids).last_hidden_state
    for over in ({"use_bidirectional_attention": False},
                 {"layer_types": ["full_attention"] * config.num_hidden_layers}):
        other = transformers.Gemma3TextModel(gemma_config(**over))
        other.load_state_dict(model.state_dict())
        gap = (want - other.eval()(ids).last_hidden_state).abs().max()
        if len(ids[0]) <= config.sliding_window or gap < 1e-3:
            raise SystemExit(f"the window is not exercised ({over}: {len(ids[0])} tokens, {gap})")
    model.save_pretrained(dir)
    # EmbeddingGemma's tokenizer adds <bos> and <eos>.
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>", pair="<bos> $A <eos> $B:1 <eos>:1",
        special_tokens=[("<bos>", bos), ("<eos>", eos)])
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
        model_max_length=256)
    fast.save_pretrained(dir)


def gemma_dense(seed: int) -> list:
    """EmbeddingGemma's two Dense modules (bias-free, identity), 32 -> 64 -> 32."""
    mods = [models.Dense(32, 64, bias=False, activation_function=torch.nn.Identity()),
            models.Dense(64, 32, bias=False, activation_function=torch.nn.Identity())]
    for i, m in enumerate(mods):
        randomize(m, seed + i)
    return mods


def sentence_model(dir: pathlib.Path, pooling: str, normalize: bool, dense=(),
                   prompts=None) -> SentenceTransformer:
    t = models.Transformer(str(dir), model_args={"attn_implementation": "eager"})
    mods = [t, models.Pooling(t.get_word_embedding_dimension(), pooling_mode=pooling), *dense]
    if normalize:
        mods.append(models.Normalize())
    return SentenceTransformer(modules=mods, device="cpu", prompts=prompts)


def vectors(model: SentenceTransformer, texts: list, prompt_name=None) -> list:
    # One text a call, so padding never enters; the server's batching is
    # checked against these.
    out = []
    for t in texts:
        e = model.encode([t], convert_to_tensor=True, normalize_embeddings=False,
                         prompt_name=prompt_name)[0]
        out.append([round(float(x), 7) for x in e.float()])
    return out


def without_normalize(dir: pathlib.Path) -> SentenceTransformer:
    """The model saved in `dir`, every module but Normalize (its Dense
    modules as saved)."""
    saved = SentenceTransformer(str(dir), device="cpu",
                                model_kwargs={"attn_implementation": "eager"})
    return SentenceTransformer(modules=[m for m in saved
                                        if not isinstance(m, models.Normalize)], device="cpu")


def build(name: str, make, pooling: str, normalize: bool, dims: list, seed: int,
          layout=None) -> dict:
    dir = OUT / name
    dir.mkdir(parents=True, exist_ok=True)
    make(dir, seed)
    dense, prompts = HEADS.get(name, (lambda _: [], None))
    model = sentence_model(dir, pooling, normalize, dense(seed + 100), prompts)
    model.save(str(dir))
    # sentence-transformers' generated model card: nothing the server reads.
    (dir / "README.md").unlink(missing_ok=True)
    texts = TEXTS + MORE_TEXTS.get(name, [])
    raw = vectors(without_normalize(dir) if prompts else sentence_model(dir, pooling, False),
                  texts)
    ref = {"family": name, "pooling": pooling, "normalize": normalize, "texts": texts,
           "tokens": [model.tokenizer(t)["input_ids"] for t in texts],
           "embeddings": vectors(model, texts), "raw": raw,
           "torch": torch.__version__, "transformers": transformers.__version__}
    if prompts:
        # Each prompt before each text, as sentence-transformers encodes it.
        ref["prompts"] = {p: {"tokens": [model.tokenizer(prompts[p] + t)["input_ids"]
                                         for t in texts],
                              "embeddings": vectors(model, texts, p)} for p in prompts}
    if dims:
        ref["dimensions"] = {str(d): [normed(v[:d]) for v in raw] for d in dims}
    (dir / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    if layout:
        layout(dir)
    return ref


# Texts some fixtures also encode: for XLM-RoBERTa, what its normalization
# table changes (full-width letters, a ligature, tabs, runs of spaces).
MORE_TEXTS = {"xlmr": ["  Ｒｅｄ,\tgreen  and\nblue: ﬁve  ", "ＦＲＡＮＣＥ ① ＜ ½"]}

# The modules after pooling (a function of the seed) and the prompts of
# the fixtures that have them.
HEADS = {"embeddinggemma": (gemma_dense, GEMMA_PROMPTS)}


def convert(name: str, src: pathlib.Path) -> None:
    """The GGUF llama.cpp's converter makes of fixture `name` (f32)."""
    here = pathlib.Path(__file__).resolve().parent
    dir = OUT / name
    cmd = [sys.executable, str(here / "convert.py"), str(src), str(dir), "--outfile",
           str(dir / "model.gguf"), "--outtype", "f32", "--model-name", "ferrox tiny reference"]
    if name in HEADS:
        cmd.append("--sentence-transformers-dense-modules")
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"convert_hf_to_gguf.py failed on {name}:\n{done.stderr[-3000:]}")


def normed(v: list) -> list:
    n = sum(x * x for x in v) ** 0.5
    return [round(x / n, 7) for x in v]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--llama-src", type=pathlib.Path, help="llama.cpp source (peer-llama src)")
    p.add_argument("--only", nargs="+", metavar="NAME",
                   help="remake only these fixtures (each is seeded alone, so alike either way)")
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    fixtures = {
        "bert": (bert_dir, "cls", True, [], 2001, None),
        "bert_mean": (bert_dir, "mean", False, [], 2002, None),
        "qwen3_embed": (qwen3_dir, "lasttoken", True, [16, 32], 2003, None),
        "xlmr": (xlmr_dir, "mean", True, [], 2005, None),
        "nomic": (nomic_dir, "mean", True, [], 2006, nomic_layout),
        "modernbert": (modernbert_dir, "cls", True, [], 2007, None),
        "embeddinggemma": (gemma_dir, "mean", True, [16, 32], 2008, None),
    }
    # What llama.cpp's converter also writes as GGUF.
    gguf = ["bert", "nomic", "embeddinggemma", "xlmr", "modernbert"]
    for name in a.only or fixtures:
        make, pooling, norm, dims, seed, layout = fixtures[name]
        torch.manual_seed(0)
        build(name, make, pooling, norm, dims, seed, layout=layout)
        if a.llama_src and name in gguf:
            convert(name, a.llama_src)
    size = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"{size / 1e6:.2f} MB in {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
