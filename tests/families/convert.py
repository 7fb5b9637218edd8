"""llama.cpp's convert_hf_to_gguf.py on a tiny reference model:
`convert.py LLAMA_SRC MODEL_DIR [converter args...]`. Its vocabulary checks
know only published tokenizers (a hash of a fixed text's tokens, or a
sentencepiece file); the tiny byte-level BPE tokenizer is written as GPT-2's,
which is what it is. Everything else is the converter's own."""

import sys

src, model, args = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.path[:0] = [src, f"{src}/gguf-py"]

import convert_hf_to_gguf  # noqa: E402
import conversion  # noqa: E402
from conversion import base  # noqa: E402

FAMILIES = ["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
            "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM", "MixtralForCausalLM",
            "Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "GptOssForCausalLM",
            "Mamba2ForCausalLM", "Qwen3_5ForCausalLM", "Qwen3NextForCausalLM"]


def gpt2_vocab(self):
    self._set_vocab_gpt2()


base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
for name in FAMILIES:
    cls = conversion.get_model_class(name)
    # The class's own choice of vocabulary reader, and every parent's.
    for c in cls.__mro__:
        if "set_vocab" in c.__dict__:
            c.set_vocab = gpt2_vocab

sys.argv = ["convert_hf_to_gguf.py", model, *args]
convert_hf_to_gguf.main()
