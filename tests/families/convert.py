"""llama.cpp's convert_hf_to_gguf.py on a tiny reference model:
`convert.py LLAMA_SRC MODEL_DIR [converter args...]`. Its vocabulary checks
know only published tokenizers (a hash of a fixed text's tokens, or a
sentencepiece file); the tiny byte-level BPE tokenizer is written as GPT-2's,
which is what it is. Everything else is the converter's own."""

import json
import pathlib
import sys
import tempfile

src, model, args = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.path[:0] = [src, f"{src}/gguf-py"]

import convert_hf_to_gguf  # noqa: E402
import conversion  # noqa: E402
from conversion import base  # noqa: E402

FAMILIES = ["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
            "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM", "MixtralForCausalLM",
            "Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "GptOssForCausalLM",
            "Mamba2ForCausalLM", "GraniteMoeHybridForCausalLM", "Qwen3_5ForCausalLM",
            "Qwen3NextForCausalLM", "Gemma3TextModel", "Lfm2ForCausalLM",
            "NemotronHForCausalLM", "Llama4ForCausalLM"]
# transformers 5 saves Granite 4.0-H's layer kinds as linear/full attention;
# the Hub's configs, which the converter reads, say mamba/attention.
HUB_KINDS = {"linear_attention": "mamba", "full_attention": "attention"}
# Nemotron-H's as its pattern string (M mamba, * attention, - MLP), read as
# the file has it (below): the converter takes any `num_experts_per_tok`,
# which transformers 5 adds to every Nemotron-H config, for the
# mixture-of-experts architecture.
NEMOTRON_KINDS = {"linear_attention": "M", "full_attention": "*", "mlp": "-", "moe": "E"}


def gpt2_vocab(self):
    self._set_vocab_gpt2()


base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
for name in FAMILIES:
    cls = conversion.get_model_class(name)
    # The class's own choice of vocabulary reader, and every parent's.
    for c in cls.__mro__:
        if "set_vocab" in c.__dict__:
            c.set_vocab = gpt2_vocab


def hub_spelled(model: str) -> str:
    """`model`, or a folder beside it whose config spells Granite 4.0-H's
    or Nemotron-H's layer kinds as the Hub does (the other files linked)."""
    d = pathlib.Path(model)
    config = json.loads((d / "config.json").read_text())
    if config.get("model_type") == "granitemoehybrid":
        config["layer_types"] = [HUB_KINDS.get(k, k) for k in config.get("layer_types", [])]
    elif config.get("model_type") == "nemotron_h":
        kinds = config.pop("layers_block_type")
        config["hybrid_override_pattern"] = "".join(NEMOTRON_KINDS[k] for k in kinds)
        config["num_hidden_layers"] = len(kinds)
        if "moe" not in kinds:
            # The experts' defaults transformers 5 writes, which the Hub's
            # dense configs do not have (the converter writes them, and
            # llama.cpp then wants experts).
            for k in [k for k in config if k.startswith(("n_routed", "n_shared", "moe_"))]:
                config.pop(k)
            for k in ("num_experts_per_tok", "n_group", "topk_group", "norm_topk_prob",
                      "routed_scaling_factor"):
                config.pop(k, None)
    else:
        return model
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="ferrox-convert-"))
    for f in d.iterdir():
        if f.name != "config.json":
            (tmp / f.name).symlink_to(f.resolve())
    (tmp / "config.json").write_text(json.dumps(config))
    return str(tmp)


def plain_hparams(dir_model, is_mistral_format):
    return json.loads((pathlib.Path(dir_model) / "config.json").read_text())


# transformers 5 knows NomicBERT natively and its config drops nomic's keys
# (`n_embd`, ...) for its own defaults (768 wide, 12 layers): the converter,
# written when transformers did not know the type and it read config.json
# as it is, would write those defaults. Read it as it is.
# Nemotron-H's likewise: transformers 5's config class adds the experts'
# keys the converter takes for the mixture-of-experts architecture.
if json.loads((pathlib.Path(model) / "config.json").read_text()).get("model_type") in (
        "nomic_bert", "nemotron_h"):
    base.ModelBase.load_hparams = staticmethod(plain_hparams)

sys.argv = ["convert_hf_to_gguf.py", hub_spelled(model), *args]
convert_hf_to_gguf.main()
