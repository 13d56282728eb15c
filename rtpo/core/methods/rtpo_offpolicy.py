"""Off-policy RTPO (F.3, E.2; Eq. 105, 109–110): the reverse phases reuse θ0 continuations.

At the start of the iteration every trunk boundary at every turn gets its G−1 siblings under π_θ0 (one
batched rollout, no sync afterwards).  Phase k then trains turn k on those siblings with
    Q̂^off_{j,k} = r_{j,k} + γ^{τ_{j,k}} · ω̄_{j,k} · F̂^{π_θ0}_{j,k},
    ω̄_{j,k} = clamp(Π_{h>k} Π_t π_{θ>k}(a_{j,h,t}|·) / π_θ0(a_{j,h,t}|·), ρ_min, ρ_max),
the continuation's trajectory IS weight under the current learner, clamped (Eq. 105).  The advantage is
the configured sibling estimator applied to Q̂^off, and π_old of the turn-k update is π_θ0.  The budget
is the same as on-policy RTPO's; only the policy the continuations come from differs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rtpo.core.methods.base import IterationState, RunContext, register_method
from rtpo.core.methods.reverse import ReverseTurn, RTPOConfig, RTPOIteration, reweighted_returns


@dataclass(frozen=True)
class RTPOOffPolicyConfig(RTPOConfig):
    """RTPO's settings plus the clamp [rho_min, rho_max] of ω̄ (the paper gives no values; ours)."""

    rho_min: float = 0.5
    rho_max: float = 2.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.rho_min <= self.rho_max:
            raise ValueError(f"need 0 <= rho_min <= rho_max, got {self.rho_min}, {self.rho_max}")


@dataclass
class OffPolicyIteration(RTPOIteration):
    siblings: list  # siblings[k]: the θ0 siblings of every turn-k boundary, G−1 per boundary, in order


@register_method("rtpo_offpolicy")
class RTPOOffPolicy(ReverseTurn):
    Config = RTPOOffPolicyConfig

    def should_sync(self, k: int, state: IterationState) -> bool:
        return False  # the off-policy endpoint of G.6: never

    def begin(self, ctx: RunContext, query_ids: np.ndarray) -> IterationState:
        state = super().begin(ctx, query_ids)
        tree = state.data.tree
        bounds = [b for row in tree.boundaries for b in row]
        n = self.cfg.G - 1
        sibs: list[list] = [[] for _ in range(tree.num_turns)]
        if bounds:
            q = np.array([tree.trunks[b.trunk].query_id for b in bounds], np.int64)
            res = self.rollout(ctx, q, [b.snapshot for b in bounds], n=n)
            for i, s in enumerate(res.trajectories):
                sibs[bounds[i // n].k].append(s)
        state.data = OffPolicyIteration(tree, state.data.trunk_metrics, sibs)
        return state

    def run_phase(self, ctx: RunContext, state: IterationState, k: int) -> dict[str, float]:
        data: OffPolicyIteration = state.data
        metrics: dict[str, float] = {"phase/turn": float(k), "phase/synced": 0.0}
        if state.done_phases == 1:  # the iteration's first phase reports the trunks
            metrics.update(data.trunk_metrics)
        sibs = data.siblings[k]
        metrics["phase/boundaries"] = float(len(data.tree.boundaries[k]))
        if not sibs:
            return metrics
        n = self.cfg.G - 1
        q_off, omega = reweighted_returns(ctx.learner, sibs, self.cfg.rho_min, self.cfg.rho_max)
        metrics["offpolicy/omega_mean"] = float(omega.mean())
        metrics["offpolicy/omega_clamped_rate"] = float(
            np.mean((omega <= self.cfg.rho_min) | (omega >= self.cfg.rho_max))
        )
        return self.train_on_siblings(ctx, sibs, q_off.reshape(-1, n), metrics)
