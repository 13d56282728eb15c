"""ARPO (SPEC §3, A, E.3): entropy-triggered branching after tool calls under a fixed rollout budget.

Per query: N of the M budgeted rollouts start from the prompt.  After each tool call (on the tabular
backend every turn is one), the rollout's normalised entropy H_k at the next boundary is compared with
its entropy H_0 at the prompt, ΔH = H_k − H_0.  Two branching rules:

- `stochastic: true` (the public code): draw u ~ U(0,1) and branch iff clip(u − β·ΔH, 0, 1) ≤ τ, i.e.
  with probability clip(τ + β·ΔH, 0, 1).  τ is the threshold here and α plays no part.
- `stochastic: false` (the paper's text): P = clip(α + β·ΔH, 0, 1) and branch iff P > τ.

With E.3's α = τ = 0.5 the stochastic rule branches with the paper text's P.

A variant, not the public implementation, in how often it branches: here each initial rollout branches
at most once (at its first trigger), branches do not branch again, and the rest of the budget is filled
with fresh rollouts.  The public code re-tests the rule at every tool round of every rollout, branches
included (a tree grown recursively until the M slots are spent).  The variant keeps the budget
accounting of a flat group simple; it spends fewer slots on branches of branches.  Every rollout's
root-to-leaf path is a training sequence with the plain GRPO advantage over the query's M rows ("soft"
attribution: a shared prefix, present in several sequences, receives the sum of their advantages).

The entropy comes from the sampler, an `EntropySampler`: `normalized_entropy(contexts, turn) -> (B,)`, H/log|V|
(the public code uses the top-k log-probs of the first 20 new tokens; the tabular sampler gives the
exact entropy of π(·|c_k) / log A).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rtpo.core import estimators
from rtpo.core.methods.base import IterationState, RunContext, register_method
from rtpo.core.methods.flat import FlatIteration, FlatUpdateConfig, GroupRelative, trajectory_path
from rtpo.core.protocols import EntropySampler
from rtpo.core.types import Ragged


@dataclass(frozen=True)
class ARPOConfig(FlatUpdateConfig):
    """M: rollout budget per query (16); N: initial rollouts (8); alpha, beta, tau: E.3's 0.5, 0.2, 0.5.
    stochastic: branch with probability clip(tau + beta·ΔH) (public code; alpha unused) or iff
                clip(alpha + beta·ΔH) > tau (paper text); see `branch_probability`.
    normalize: GRPO's normalised advantage; std: its σ, unbiased (n − 1) or population (n), as GRPO's.
    Loss settings as GRPO's."""

    M: int = 16
    N: int = 8
    alpha: float = 0.5
    beta: float = 0.2
    tau: float = 0.5
    stochastic: bool = True
    normalize: bool = True
    std: str = "unbiased"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.std not in estimators.GROUP_STDS:
            raise ValueError(f"std must be one of {estimators.GROUP_STDS}, got {self.std!r}")
        if not 1 <= self.N <= self.M or self.M < 2:
            raise ValueError(f"ARPO needs 1 <= N <= M and M >= 2, got N={self.N} M={self.M}")


def branch_probability(h_now: np.ndarray, h_init: float, cfg: ARPOConfig) -> np.ndarray:
    """(n,) per boundary: the probability the stochastic rule branches with, clip(τ + β·ΔH, 0, 1) (public
    code), or the paper text's P = clip(α + β·ΔH, 0, 1) that the deterministic rule compares with τ."""
    base = cfg.tau if cfg.stochastic else cfg.alpha
    return estimators.arpo_branch_probability(h_now, h_init, base, cfg.beta)


def first_branch(p: np.ndarray, u: np.ndarray | None, tau: float) -> int:
    """Index of the first boundary that triggers a branch (-1 if none).  p, u: (n,) per boundary."""
    hit = (u < p) if u is not None else (p > tau)
    idx = np.flatnonzero(hit)
    return int(idx[0]) if idx.size else -1


@register_method("arpo")
class ARPO(GroupRelative):
    Config = ARPOConfig

    def begin(self, ctx: RunContext, query_ids: np.ndarray) -> IterationState:
        ctx.sync()
        cfg = self.cfg
        if not isinstance(ctx.sampler, EntropySampler):
            raise TypeError(
                f"arpo needs a sampler with normalized_entropy(contexts, turn); {type(ctx.sampler).__name__} has none"
            )
        query_ids = np.asarray(query_ids, dtype=np.int64)
        q = np.repeat(query_ids, cfg.N)
        res = self.rollout(ctx, q, record_boundaries=True)
        all_b = [b for row in res.boundaries for b in row]
        h = np.asarray(
            ctx.sampler.normalized_entropy(
                Ragged.from_rows([b.context for b in all_b], dtype=np.int64), np.array([b.k for b in all_b], np.int64)
            ),
            np.float64,
        )
        nq = len(query_ids)
        slots = np.full(nq, cfg.M - cfg.N)  # branch + fill slots left per query (by position in the batch)
        forks, pos = [], 0
        for i, (t, row) in enumerate(zip(res.trajectories, res.boundaries)):
            h_row = h[pos : pos + len(row)]
            pos += len(row)
            p = branch_probability(h_row[1:], h_row[0], cfg)
            u = ctx.rng.random(p.size) if cfg.stochastic else None
            j = first_branch(p, u, cfg.tau)
            if j >= 0 and slots[i // cfg.N] > 0:
                slots[i // cfg.N] -= 1
                forks.append((i // cfg.N, t, row[j + 1]))
        paths = [trajectory_path(t) for t in res.trajectories]
        group = list(np.repeat(np.arange(nq), cfg.N))
        if forks:
            fq = np.array([t.query_id for _, t, _ in forks], np.int64)
            br = self.rollout(ctx, fq, [b.snapshot for _, _, b in forks])
            for (g, t, b), nt in zip(forks, br.trajectories):
                paths.append([(t, j) for j in range(b.k - t.start_turn)] + trajectory_path(nt))
                group.append(g)
        fresh_g = np.repeat(np.arange(nq), slots)
        if fresh_g.size:
            fq = query_ids[fresh_g]
            fr = self.rollout(ctx, fq)
            paths += [trajectory_path(t) for t in fr.trajectories]
            group += list(fresh_g)
        order = np.argsort(np.asarray(group), kind="stable")  # the M rows of each query contiguous
        paths = [paths[i] for i in order]
        metrics = {"arpo/branches_per_query": len(forks) / len(query_ids), "arpo/entropy_mean": float(h.mean())}
        qs = np.array([p[0][0].query_id for p in paths], np.int64)
        return IterationState(pending=["update"], data=FlatIteration(paths, qs, metrics))

    def advantages(self, returns: np.ndarray) -> np.ndarray:
        return estimators.group_advantage(returns, normalize=self.cfg.normalize, std=self.cfg.std)

    def group_size(self) -> int:
        return self.cfg.M

    def rollouts_per_query(self, num_turns: int) -> float:
        return float(self.cfg.M)
