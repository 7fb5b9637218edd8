"""Writes a *scripted* tiny Llama as a GGUF: greedy decoding emits a fixed
token chain, whatever the prompt, so that tests can check what the server
makes of a known output (reasoning split from the answer, harmony channels,
calls in the model's markup). Standard library only.

How: one layer; each chain token embeds as a one-hot of its own, every
other token as e(0), and the output row of each chain token reads its
predecessor's dimension: after any prompt the model says the chain's first
token, then the next, ... up to an end token (the engine stops there; the
chain may go on, to show it did). A token the chain repeats (harmony's
`<|channel|>`) is told apart by a flag that attention and the MLP carry
(see `_weights`). The tokenizer is SmolLM2's,
copied from its GGUF, with extra control tokens appended where asked
(harmony's `<|channel|>` ...): tags spelled over several ordinary tokens
(`<think>` is not one token there) test tags split across tokens.
"""

import array
import pathlib
import struct

# GGUF value types.
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?",
        U64: "Q", I64: "q", F64: "d"}
CONTROL = 3
HIDDEN, HEADS = 128, 2


def read_metadata(path: str) -> dict:
    """A GGUF's metadata: name -> (type, value); arrays as (ARR, (item type, list))."""
    with open(path, "rb") as f:
        def rd(fmt):
            return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))

        def rstr():
            (n,) = rd("Q")
            return f.read(n).decode("utf-8")

        def rval(t):
            if t == STR:
                return rstr()
            if t == ARR:
                (et,) = rd("I")
                (n,) = rd("Q")
                if et in _FMT:
                    size = struct.calcsize(_FMT[et])
                    return et, list(struct.unpack(f"<{n}{_FMT[et]}", f.read(n * size)))
                return et, [rval(et) for _ in range(n)]
            return rd(_FMT[t])[0]

        magic, _version, _tensors, count = struct.unpack("<IIQQ", f.read(24))
        assert magic == 0x46554747, f"{path} is not a GGUF"
        meta = {}
        for _ in range(count):
            key = rstr()
            (t,) = rd("I")
            meta[key] = (t, rval(t))
        return meta


def _pack_str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _pack_val(t: int, v) -> bytes:
    if t == STR:
        return _pack_str(v)
    if t == ARR:
        et, items = v
        head = struct.pack("<IQ", et, len(items))
        if et in _FMT:
            return head + struct.pack(f"<{len(items)}{_FMT[et]}", *items)
        return head + b"".join(_pack_val(et, i) for i in items)
    return struct.pack("<" + _FMT[t], v)


def _byte_unicode() -> dict:
    """GPT-2's byte -> printable character map (the vocabulary's spelling)."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


class Vocab:
    """SmolLM2's tokens plus `extra` control tokens, and a speller that
    writes text over ordinary tokens never used before in the chain."""

    def __init__(self, source_gguf: str, extra: list[str]):
        self.meta = read_metadata(source_gguf)
        self.tokens = list(self.meta["tokenizer.ggml.tokens"][1][1]) + extra
        types = list(self.meta["tokenizer.ggml.token_type"][1][1]) + [CONTROL] * len(extra)
        self.types = types
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        self.longest = max(len(t) for t in self.tokens)
        self.bytes = _byte_unicode()
        # The last tokens of the prompts (ChatML's and harmony's generation
        # prompts): in the chain they would restart it.
        self.used = {self.ids[t] for t in ("Ċ", "assistant", "ĊĊ") if t in self.ids}

    def special(self, token: str) -> list[int]:
        return [self.ids[token]]

    def spell(self, text: str) -> list[int]:
        """`text` as ordinary tokens, longest first, none used twice (backing
        off to shorter ones where a longer one leads to a dead end)."""
        s = "".join(self.bytes[b] for b in text.encode("utf-8"))

        def go(at: int) -> list[int] | None:
            if at == len(s):
                return []
            for n in range(min(self.longest, len(s) - at), 0, -1):
                i = self.ids.get(s[at:at + n])
                if i is None or i in self.used or self.types[i] != 1:
                    continue
                self.used.add(i)
                rest = go(at + n)
                if rest is not None:
                    return [i] + rest
                self.used.discard(i)
            return None

        out = go(0)
        if out is None:
            raise ValueError(f"cannot spell {text!r} with unused tokens")
        return out


def write(path: pathlib.Path, vocab: Vocab, chain: list[int], template: str,
          flag: int | None = None) -> pathlib.Path:
    """Writes the scripted model to `path` (a .gguf) and returns it. A token
    may come twice in `chain` when `flag` (a chain position) lies between
    its two places: see `_weights`."""
    tensors = _weights(len(vocab.tokens), chain, flag)
    meta = {k: v for k, v in vocab.meta.items() if k.startswith("tokenizer.")}
    meta["tokenizer.ggml.tokens"] = (ARR, (STR, vocab.tokens))
    meta["tokenizer.ggml.token_type"] = (ARR, (I32, vocab.types))
    meta["tokenizer.chat_template"] = (STR, template)
    meta.update({
        "general.architecture": (STR, "llama"),
        "general.name": (STR, "scripted"),
        "general.alignment": (U32, 32),
        "llama.block_count": (U32, 1),
        "llama.context_length": (U32, 1024),
        "llama.embedding_length": (U32, HIDDEN),
        "llama.feed_forward_length": (U32, HIDDEN),
        "llama.attention.head_count": (U32, HEADS),
        "llama.attention.head_count_kv": (U32, HEADS),
        "llama.rope.freq_base": (F32, 10000.0),
        "llama.rope.dimension_count": (U32, HIDDEN // HEADS),
        "llama.attention.layer_norm_rms_epsilon": (F32, 1e-5),
        "llama.vocab_size": (U32, len(vocab.tokens)),
    })
    head = struct.pack("<IIQQ", 0x46554747, 3, len(tensors), len(meta))
    head += b"".join(_pack_str(k) + struct.pack("<I", t) + _pack_val(t, v)
                     for k, (t, v) in meta.items())
    infos, blobs, offset = b"", [], 0
    for name, (dims, data) in tensors.items():
        infos += _pack_str(name) + struct.pack("<I", len(dims))
        infos += struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", 0, offset)
        blob = data.tobytes()
        blob += b"\0" * (-len(blob) % 32)
        blobs.append(blob)
        offset += len(blob)
    with open(path, "wb") as f:
        f.write(head + infos)
        f.write(b"\0" * (-f.tell() % 32))
        for b in blobs:
            f.write(b)
    return path


def _weights(n_vocab: int, chain: list[int], flag: int | None) -> dict:
    """The tensors: name -> (GGUF dims, innermost first; f32 data).

    Residual dimensions: 0 for every token outside the chain, one per
    distinct chain token, FLAG, and one per repeated token. Without repeats
    only the embeddings and the output matter (attention and MLP write
    nothing). A repeated token's second place is told from its first by the
    flag: attention is uniform (q = k = 0) and only the flag token has a
    value, so once the flag token is in the context the attention output
    carries FLAG; an MLP unit per repeated token fires on (that token AND
    FLAG) (SwiGLU: gate reads FLAG, up reads the token) and writes the
    token's second dimension, which the output maps to its second successor.
    """
    dim = {}
    for t in chain:
        dim.setdefault(t, len(dim) + 1)
    flag_dim = len(dim) + 1
    second = {}  # repeated token -> (unit, its second dimension)
    succ = []  # (successor token, reading dimension)
    seen = set()
    for k, t in enumerate(chain):
        if t in seen:
            assert flag is not None and k > flag > chain.index(t), "a chain token twice would loop"
            assert t not in second, "three times is not scripted"
            second[t] = (len(second), flag_dim + 1 + len(second))
        seen.add(t)
    assert flag_dim + 1 + len(second) <= HIDDEN, "one dimension per chain token"
    reading = [0]  # what the state before chain[k] reads
    for k, t in enumerate(chain[:-1]):
        nxt_is_second = t in second and k > (flag if flag is not None else len(chain))
        reading.append(second[t][1] if nxt_is_second else dim[t])
    h = HIDDEN
    embed = array.array("f", bytes(4 * n_vocab * h))
    output = array.array("f", bytes(4 * n_vocab * h))
    for t in range(n_vocab):
        embed[t * h + dim.get(t, 0)] = 1.0
    for t, r in zip(chain, reading):
        output[t * h + r] = 10.0
    zero = lambda: array.array("f", bytes(4 * h * h))
    q, k_, v, o, gate, up, down = (zero() for _ in range(7))
    if flag is not None:
        # [out][in]: value 0 of head 0 reads the flag token; o writes FLAG.
        v[0 * h + dim[chain[flag]]] = 100.0
        o[flag_dim * h + 0] = 1.0
        for t, (unit, d2) in second.items():
            gate[unit * h + flag_dim] = 1.0
            up[unit * h + dim[t]] = 1.0
            down[d2 * h + unit] = 1.0
    ones = array.array("f", [1.0] * h)
    return {
        "token_embd.weight": ((h, n_vocab), embed),
        "output.weight": ((h, n_vocab), output),
        "output_norm.weight": ((h,), ones),
        "blk.0.attn_norm.weight": ((h,), ones),
        "blk.0.ffn_norm.weight": ((h,), ones),
        "blk.0.attn_q.weight": ((h, h), q),
        "blk.0.attn_k.weight": ((h, h), k_),
        "blk.0.attn_v.weight": ((h, h), v),
        "blk.0.attn_output.weight": ((h, h), o),
        "blk.0.ffn_gate.weight": ((h, h), gate),
        "blk.0.ffn_up.weight": ((h, h), up),
        "blk.0.ffn_down.weight": ((h, h), down),
    }
