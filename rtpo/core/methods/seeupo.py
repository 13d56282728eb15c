"""SeeUPO (SPEC §3 "Baseline details", A, G.8): one batch of full trajectories, split into per-turn rows
and updated in reverse turn order with GSPO, reweighting downstream advantages; no re-rollout, no sync.

For k = K−1 .. 0, on every trajectory that reached turn k:
    A⁰ = R − μ_task;  A = clip(batch-normalised A⁰, −3, 3);  A ← A · M   (M detached)
    GSPO loss (sequence ratio over the row's turn-k tokens) on turn-k tokens only
    M ← clip(M · clip(exp(mean_t Δlog π on turn k), 1 ± 0.2), 1 ± 0.2)
with M = 1 at the start of the iteration.  Unlike RTPO the advantage is the trajectory's (one return
compared across different turn-k states) and the continuations are never regenerated: every phase
reuses the θ0 batch, so PPO's π_old is the rollout policy even after later turns have moved.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from rtpo.core import estimators
from rtpo.core.loss import LossConfig
from rtpo.core.methods.base import IterationState, Method, RunContext, register_method
from rtpo.core.methods.flat import FlatUpdateConfig, training_contexts
from rtpo.core.train import rollout_train_ratio, turn_rows
from rtpo.core.types import Ragged, TurnBatch


@dataclass(frozen=True)
class SeeUPOConfig(FlatUpdateConfig):
    """G: trajectories per query (E.3: 16).  adv_clip: the ±3 clip of the normalised advantage.
    m_eps: the 1 ± ε clip of the reweighting factor M.  clip_eps: GSPO's sequence-ratio clip.
    train_context: as GRPO's ("auto" = full history where the environment exposes it)."""

    G: int = 16
    adv_clip: float = 3.0
    m_eps: float = 0.2

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.G < 2:
            raise ValueError(f"G must be >= 2, got {self.G}")
        if not 0.0 < self.m_eps < 1.0:
            raise ValueError("m_eps must be in (0, 1)")
        if self.adv_clip <= 0:
            raise ValueError("adv_clip must be positive")


@dataclass
class SeeUPOIteration:
    trajectories: list
    returns: np.ndarray  # (B,)
    task_mean: np.ndarray  # (B,) mean return of each trajectory's query group
    m: np.ndarray  # (B,) the running downstream weight M
    rows: TurnBatch  # every (trajectory, turn) row of the batch, built once
    row_traj: np.ndarray  # (N,) trajectory of each row


@register_method("seeupo")
class SeeUPO(Method):
    Config = SeeUPOConfig

    def loss(self) -> LossConfig:
        c = self.cfg
        return c.loss_config("sequence", "seq-mean-token-mean")

    def begin(self, ctx: RunContext, query_ids: np.ndarray) -> IterationState:
        ctx.sync()  # the only sync of the iteration
        q = np.repeat(np.asarray(query_ids, dtype=np.int64), self.cfg.G)
        res = self.rollout(ctx, q)
        returns = np.array([t.ret for t in res.trajectories])
        task_mean = np.repeat(returns.reshape(-1, self.cfg.G).mean(axis=1), self.cfg.G)
        pairs = [(i, j) for i, t in enumerate(res.trajectories) for j in range(t.num_turns)]
        trajs = [res.trajectories[i] for i, _ in pairs]
        rows = turn_rows(trajs, [j for _, j in pairs], np.zeros(len(pairs)))
        full = training_contexts([(t, j) for t, (_, j) in zip(trajs, pairs)], self.cfg.train_context)
        if full is not None:
            rows = dataclasses.replace(rows, contexts=full)
        data = SeeUPOIteration(
            res.trajectories, returns, task_mean, np.ones(len(returns)), rows, np.array([i for i, _ in pairs], np.int64)
        )
        return IterationState(pending=list(range(ctx.env.num_turns - 1, -1, -1)), data=data)

    def run_phase(self, ctx: RunContext, state: IterationState, k: int) -> dict[str, float]:
        d: SeeUPOIteration = state.data
        metrics: dict[str, float] = {"phase/turn": float(k), "phase/synced": 0.0}
        idx = np.flatnonzero(d.rows.turn == k)
        rows = d.row_traj[idx]  # the trajectories that reached turn k, one row each
        metrics["phase/boundaries"] = float(rows.size)
        if rows.size == 0:
            return metrics
        adv = estimators.seeupo_advantage(d.returns[rows], d.task_mean[rows], self.cfg.adv_clip)
        sub = d.rows.take(idx)
        # A·M through the row weight (M > 0, so min(ρAM, clip(ρ)AM) = M·min(ρA, clip(ρ)A))
        batch = dataclasses.replace(
            sub, advantages=Ragged(np.repeat(adv, sub.tokens.lengths), sub.tokens.offsets), weight=d.m[rows]
        )
        groups = d.returns.reshape(-1, self.cfg.G)
        metrics.update(
            {
                "return/mean": float(d.returns[rows].mean()),
                "adv/zero_rate": float(estimators.zero_advantage_mask(groups).mean()),
                "adv/abs_mean": float(np.abs(adv).mean()),
                "seeupo/m_mean": float(d.m[rows].mean()),
            }
        )
        metrics.update(rollout_train_ratio(ctx.learner, batch))
        metrics.update(self.ppo(ctx, batch, self.loss()))
        new = ctx.learner.logprobs(batch)
        delta = new.values - batch.old_logp.values
        tok_row = np.repeat(np.arange(len(batch)), batch.tokens.lengths)
        mean_delta = np.bincount(tok_row, delta, minlength=len(batch)) / batch.tokens.lengths
        d.m[rows] = estimators.seeupo_reweight(d.m[rows], mean_delta, self.cfg.m_eps)
        return metrics

    def rollouts_per_query(self, num_turns: int) -> float:
        return float(self.cfg.G)
