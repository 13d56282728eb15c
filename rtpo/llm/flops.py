"""Model FLOPs of generation: what the engine must compute to sample a batch, from the model config alone.

The count is of model FLOPs (matrix multiplies of the transformer, 2 per multiply-add), not of what a
kernel actually executes, following Kaplan et al. 2020 (Table 1: C_forward ≈ 2·N + 2·n_layer·n_ctx·d_attn
per token), with the attention term summed exactly over the keys each position attends to:

    one position p (0-indexed, causal: p + 1 keys) = 2·N_body + 4·L·H·d_h·(p + 1)   (+ 2·d·V with logits)

N_body the parameters less the token embedding (and less an untied lm_head: its matmul is the 2·d·V
term), L layers, H query heads of d_h.  A request of context c and n samples of r_j tokens costs

    prefill = positions 0..c−1, logits at the last only:       2·N_body·c + 2·d·V + 2·L·H·d_h·c·(c + 1)
    decode_j = positions c..c+r_j−2 (the last sampled token is never fed back), each with logits:
               (r_j − 1)·(2·N_body + 2·d·V) + 4·L·H·d_h·Σ_{p=c}^{c+r_j−2} (p + 1)

The prefill is counted once per context: the engine shares it across the n samples (vLLM forks the
request after its prompt; prefix caching).  Across turns, a context that extends an earlier one is
counted whole: the figure is the work a cache-less engine needs, an upper bound on what vLLM runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ModelShape:
    """The sizes model FLOPs depend on, read from an HF config (Qwen3 and Llama-like decoders).

    hidden d, vocab V, layers L, heads H (queries) and kv_heads (keys/values) of head_dim d_h, the MLP's
    intermediate size, whether the lm_head is the embedding (tied), and whether attention has biases
    and per-head q/k norms (Qwen3)."""

    hidden: int
    vocab: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool
    attention_bias: bool = False
    qk_norm: bool = False

    def __post_init__(self) -> None:
        for name in ("hidden", "vocab", "layers", "heads", "kv_heads", "head_dim", "intermediate"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"ModelShape.{name} must be >= 1, got {getattr(self, name)}")

    @classmethod
    def from_config(cls, config: Any) -> ModelShape:
        """From a transformers config object (or the parsed config.json as a dict)."""
        get = config.get if isinstance(config, dict) else lambda k, default=None: getattr(config, k, default)
        d, heads = int(get("hidden_size")), int(get("num_attention_heads"))
        return cls(
            hidden=d,
            vocab=int(get("vocab_size")),
            layers=int(get("num_hidden_layers")),
            heads=heads,
            kv_heads=int(get("num_key_value_heads") or heads),
            head_dim=int(get("head_dim") or d // heads),
            intermediate=int(get("intermediate_size")),
            tied=bool(get("tie_word_embeddings", True)),
            attention_bias=bool(get("attention_bias", False)),
            qk_norm=str(get("model_type", "")).startswith("qwen3"),
        )

    @property
    def body_params(self) -> int:
        """Parameters less the embedding and lm_head: per layer q, k, v, o projections, the gated MLP's
        three matrices, two RMSNorms (and q/k norms, biases where present); plus the final norm."""
        d, hd, q, kv = self.hidden, self.head_dim, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = d * q + 2 * d * kv + q * d + (q + 2 * kv if self.attention_bias else 0) + (2 * hd if self.qk_norm else 0)
        per_layer = attn + 3 * d * self.intermediate + 2 * d
        return self.layers * per_layer + d


def generation_flops(
    shape: ModelShape, context_lengths: np.ndarray, response_lengths: np.ndarray, n: int
) -> tuple[float, float]:
    """(prefill, decode) model FLOPs of sampling n responses to each of B contexts (module docstring).

    context_lengths: (B,) c_i.  response_lengths: (B·n,) r of row i·n + j (context i's j-th sample: the
    engines' row order)."""
    c = np.asarray(context_lengths, dtype=np.float64)
    r = np.asarray(response_lengths, dtype=np.float64)
    if r.size != c.size * n:
        raise ValueError(f"{r.size} responses for {c.size} contexts × n = {n}")
    n_body, dv = 2.0 * shape.body_params, 2.0 * shape.hidden * shape.vocab
    attn = 4.0 * shape.layers * shape.heads * shape.head_dim
    prefill = n_body * c.sum() + dv * c.size + attn * (c * (c + 1) / 2).sum()
    m = np.maximum(r - 1, 0)  # decode positions of each sample
    ci = np.repeat(c, n)
    # Σ_{p=c}^{c+m−1} (p + 1) = Σ_{q=c+1}^{c+m} q
    keys = (ci + m) * (ci + m + 1) / 2 - ci * (ci + 1) / 2
    decode = (n_body + dv) * m.sum() + attn * keys.sum()
    return float(prefill), float(decode)
