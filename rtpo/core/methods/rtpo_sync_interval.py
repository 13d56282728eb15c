"""RTPO with fixed-interval synchronisation (G.6): between the on-policy and off-policy endpoints.

The sampler is pushed θ_{>k} only every `sync_every` phases (sync_every = 1 is on-policy RTPO; a value
≥ K syncs only at the iteration start, like the off-policy variant but still re-sampling siblings).  In
a phase without sync the siblings' continuations come from a stale sampler, so their returns are
reweighted as in Eq. 109 with the clamped trajectory weight ω̄ (`is_weight`); after a sync ω̄ ≡ 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rtpo.core.methods.base import IterationState, RunContext, register_method
from rtpo.core.methods.reverse import ReverseTurn, RTPOConfig, reweighted_returns


@dataclass(frozen=True)
class RTPOSyncIntervalConfig(RTPOConfig):
    """sync_every: phases per sync (phase 0 of an iteration always syncs).  is_weight: apply ω̄ (Eq. 109)
    to stale continuations.  rho_min, rho_max: its clamp."""

    sync_every: int = 2
    is_weight: bool = True
    rho_min: float = 0.5
    rho_max: float = 2.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sync_every < 1:
            raise ValueError(f"sync_every must be >= 1, got {self.sync_every}")
        if not 0.0 <= self.rho_min <= self.rho_max:
            raise ValueError(f"need 0 <= rho_min <= rho_max, got {self.rho_min}, {self.rho_max}")


@register_method("rtpo_sync_interval")
class RTPOSyncInterval(ReverseTurn):
    Config = RTPOSyncIntervalConfig

    def should_sync(self, k: int, state: IterationState) -> bool:
        return (state.done_phases - 1) % self.cfg.sync_every == 0  # done_phases counts this phase

    def sibling_returns(self, ctx: RunContext, state: IterationState, k: int, siblings: list) -> np.ndarray:
        if not self.cfg.is_weight:
            return super().sibling_returns(ctx, state, k, siblings)
        q, _ = reweighted_returns(ctx.learner, siblings, self.cfg.rho_min, self.cfg.rho_max)
        return q
