"""Writes a Hugging Face tokenizer directory for a GGUF model with a GPT-2
style (byte-level BPE) vocabulary, from the file's own metadata, so aiperf
can synthesise prompts of a given token length offline.

    python tokenizer_from_gguf.py MODEL.gguf OUT_DIR
"""

import json
import pathlib
import sys

from gguf import GGUFReader
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

CONTROL = 3  # GGUF token type of control tokens


def strings(field) -> list[str]:
    return [bytes(field.parts[i]).decode() for i in field.data]


def main(model: str, out: str) -> None:
    fields = GGUFReader(model).fields
    kind = bytes(fields["tokenizer.ggml.model"].parts[-1]).decode()
    if kind != "gpt2":
        sys.exit(f"tokenizer_from_gguf: a {kind!r} vocabulary is not byte-level BPE")
    tokens = strings(fields["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in strings(fields["tokenizer.ggml.merges"])]
    types = [int(fields["tokenizer.ggml.token_type"].parts[i][0])
             for i in fields["tokenizer.ggml.token_type"].data]
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    pre = bytes(fields["tokenizer.ggml.pre"].parts[-1]).decode() if "tokenizer.ggml.pre" in fields else ""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    # SmolLM's pre-tokenizer splits digits one by one before the GPT-2 regex.
    tk.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                        if pre == "smollm" else byte_level)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([t for t, k in zip(tokens, types) if k == CONTROL])
    eos = tokens[int(fields["tokenizer.ggml.eos_token_id"].parts[-1][0])]
    path = pathlib.Path(out)
    path.mkdir(parents=True, exist_ok=True)
    tk.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "model_max_length": 8192}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
