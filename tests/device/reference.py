"""A plain-torch forward of a Llama decoder, as Hugging Face's LlamaForCausalLM
computes it (RMSNorm, RoPE with the half-split rotation, grouped-query
attention, SwiGLU), in f32 from the bf16 weights: the reference the server's
greedy tokens and log-probabilities are checked against."""

import torch

from llama_files import Geometry


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.float()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(g: Geometry, n: int, device) -> tuple:
    inv_freq = 1.0 / (g.rope_theta ** (torch.arange(0, g.head_dim, 2, device=device,
                                                    dtype=torch.float32) / g.head_dim))
    freqs = torch.arange(n, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _attention(x: torch.Tensor, w: dict, p: str, g: Geometry, cos, sin) -> torch.Tensor:
    n, d = x.shape[0], g.head_dim
    q = (x @ w[p + "self_attn.q_proj.weight"].float().T).view(n, g.heads, d).transpose(0, 1)
    k = (x @ w[p + "self_attn.k_proj.weight"].float().T).view(n, g.kv_heads, d).transpose(0, 1)
    v = (x @ w[p + "self_attn.v_proj.weight"].float().T).view(n, g.kv_heads, d).transpose(0, 1)
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    group = g.heads // g.kv_heads
    k = k.repeat_interleave(group, dim=0)
    v = v.repeat_interleave(group, dim=0)
    scores = (q @ k.transpose(1, 2)) / d ** 0.5
    causal = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
    scores = scores.masked_fill(causal, float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, g.heads * d)
    return out @ w[p + "self_attn.o_proj.weight"].float().T


def _mlp(x: torch.Tensor, w: dict, p: str) -> torch.Tensor:
    gate = x @ w[p + "mlp.gate_proj.weight"].float().T
    up = x @ w[p + "mlp.up_proj.weight"].float().T
    return (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].float().T


@torch.no_grad()
def log_probs(w: dict, g: Geometry, ids: list) -> torch.Tensor:
    """Log-probabilities of the next token at every position of `ids`, [n, vocab]."""
    device = w["model.embed_tokens.weight"].device
    x = w["model.embed_tokens.weight"][torch.tensor(ids, device=device)].float()
    cos, sin = _rope(g, len(ids), device)
    for i in range(g.layers):
        p = f"model.layers.{i}."
        x = x + _attention(_rms_norm(x, w[p + "input_layernorm.weight"], g.rms_eps), w, p, g,
                           cos, sin)
        x = x + _mlp(_rms_norm(x, w[p + "post_attention_layernorm.weight"], g.rms_eps), w, p)
    x = _rms_norm(x, w["model.norm.weight"], g.rms_eps)
    return (x @ w["lm_head.weight"].float().T).log_softmax(-1)


def greedy(w: dict, g: Geometry, prompt: list, steps: int) -> list:
    """`steps` greedy tokens after `prompt`, each step's full log-probabilities
    with it: [(token, log_probs[vocab] on the host)]."""
    ids, out = list(prompt), []
    for _ in range(steps):
        lp = log_probs(w, g, ids)[-1].cpu()
        token = int(lp.argmax())
        out.append((token, lp))
        ids.append(token)
    return out
