"""RTPO, Algorithm 1 (§3, E.1): trunk rollout, then reverse-order per-turn phases with on-policy siblings.

For k = K−1 down to 0: synchronise the sampler to the current θ (θ_{>k}); fork G−1 siblings from every
trunk boundary at turn k and continue each to the end under π_{θ>k}; advantage A^H_{j,k} = R_j − V̂_k
with V̂_k the siblings' mean return (Eq. 7, 52); PPO on the siblings' turn-k tokens only (Eq. 6, 80).
The trunk gets no gradient and is in no baseline.

The iteration is `reverse.ReverseTurn`, shared with the RTPO variants; this module registers it.
"""

from __future__ import annotations

from rtpo.core.methods.base import register_method
from rtpo.core.methods.reverse import ReverseTurn, RTPOConfig


@register_method("rtpo")
class RTPO(ReverseTurn):
    Config = RTPOConfig
