"""The tiny reference models, one per family: each config small (width 64,
windows of 8 to 12), the features its family has switched on (Llama 3's
RoPE scaling, Qwen2's window on some layers, Mistral's on all, Qwen3's q/k
norms and wide heads, Gemma 2's soft-caps and alternation, Gemma 3's
pattern and two RoPEs, Phi-3's fused tensors, partial rotary and LongRoPE;
Mixtral's experts, Qwen3-MoE's many small ones renormalised, Qwen2-MoE's
shared expert and a dense layer among them; gpt-oss's sinks, biases,
clamped SwiGLU, YaRN and alternating windows; Mamba-2's recurrent layers
with grouped B/C and chunks of 8 so its scan crosses chunk edges; Granite
4.0-H's Mamba-2 and NoPE attention layers with its multipliers; Qwen3.5's
Gated DeltaNet layers among gated attention layers, and Qwen3-Next's with
its fused projections and Qwen2-MoE-style experts, a prompt longer than the
delta rule's block of 64; LFM2's short convolutions among q/k-normed
attention layers; Granite 4.0-H's experts stacked gate-then-up beside its
shared MLP; Nemotron-H's Mamba-2, attention and squared-ReLU MLP layers
apart; Gemma 4's full layers with heads of their own and values from keys,
shared KV, per-layer inputs, and its experts beside the MLP), and the
prompts its references are recorded for."""

import dataclasses

from tokenizer import VOCAB

COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, bos_token_id=2,
              eos_token_id=1, pad_token_id=0, rms_norm_eps=1e-6)


@dataclasses.dataclass
class Run:
    """One set of references: the prompts (lengths of random ids), the
    context the Rust side serves (LongRoPE picks its factors by it; None:
    the model's own), and config changes for this run (a window switched
    off, for the GGUF that llama.cpp's converter writes without one)."""
    name: str
    prompts: list
    context: int | None = None
    overrides: dict = dataclasses.field(default_factory=dict)
    # Which file this run checks: "safetensors", "gguf" or "both".
    files: str = "both"


@dataclasses.dataclass
class Family:
    name: str
    config: dict
    dtype: str  # storage: "float16" or "bfloat16"
    template: str  # tokenizer.TEMPLATES key
    eos: str
    runs: list
    steps: int = 12
    # Written as GGUF too (llama.cpp's converter maps the layout).
    gguf: bool = True
    # More arguments to llama.cpp's converter.
    convert_args: list = dataclasses.field(default_factory=list)
    # Special tokens of the family's own that llama.cpp's converter looks
    # up (after the shared ones; prompts draw from past them).
    specials: tuple = ()
    # The seed its weights and prompts draw from. None: 1000 plus its place
    # in FAMILIES (the first twenty's); later ones name theirs, so that
    # adding a family moves no other's fixture.
    seed: int | None = None
    # SentencePiece-style BPE instead of byte-level (Gemma 4's converter
    # takes no other).
    spm: bool = False

    def seed_at(self, place: int) -> int:
        return self.seed if self.seed is not None else 1000 + place


def _cfg(arch: str, model_type: str, **kw) -> dict:
    return dict(COMMON, architectures=[arch], model_type=model_type, **kw)


LONG = [21, 38, 57]  # longer than every window, and crossing it twice or more
PLAIN = [Run("default", LONG)]
# llama.cpp's converter writes these without their window (and llama.cpp
# runs them without): the GGUF is checked against the same weights with the
# window off.
def _windowed(off: dict) -> list:
    return [Run("default", LONG, files="safetensors"),
            Run("no-window", LONG, overrides=off, files="gguf")]


FAMILIES = [
    Family("llama", _cfg("LlamaForCausalLM", "llama", num_hidden_layers=2,
                         tie_word_embeddings=False, rope_theta=10000.0,
                         rope_scaling=dict(rope_type="llama3", factor=4.0, low_freq_factor=1.0,
                                           high_freq_factor=4.0,
                                           original_max_position_embeddings=32)),
           "float16", "plain", "<eos>", PLAIN),
    Family("qwen2", _cfg("Qwen2ForCausalLM", "qwen2", num_hidden_layers=3,
                         tie_word_embeddings=True, use_sliding_window=True, sliding_window=12,
                         max_window_layers=1, rope_theta=10000.0, eos_token_id=6),
           "float16", "chatml", "<|im_end|>", _windowed(dict(use_sliding_window=False))),
    Family("mistral", _cfg("MistralForCausalLM", "mistral", num_hidden_layers=2,
                           tie_word_embeddings=False, sliding_window=8, rope_theta=10000.0),
           "float16", "plain", "<eos>", _windowed(dict(sliding_window=None))),
    Family("qwen3", _cfg("Qwen3ForCausalLM", "qwen3", num_hidden_layers=2, head_dim=32,
                         tie_word_embeddings=True, rope_theta=1000000.0, eos_token_id=6,
                         use_sliding_window=False),
           "float16", "chatml", "<|im_end|>", PLAIN),
    Family("gemma2", _cfg("Gemma2ForCausalLM", "gemma2", num_hidden_layers=4, head_dim=16,
                          query_pre_attn_scalar=16, sliding_window=8,
                          attn_logit_softcapping=5.0, final_logit_softcapping=10.0,
                          hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                          rope_theta=10000.0),
           "bfloat16", "gemma", "<eos>", PLAIN),
    Family("gemma3", _cfg("Gemma3ForCausalLM", "gemma3_text", num_hidden_layers=6, head_dim=32,
                          query_pre_attn_scalar=32, sliding_window=8,
                          hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                          rope_parameters=dict(
                              full_attention=dict(rope_type="linear", factor=2.0,
                                                  rope_theta=1000000.0),
                              sliding_attention=dict(rope_type="default", rope_theta=10000.0))),
           "bfloat16", "gemma", "<eos>", PLAIN),
    # Served within the pre-training length (512): LongRoPE's short factors;
    # served to 2048: the long ones (llama.cpp's context is at least 256, so
    # the short one must be longer than that for it to be checked too).
    Family("phi3", _cfg("Phi3ForCausalLM", "phi3", num_hidden_layers=2,
                        max_position_embeddings=2048, original_max_position_embeddings=512,
                        partial_rotary_factor=0.5,
                        tie_word_embeddings=False, rope_theta=10000.0,
                        rope_scaling=dict(type="longrope", short_factor=[1.0, 1.5, 2.5, 4.0],
                                          long_factor=[1.2, 2.0, 5.0, 9.0])),
           "float16", "plain", "<eos>",
           [Run("short", [21, 38], context=512), Run("long", [530, 577], context=2048)]),
    # Appended: a family's seed is its index, so the earlier ones stay as committed.
    Family("mixtral", _cfg("MixtralForCausalLM", "mixtral", num_hidden_layers=2,
                           intermediate_size=64, num_local_experts=4, num_experts_per_tok=2,
                           tie_word_embeddings=False, rope_theta=1000000.0, sliding_window=None),
           "float16", "plain", "<eos>", PLAIN),
    Family("qwen3moe", _cfg("Qwen3MoeForCausalLM", "qwen3_moe", num_hidden_layers=2, head_dim=32,
                            num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                            norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                            tie_word_embeddings=False, rope_theta=1000000.0, eos_token_id=6,
                            use_sliding_window=False),
           "float16", "chatml", "<|im_end|>", PLAIN),
    # Dense layers among the routed ones: every second layer by
    # `decoder_sparse_step`, and one by `mlp_only_layers`. llama.cpp's
    # converter maps no such layout, so there is no GGUF of it.
    Family("qwen3moe_sparse", _cfg("Qwen3MoeForCausalLM", "qwen3_moe", num_hidden_layers=4,
                                   head_dim=32, num_experts=4, num_experts_per_tok=2,
                                   moe_intermediate_size=32, norm_topk_prob=False,
                                   decoder_sparse_step=2, mlp_only_layers=[3],
                                   tie_word_embeddings=True, rope_theta=1000000.0, eos_token_id=6,
                                   use_sliding_window=False),
           "float16", "chatml", "<|im_end|>", [Run("default", LONG, files="safetensors")],
           gguf=False),
    Family("qwen2moe", _cfg("Qwen2MoeForCausalLM", "qwen2_moe", num_hidden_layers=2,
                            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                            shared_expert_intermediate_size=64, norm_topk_prob=False,
                            mlp_only_layers=[], tie_word_embeddings=False, rope_theta=10000.0,
                            eos_token_id=6, use_sliding_window=False),
           "float16", "chatml", "<|im_end|>", PLAIN),
    # Every layer's experts: top-2 of 4, biased, clamped SwiGLU; sinks; a
    # window of 8 on the even layers; YaRN as released.
    Family("gpt_oss", _cfg("GptOssForCausalLM", "gpt_oss", num_hidden_layers=4, head_dim=16,
                           intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                           sliding_window=8, tie_word_embeddings=False, attention_bias=True,
                           layer_types=["sliding_attention", "full_attention"] * 2,
                           rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0,
                                                beta_fast=32.0, beta_slow=1.0, truncate=False,
                                                original_max_position_embeddings=4096)),
           "bfloat16", "plain", "<eos>", PLAIN),
    # No attention at all: two Mamba-2 layers, 8 heads of 16 in 2 groups,
    # a state of 16, a conv of 4; transformers' scan chunks of 8, so its
    # prompts cross several chunk edges.
    Family("mamba2", dict(architectures=["Mamba2ForCausalLM"], model_type="mamba2",
                          vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_heads=8,
                          head_dim=16, expand=2, state_size=16, n_groups=2, conv_kernel=4,
                          chunk_size=8, use_bias=False, use_conv_bias=True,
                          # Finite: transformers writes an infinite limit
                          # it cannot read back. Its floor clamps some steps.
                          time_step_limit=[0.05, 1.0],
                          layer_norm_epsilon=1e-5, tie_word_embeddings=False,
                          bos_token_id=2, eos_token_id=1, pad_token_id=0),
           "float16", "plain", "<eos>",
           # A GGUF records no time step limit (llama.cpp clamps none): its
           # run has the clamp off.
           [Run("default", LONG, files="safetensors"),
            Run("no-clamp", LONG, overrides=dict(time_step_limit=[0.0, 1e9]), files="gguf")]),
    # Granite 4.0-H's dense-MLP mix (Granite-4.0-H-Micro's kind): Mamba-2
    # and NoPE attention layers by `layer_types`, a shared SwiGLU MLP in
    # every layer, its embedding, residual, attention and logit multipliers.
    Family("granitehybrid", _cfg("GraniteMoeHybridForCausalLM", "granitemoehybrid",
                                 num_hidden_layers=4, shared_intermediate_size=128,
                                 num_local_experts=0, position_embedding_type="nope",
                                 layer_types=["mamba", "attention", "mamba", "attention"],
                                 mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16,
                                 mamba_n_groups=2, mamba_d_conv=4, mamba_expand=2,
                                 mamba_chunk_size=8, mamba_conv_bias=True, mamba_proj_bias=False,
                                 time_step_limit=[0.05, 1.0], embedding_multiplier=2.0,
                                 residual_multiplier=0.5, attention_multiplier=0.2,
                                 logits_scaling=4.0, tie_word_embeddings=False),
           "bfloat16", "plain", "<eos>",
           # As Mamba-2's: the GGUF records no time step limit.
           [Run("default", LONG, files="safetensors"),
            Run("no-clamp", LONG, overrides=dict(time_step_limit=[0.0, 1e9]), files="gguf")]),
    # Gated DeltaNet layers (2 key heads, 4 value heads, a conv of 4) and
    # gated attention layers (q/k norms, a quarter of each head rotating),
    # (1 + w) norms; a 75-token prompt crosses the delta rule's block of 64.
    Family("qwen35", _cfg("Qwen3_5ForCausalLM", "qwen3_5_text", num_hidden_layers=4, head_dim=32,
                          layer_types=["linear_attention", "linear_attention", "full_attention",
                                       "linear_attention"],
                          linear_num_key_heads=2, linear_num_value_heads=4,
                          linear_key_head_dim=16, linear_value_head_dim=16,
                          linear_conv_kernel_dim=4, tie_word_embeddings=False, eos_token_id=6,
                          rope_parameters=dict(rope_type="default", rope_theta=10000000.0,
                                               partial_rotary_factor=0.25)),
           "bfloat16", "chatml", "<|im_end|>", [Run("default", [21, 38, 75])],
           # The tiny model has no MTP layers for the converter to find.
           convert_args=["--no-mtp"]),
    # Qwen3-Next: the same layers with q, k, v, z and b, a in-projections
    # fused and interleaved per key head; experts (top-2 of 4, renormalised)
    # with a gated shared expert; every third layer full attention.
    Family("qwen3next", _cfg("Qwen3NextForCausalLM", "qwen3_next", num_hidden_layers=3, head_dim=32,
                             full_attention_interval=3, linear_num_key_heads=2,
                             linear_num_value_heads=4, linear_key_head_dim=16,
                             linear_value_head_dim=16, linear_conv_kernel_dim=4,
                             num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                             shared_expert_intermediate_size=64, norm_topk_prob=True,
                             decoder_sparse_step=1, mlp_only_layers=[],
                             tie_word_embeddings=False, eos_token_id=6,
                             rope_theta=10000000.0, partial_rotary_factor=0.25),
           "bfloat16", "chatml", "<|im_end|>", [Run("default", [21, 38, 75])],
           convert_args=["--no-mtp"]),
    # SmolLM3: the Llama layout with no RoPE on every fourth layer (the
    # default `no_rope_layer_interval`), tied embeddings; 4 layers, so the
    # last attends without positions.
    Family("smollm3", _cfg("SmolLM3ForCausalLM", "smollm3", num_hidden_layers=4,
                           tie_word_embeddings=True, use_sliding_window=False,
                           rope_theta=2000000.0, eos_token_id=6),
           "bfloat16", "chatml", "<|im_end|>", PLAIN),
    # GLM-4.5: a dense first layer, then 8 experts in 2 groups (top-2 from
    # the best group) behind a sigmoid router with a correction bias,
    # scaled by 2.5, and an ungated shared expert; q/k/v biases, q/k norms,
    # half of each head rotating; the special tokens llama.cpp's converter
    # looks up.
    Family("glm4moe", _cfg("Glm4MoeForCausalLM", "glm4_moe", num_hidden_layers=3, head_dim=16,
                           moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2,
                           n_shared_experts=1, n_group=2, topk_group=1,
                           routed_scaling_factor=2.5, first_k_dense_replace=1,
                           norm_topk_prob=True, use_qk_norm=True, attention_bias=True,
                           partial_rotary_factor=0.5, num_nextn_predict_layers=0,
                           tie_word_embeddings=False, rope_theta=10000.0, eos_token_id=6),
           "bfloat16", "chatml", "<|im_end|>", PLAIN,
           specials=("[gMASK]", "<sop>", "<|user|>", "<|observation|>")),
    # OLMo 2: no input norms, post-norms on each block's output, q/k norms
    # over every head at once.
    Family("olmo2", _cfg("Olmo2ForCausalLM", "olmo2", num_hidden_layers=2,
                         tie_word_embeddings=False, rope_theta=10000.0, eos_token_id=6),
           "bfloat16", "chatml", "<|im_end|>", PLAIN),
    # OLMo 3: OLMo 2's layers, a window of 8 on three of every four, the
    # fourth full (the RoPE of each kind the same: llama.cpp's reads one).
    Family("olmo3", _cfg("Olmo3ForCausalLM", "olmo3", num_hidden_layers=4, sliding_window=8,
                         tie_word_embeddings=False, eos_token_id=6,
                         rope_parameters=dict(rope_type="default", rope_theta=500000.0)),
           "bfloat16", "chatml", "<|im_end|>", PLAIN),
    # Ministral 3: Mistral's layers, YaRN whose attention factor is
    # mscale / mscale_all_dim (mscale 1: llama.cpp's converter keeps only
    # mscale_all_dim), and Llama 4's query scaling by position, its step
    # (original_max_position_embeddings) 16 so every prompt crosses it; heads
    # wider than hidden / heads, as the released models' are.
    Family("ministral3", _cfg("Ministral3ForCausalLM", "ministral3", num_hidden_layers=3,
                              head_dim=32, tie_word_embeddings=False, sliding_window=None,
                              rope_parameters=dict(rope_type="yarn", rope_theta=1000000.0,
                                                   factor=16.0,
                                                   original_max_position_embeddings=16,
                                                   beta_fast=32.0, beta_slow=1.0, mscale=1.0,
                                                   mscale_all_dim=0.5,
                                                   llama_4_scaling_beta=0.3)),
           "bfloat16", "plain", "<eos>", PLAIN),
    # LFM2: short-convolution layers (3 taps) among attention layers with
    # per-head q/k norms; the feed-forward width adjusted as transformers
    # does (2/3 of 128, rounded up to a multiple of 32: 96); tied
    # embeddings. No convolution biases: llama.cpp's `lfm2` reads none.
    Family("lfm2", _cfg("Lfm2ForCausalLM", "lfm2", num_hidden_layers=4,
                        layer_types=["conv", "conv", "full_attention", "conv"],
                        conv_L_cache=3, conv_bias=False, block_multiple_of=32,
                        block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=True,
                        norm_eps=1e-5, tie_word_embeddings=True, eos_token_id=6,
                        rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
           "bfloat16", "chatml", "<|im_end|>", PLAIN),
    # Granite 4.0-H with experts (H-Tiny's and H-Small's kind): the dense
    # fixture's layers and multipliers (no time step clamp: the GGUF
    # records none), 4 experts (top-2, softmax over the
    # chosen logits) stacked gate-then-up in one tensor, beside the shared
    # SwiGLU MLP in every layer.
    Family("granitehybrid_moe", _cfg("GraniteMoeHybridForCausalLM", "granitemoehybrid",
                                     num_hidden_layers=4, intermediate_size=32,
                                     shared_intermediate_size=64, num_local_experts=4,
                                     num_experts_per_tok=2, position_embedding_type="nope",
                                     layer_types=["mamba", "attention", "mamba", "attention"],
                                     mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16,
                                     mamba_n_groups=2, mamba_d_conv=4, mamba_expand=2,
                                     mamba_chunk_size=8, mamba_conv_bias=True,
                                     mamba_proj_bias=False, time_step_limit=[0.0, 1e9],
                                     embedding_multiplier=2.0,
                                     residual_multiplier=0.5, attention_multiplier=0.2,
                                     logits_scaling=4.0, tie_word_embeddings=False),
           "bfloat16", "plain", "<eos>", PLAIN, seed=1022),
    # Nemotron-H: Mamba-2 (grouped B/C, scan blocks of 8), attention
    # without positions and squared-ReLU MLPs as separate layers by
    # `hybrid_override_pattern` (no time step clamp, as the GGUF);
    # attention heads as wide as Mamba's (the converter reads one `head_dim`
    # for both).
    Family("nemotron_h", _cfg("NemotronHForCausalLM", "nemotron_h",
                              hybrid_override_pattern="M-*-M-", head_dim=16,
                              mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16,
                              n_groups=2, conv_kernel=4, chunk_size=8, expand=2,
                              time_step_limit=[0.0, 1e9], layer_norm_epsilon=1e-5,
                              rms_norm_eps=1e-5, tie_word_embeddings=False),
           "bfloat16", "plain", "<eos>", PLAIN, seed=1023),
    # Qwen3.5-MoE: Qwen3.5's layers with experts (top-2 of 4) and the gated
    # shared expert in every layer; no `norm_topk_prob`, as its router
    # renormalises regardless.
    Family("qwen35moe", _cfg("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text", num_hidden_layers=4,
                             head_dim=32,
                             layer_types=["linear_attention", "full_attention",
                                          "linear_attention", "full_attention"],
                             linear_num_key_heads=2, linear_num_value_heads=4,
                             linear_key_head_dim=16, linear_value_head_dim=16,
                             linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
                             moe_intermediate_size=32, shared_expert_intermediate_size=64,
                             tie_word_embeddings=False, eos_token_id=6,
                             rope_parameters=dict(rope_type="default", rope_theta=10000000.0,
                                                  partial_rotary_factor=0.25)),
           "bfloat16", "chatml", "<|im_end|>", [Run("default", [21, 38, 75])],
           convert_args=["--no-mtp"], seed=2001),
    # DeepSeek-V3 (and Kimi K2): latent attention with a low-rank query,
    # interleaved rotary on 8 of each head's 24 key dimensions, YaRN whose
    # mscale_all_dim scales the softmax; GLM-4.5's router (sigmoid, correction
    # bias, 2 groups of which 1 kept, scaled), a shared expert, one dense
    # layer first. As many KV heads as heads (llama.cpp's converter splits
    # kv_b_proj per head by that count).
    Family("deepseek_v3", _cfg("DeepseekV3ForCausalLM", "deepseek_v3", num_hidden_layers=3,
                               num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32,
                               qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                               moe_intermediate_size=32, n_routed_experts=8,
                               num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1,
                               routed_scaling_factor=2.5, first_k_dense_replace=1,
                               norm_topk_prob=True, scoring_func="sigmoid", topk_method="noaux_tc",
                               rope_interleave=True, tie_word_embeddings=False, eos_token_id=6,
                               rope_parameters=dict(rope_type="yarn", rope_theta=10000.0,
                                                    factor=4.0,
                                                    original_max_position_embeddings=64,
                                                    beta_fast=32.0, beta_slow=1.0, mscale=1.0,
                                                    mscale_all_dim=1.0)),
           "bfloat16", "chatml", "<|im_end|>", PLAIN, seed=1022),
    # DeepSeek-V2-Lite's shape: latent attention with a full-rank query
    # (q_lora_rank null), softmax routing greedy over every expert, scaled,
    # two shared experts, one dense layer first.
    Family("deepseek_v2", _cfg("DeepseekV2ForCausalLM", "deepseek_v2", num_hidden_layers=3,
                               num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32,
                               qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                               moe_intermediate_size=32, n_routed_experts=8,
                               num_experts_per_tok=2, n_shared_experts=2,
                               routed_scaling_factor=1.5, first_k_dense_replace=1,
                               norm_topk_prob=False, topk_method="greedy", scoring_func="softmax",
                               tie_word_embeddings=False, eos_token_id=6, rope_theta=10000.0),
           "float16", "chatml", "<|im_end|>", PLAIN, seed=1023),
    # Nemotron 3 (Nano's kind): Nemotron-H's Mamba-2 and position-free
    # attention layers beside mixture-of-experts layers (`E`): 8 plain
    # squared-ReLU experts (no gate), top-2 by sigmoid score plus the
    # correction bias, renormalised and scaled by 2.5, and a plain shared
    # expert of its own width.
    Family("nemotron_h_moe", _cfg("NemotronHForCausalLM", "nemotron_h",
                                  hybrid_override_pattern="ME*EM", head_dim=16,
                                  mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16,
                                  n_groups=2, conv_kernel=4, chunk_size=8, expand=2,
                                  time_step_limit=[0.0, 1e9], layer_norm_epsilon=1e-5,
                                  rms_norm_eps=1e-5, n_routed_experts=8, num_experts_per_tok=2,
                                  moe_intermediate_size=32,
                                  moe_shared_expert_intermediate_size=48, n_shared_experts=1,
                                  n_group=1, topk_group=1, norm_topk_prob=True,
                                  routed_scaling_factor=2.5, tie_word_embeddings=False),
           "bfloat16", "plain", "<eos>", PLAIN, seed=2002),
    # Llama 4 (Scout's text model): chunks of 8 on three of every four
    # layers (their RoPE interleaved in pairs, q/k normed without a weight),
    # the fourth NoPE and full with the query temperature (floor 8); every
    # second layer 4 experts top-1 behind a sigmoid router whose weight
    # scales the expert's input, beside a shared expert. llama.cpp's
    # converter writes neither the chunk nor the floor (llama.cpp fixes both
    # at 8192): the GGUF is checked with those.
    Family("llama4", _cfg("Llama4ForCausalLM", "llama4_text", num_hidden_layers=4, head_dim=16,
                          intermediate_size=32, intermediate_size_mlp=128, num_local_experts=4,
                          num_experts_per_tok=1, interleave_moe_layer_step=2,
                          attention_chunk_size=8, floor_scale=8, attn_scale=0.1,
                          attn_temperature_tuning=True, use_qk_norm=True,
                          tie_word_embeddings=False,
                          rope_parameters=dict(rope_type="llama3", rope_theta=500000.0,
                                               factor=4.0, low_freq_factor=1.0,
                                               high_freq_factor=4.0,
                                               original_max_position_embeddings=32)),
           "bfloat16", "plain", "<eos>",
           [Run("default", LONG, files="safetensors"),
            Run("llama.cpp-chunk", LONG, overrides=dict(attention_chunk_size=8192, floor_scale=8192),
                files="gguf")],
           seed=2003),
    # Gemma 4 (the E2B/E4B kind, with the 31B's k = v): 5 sliding layers
    # of head_dim 16 (2 KV heads) and full layers of head_dim 32 with one
    # KV head whose values are its keys' projection (attention_k_eq_v), a
    # quarter of each full head rotating (proportional RoPE); v normed
    # without a weight; per-layer input embeddings (8 wide); the last two
    # layers read the KV of the last earlier layer of their kind (shared
    # KV) and have MLPs twice as wide; each layer's output scaled.
    Family("gemma4", _cfg("Gemma4ForCausalLM", "gemma4_text", num_hidden_layers=6, head_dim=16,
                          global_head_dim=32, num_global_key_value_heads=1,
                          attention_k_eq_v=True, sliding_window=8,
                          layer_types=["sliding_attention", "sliding_attention",
                                       "full_attention", "sliding_attention",
                                       "sliding_attention", "full_attention"],
                          hidden_size_per_layer_input=8, vocab_size_per_layer_input=VOCAB,
                          num_kv_shared_layers=2, use_double_wide_mlp=True,
                          final_logit_softcapping=10.0, hidden_activation="gelu_pytorch_tanh",
                          tie_word_embeddings=True,
                          rope_parameters=dict(
                              full_attention=dict(rope_type="proportional",
                                                  partial_rotary_factor=0.25,
                                                  rope_theta=1000000.0),
                              sliding_attention=dict(rope_type="default", rope_theta=10000.0))),
           "bfloat16", "gemma", "<eos>", PLAIN, seed=2004, spm=True),
    # Gemma 4's mixture (the 26B-A4B kind): in every layer, beside the
    # dense MLP, 4 experts of which 2 run, routed by the residual stream's
    # weightless norm times the router's scale, renormalised, each chosen
    # expert's weight times its own scale; each half with its own norms.
    Family("gemma4_moe", _cfg("Gemma4ForCausalLM", "gemma4_text", num_hidden_layers=4,
                              head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
                              attention_k_eq_v=True, sliding_window=8,
                              layer_types=["sliding_attention", "full_attention",
                                           "sliding_attention", "full_attention"],
                              hidden_size_per_layer_input=0, enable_moe_block=True,
                              num_experts=4, top_k_experts=2, moe_intermediate_size=32,
                              final_logit_softcapping=10.0,
                              hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                              rope_parameters=dict(
                                  full_attention=dict(rope_type="proportional",
                                                      partial_rotary_factor=0.25,
                                                      rope_theta=1000000.0),
                                  sliding_attention=dict(rope_type="default",
                                                         rope_theta=10000.0))),
           "bfloat16", "gemma", "<eos>", PLAIN, seed=2005, spm=True),
]
