"""The tiny tokenizer every reference model shares: byte-level BPE over a
few sentences, the family's special tokens first, exactly VOCAB entries (so
llama.cpp's converter, which trims embeddings to the tokenizer, keeps every
row), and a small chat template in the family's own markup."""

import json
import pathlib

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

VOCAB = 320
# Ids 0..7: the specials every family's template or end set names.
SPECIALS = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<|im_start|>",
            "<|im_end|>", "<|endoftext|>"]
CORPUS = [
    "The capital of France is Paris. The capital of Germany is Berlin.",
    "A sliding window keeps only the last few positions of the sequence.",
    "Small random models answer nothing useful, but they answer the same way twice.",
    "Name three colors: red, green and blue. Count to five: one two three four five.",
] * 8

# Chat templates in each family's markup (short ones of our own, not the
# checkpoints'): enough for the server's template, end-of-turn and
# `enable_thinking` paths.
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
          "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
          "{% endif %}{% endif %}")
GEMMA = ("{{ bos_token }}{% for m in messages %}<start_of_turn>"
         "{{ 'model' if m.role == 'assistant' else m.role }}\n{{ m.content }}<end_of_turn>\n"
         "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
PLAIN = ("{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
         "{% if add_generation_prompt %}assistant:{% endif %}")
TEMPLATES = {"chatml": CHATML, "gemma": GEMMA, "plain": PLAIN}


def build(extra: tuple = ()) -> Tokenizer:
    """The tokenizer, with a family's `extra` specials after the shared ones."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS + list(extra),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    if tok.get_vocab_size() != VOCAB:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size()} entries, want {VOCAB}")
    return tok


def build_spm(extra: tuple = ()) -> Tokenizer:
    """SentencePiece-style BPE (Gemma's kind): spaces as `▁`, unknown
    characters as byte tokens `<0x00>`..`<0xFF>`, which llama.cpp's Gemma 4
    converter takes (its `LlamaHfVocab`)."""
    tok = Tokenizer(models.BPE(byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS + list(extra) + bytes_,
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    if tok.get_vocab_size() != VOCAB:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size()} entries, want {VOCAB}")
    return tok


def write(dir: pathlib.Path, template: str, eos: str, extra: tuple = (), spm: bool = False) -> None:
    """tokenizer.json and tokenizer_config.json into `dir`: byte-level BPE,
    or SentencePiece-style where `spm`."""
    (build_spm(extra) if spm else build(extra)).save(str(dir / "tokenizer.json"))
    config = {
        "bos_token": "<bos>",
        "eos_token": eos,
        "pad_token": "<pad>",
        "chat_template": TEMPLATES[template],
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 4096,
    }
    (dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
