"""GSPO (SPEC §3): GRPO's batch with a sequence-level ratio s_i = exp(mean_t Δlog π) over the whole
flattened trajectory, PPO-clipped, aggregated as the sequence-mean of token-means.

The GSPO paper clips s_i to a very narrow range (ε ≈ 3e-4) for LLM sequences of thousands of tokens;
here clip_eps keeps GRPO's default and a scenario sets it."""

from __future__ import annotations

from rtpo.core.methods.base import register_method
from rtpo.core.methods.flat import GroupRelative, GRPOConfig


@register_method("gspo")
class GSPO(GroupRelative):
    Config = GRPOConfig
    ratio = "sequence"
    aggregation = "seq-mean-token-mean"
