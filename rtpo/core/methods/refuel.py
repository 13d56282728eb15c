"""REFUEL (Gao et al. 2024, "Regressing the Relative Future"; the RTPO paper's G.1/G.8 comparison; SPEC §3):
pick a turn h, roll in to the boundary S_h with the current policy, draw two turn-h responses y, y′ from
the shared prefix and continue both to the end under the same policy, then regress the pair's log-ratio
difference onto the difference of their futures:

    L(θ) = mean_pairs ( (Δ(y) − Δ(y′)) − η (R(y) − R(y′)) )²,   Δ(y) = log π_θ(y | c_h) − log π_old(y | c_h),

with the log-probs summed over the turn-h tokens (rtpo.core.loss.pair_regression_loss).  Per query and
iteration: one roll-in (charged as a rollout: the runner's episodes run to the end) and two
continuations, h ~ Uniform{0..K−1} drawn before the roll-in; a roll-in that ended before h yields no
pair (drawing h from the episodes that did reach it would select on their future).  Both members of a
pair are trained on the context c_h recorded at the roll-in, as RTPO's siblings are.

At θ = θ_old the gradient of one pair is −2η (R − R′)(∇log π(y) − ∇log π(y′)): a pairwise policy
gradient with the leave-one-out advantage of a two-sibling group.  Several epochs make the regression,
not just its first step, matter: it is minimised where Δ(y) − Δ(y′) = η (R − R′).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rtpo.core.loss import LossConfig
from rtpo.core.methods.base import IterationState, Method, RunContext, UpdateConfig, register_method
from rtpo.core.train import rollout_train_ratio, turn_rows
from rtpo.core.types import ReverseTree


@dataclass(frozen=True)
class REFUELConfig(UpdateConfig):
    """REFUEL's settings.

    eta:            η of the regression target η (R − R′) (the step-size scale of the implied update).
    pairs_per_query: roll-ins per query, each giving one pair at its own h.
    epochs, minibatch_size (pairs per optimiser step), kl_coef: UpdateConfig's; clip_eps does not apply
                    to the regression.
    log_ratio_clip: off (None) by default, as in REFUEL, whose regression has no clamp: a pair whose
                    log-ratio gap has run far from η (R − R′) is pulled back however far it went.  Setting it
                    (e.g. E.3's 10, which the other methods' surrogate uses) clamps each token's log-ratio
                    before the sum: a deliberate deviation from REFUEL that zeroes the gradient of a
                    clamped token.
    """

    eta: float = 1.0
    pairs_per_query: int = 1
    log_ratio_clip: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.eta > 0:
            raise ValueError(f"eta must be positive, got {self.eta}")
        if self.pairs_per_query < 1:
            raise ValueError(f"pairs_per_query must be >= 1, got {self.pairs_per_query}")

    def loss(self) -> LossConfig:
        return LossConfig(
            clip_eps=self.clip_eps,
            log_ratio_clip=self.log_ratio_clip,
            kl_coef=self.loss_kl_coef,
            kl_estimator=self.kl_estimator,
            entropy_coef=self.entropy_coef,
            objective="pair_regression",
            eta=self.eta,
        )


@dataclass
class REFUELIteration:
    tree: ReverseTree  # the roll-ins and their boundaries
    turns: np.ndarray  # (roll-ins,) the h drawn for each


@register_method("refuel")
class REFUEL(Method):
    Config = REFUELConfig

    def begin(self, ctx: RunContext, query_ids: np.ndarray) -> IterationState:
        ctx.sync()
        q = np.repeat(np.asarray(query_ids, dtype=np.int64), self.cfg.pairs_per_query)
        turns = ctx.rng.integers(0, ctx.env.num_turns, size=q.size)
        res = self.rollout(ctx, q, record_boundaries=True)
        tree = ReverseTree.from_rollout(res.trajectories, res.boundaries, ctx.env.num_turns)
        return IterationState(pending=["update"], data=REFUELIteration(tree, turns))

    def run_phase(self, ctx: RunContext, state: IterationState, key: Any) -> dict[str, float]:
        data: REFUELIteration = state.data
        at = {(b.trunk, b.k): b for k in range(data.tree.num_turns) for b in data.tree.boundaries[k]}
        bounds = [at[(i, int(h))] for i, h in enumerate(data.turns) if (i, int(h)) in at]
        metrics: dict[str, float] = {"phase/turn": -1.0, "phase/boundaries": float(len(bounds))}
        if not bounds:
            return metrics
        q = np.array([data.tree.trunks[b.trunk].query_id for b in bounds], dtype=np.int64)
        res = self.rollout(ctx, q, [b.snapshot for b in bounds], n=2)
        ys = res.trajectories  # row-major: (y, y′) of pair 0, then pair 1, ...
        returns = np.array([t.ret for t in ys]).reshape(len(bounds), 2)
        diff = returns[:, 0] - returns[:, 1]
        target = np.repeat(diff, 2)  # R − R′ on both rows of a pair
        sign = np.tile([1.0, -1.0], len(bounds))
        batch = turn_rows(
            ys, np.zeros(len(ys), np.int64), target, seq_id=np.repeat(np.arange(len(bounds)), 2), weight=sign
        )
        metrics.update(
            {
                "return/mean": float(returns.mean()),
                "adv/zero_rate": float(np.mean(diff == 0.0)),
                "adv/abs_mean": float(np.abs(diff).mean()),
                "refuel/turn_mean": float(np.mean([b.k for b in bounds])),
            }
        )
        metrics.update(rollout_train_ratio(ctx.learner, batch))
        metrics.update(self.ppo(ctx, batch, self.cfg.loss()))
        return metrics

    def rollouts_per_query(self, num_turns: int) -> float:
        """One roll-in and two continuations per pair (fewer when a roll-in ends before its h)."""
        return 3.0 * self.cfg.pairs_per_query
