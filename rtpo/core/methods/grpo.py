"""GRPO (Eq. 1, 9; SPEC §3): G independent full trajectories per query, one group-relative advantage per
trajectory spread over every response token, flattened multi-turn training with a token-mean loss.

The iteration is `flat.GroupRelative`, shared with the other flat baselines (GSPO, Tree-GRPO, ARPO);
this module only registers it under its name.
"""

from __future__ import annotations

from rtpo.core.methods.base import register_method
from rtpo.core.methods.flat import GroupRelative, GRPOConfig


@register_method("grpo")
class GRPO(GroupRelative):
    Config = GRPOConfig
