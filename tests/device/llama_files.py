"""Writes a random-weight Llama as a Hugging Face directory with torch:
config.json, model.safetensors (bf16), a word-level tokenizer.json and a
tokenizer_config.json, the shape ferrox-server's safetensors loader reads
(tests/server/tiny_model.py writes the same shape without torch).

Weights are drawn on `device` (the GPU on the device machine: fast) and kept
there for the reference forward; each tensor goes to the file as it is
drawn, so the host holds only the few tensors being written."""

import concurrent.futures
import dataclasses
import json
import os
import pathlib
import threading

import torch

# Words the generated tokenizer knows besides w<i>: what ferrox-bench's
# prompts are made of ("\nQuestion 12: hello hello ..."), so that each of
# its words is one token.
BENCH_WORDS = ["hello", "Question", ":"] + [str(i) for i in range(1000)]
SPECIALS = ["<unk>", "<s>", "</s>"]
EOS_ID = 2
WRITERS = 8


@dataclasses.dataclass(frozen=True)
class Geometry:
    """The shape of a Llama decoder."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    context: int
    rope_theta: float
    rms_eps: float = 1e-5
    # Standard deviation of the logits over the vocabulary for a unit-RMS
    # final hidden state: large enough that the top tokens are apart.
    logit_std: float = 3.0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def shapes(self) -> dict:
        """Every tensor's name and shape, Hugging Face's names."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        out = {
            "model.embed_tokens.weight": (self.vocab, h),
            "model.norm.weight": (h,),
            "lm_head.weight": (self.vocab, h),
        }
        for i in range(self.layers):
            p = f"model.layers.{i}."
            out[p + "input_layernorm.weight"] = (h,)
            out[p + "post_attention_layernorm.weight"] = (h,)
            out[p + "self_attn.q_proj.weight"] = (h, h)
            out[p + "self_attn.k_proj.weight"] = (kv, h)
            out[p + "self_attn.v_proj.weight"] = (kv, h)
            out[p + "self_attn.o_proj.weight"] = (h, h)
            out[p + "mlp.gate_proj.weight"] = (self.intermediate, h)
            out[p + "mlp.up_proj.weight"] = (self.intermediate, h)
            out[p + "mlp.down_proj.weight"] = (h, self.intermediate)
        return out

    def params(self) -> int:
        total = 0
        for shape in self.shapes().values():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total


# Llama-3.1-8B's geometry, without its rope scaling (keeps the reference plain).
LLAMA_8B = Geometry(hidden=4096, intermediate=14336, layers=32, heads=32, kv_heads=8,
                    vocab=128256, context=131072, rope_theta=500000.0)
# Small enough for a debug CPU build; GQA (4 query heads on 2 KV heads) as the 8B.
TINY = Geometry(hidden=256, intermediate=512, layers=4, heads=4, kv_heads=2,
                vocab=2048, context=2048, rope_theta=10000.0)


def _std(name: str, shape: tuple, g: Geometry) -> float:
    """Scale of a weight: unit-variance outputs for unit-RMS inputs, so the
    residual stream neither vanishes nor explodes over the layers."""
    if name.endswith("embed_tokens.weight"):
        return 1.0
    if name == "lm_head.weight":
        return g.logit_std / g.hidden ** 0.5
    return 1.0 / shape[1] ** 0.5


def draw(name: str, shape: tuple, g: Geometry, gen: torch.Generator, device) -> torch.Tensor:
    """One weight in bf16. Norm weights near 1 (not exactly 1, so a loader
    that dropped them would be caught)."""
    if len(shape) == 1:
        t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
        return (1.0 + 0.1 * t).to(torch.bfloat16)
    t = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)
    return t.mul_(_std(name, shape, g))


def vocab(g: Geometry) -> list:
    """Token strings by id."""
    words = SPECIALS + BENCH_WORDS
    words = words[: g.vocab]
    words += [f"w{i}" for i in range(len(words), g.vocab)]
    return words


def write(dir: pathlib.Path, g: Geometry, device, seed: int = 0) -> dict:
    """Writes the model into `dir`; returns its weights (on `device`)."""
    dir.mkdir(parents=True, exist_ok=True)
    shapes = g.shapes()
    header, offset = {}, 0
    for name, shape in shapes.items():
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    weights = {}
    start = 8 + len(head)
    fd = os.open(dir / "model.safetensors", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.pwrite(fd, len(head).to_bytes(8, "little") + head, 0)
        # Drawn on the device one tensor after another, written by threads at
        # their offsets (one writer is what limits a 16 GB file); at most
        # WRITERS tensors wait on the host.
        slots = threading.BoundedSemaphore(WRITERS)
        with concurrent.futures.ThreadPoolExecutor(WRITERS) as pool:
            jobs = []
            for name, shape in shapes.items():
                w = draw(name, shape, g, gen, device)
                weights[name] = w
                slots.acquire()
                # The raw little-endian bf16 bits, through numpy (no copy on the host).
                host = w.view(torch.int16).cpu().numpy()
                offset = start + header[name]["data_offsets"][0]
                jobs.append(pool.submit(_write_at, fd, host, offset, slots))
            for j in jobs:
                j.result()
    finally:
        os.close(fd)
    _write_text_files(dir, g)
    return weights


def _write_at(fd: int, host, offset: int, slots: threading.BoundedSemaphore) -> None:
    try:
        view = memoryview(host).cast("B")
        while view:
            n = os.pwrite(fd, view, offset)
            view, offset = view[n:], offset + n
    finally:
        slots.release()


def _write_text_files(dir: pathlib.Path, g: Geometry) -> None:
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": g.hidden, "intermediate_size": g.intermediate,
        "num_hidden_layers": g.layers, "num_attention_heads": g.heads,
        "num_key_value_heads": g.kv_heads, "head_dim": g.head_dim, "vocab_size": g.vocab,
        "max_position_embeddings": g.context, "rope_theta": g.rope_theta,
        "rms_norm_eps": g.rms_eps, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "bos_token_id": 1, "eos_token_id": EOS_ID, "hidden_act": "silu",
    }
    (dir / "config.json").write_text(json.dumps(config, indent=1))
    words = vocab(g)
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": w, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for i, w in enumerate(SPECIALS)],
        "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": {w: i for i, w in enumerate(words)},
                  "unk_token": "<unk>"},
    }
    (dir / "tokenizer.json").write_text(json.dumps(tokenizer))
    template = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
                "{% if add_generation_prompt %}assistant :{% endif %}")
    tokenizer_config = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": template,
                        "model_max_length": g.context}
    (dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
