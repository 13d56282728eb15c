"""Tree-GRPO (SPEC §3, A, E.3): M trees per query, L expansion rounds of N nodes each, M×(L×N+1) rollouts.

A node is one full turn (response + feedback).  Each tree starts as one full rollout.  In each round,
for every tree, N nodes are drawn uniformly among the root and the non-leaf turn nodes (without
replacement when there are enough), and one continuation is rolled out from each: from the root that is
a fresh answer to the prompt (boundary 0); from turn node t it is a new turn t+1 onward (boundary t+1).
Every rollout ends in one leaf, and every leaf's root-to-leaf path is a training sequence with
    A_leaf = norm over the leaves of the prompt + norm over the leaves of the tree   (estimators.tree_advantage)
so a shared prefix, present in each of its descendants' sequences, receives the sum over them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rtpo.core import estimators
from rtpo.core.methods.base import IterationState, RunContext, register_method
from rtpo.core.methods.flat import FlatIteration, FlatUpdateConfig, GroupRelative, path_return


@dataclass(frozen=True)
class TreeGRPOConfig(FlatUpdateConfig):
    """M trees per query, N expanded nodes per tree and round, L rounds (E.3: 4, 3, 1 -> 16 rollouts).
    std: σ of both norms, unbiased (n − 1, as Tree-GRPO's code) or population (n).
    Loss settings as GRPO's (token ratio, token-mean)."""

    M: int = 4
    N: int = 3
    L: int = 1
    std: str = "unbiased"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.std not in estimators.GROUP_STDS:
            raise ValueError(f"std must be one of {estimators.GROUP_STDS}, got {self.std!r}")
        if self.M < 1 or self.N < 0 or self.L < 0:
            raise ValueError(f"Tree-GRPO needs M >= 1, N >= 0, L >= 0, got M={self.M} N={self.N} L={self.L}")
        if self.M * (self.L * self.N + 1) < 2:
            raise ValueError(f"M×(L×N+1) leaves per prompt must be >= 2, got M={self.M} N={self.N} L={self.L}")


@dataclass
class _Node:
    """One rollout of a tree: its own trajectory, the full root-to-leaf path, and its boundaries."""

    path: list
    boundaries: list  # Boundary before each of its own turns (boundaries[j] is before turn start+j)
    traj: object


def expansion_candidates(nodes: list[_Node]) -> list[tuple[int, int]]:
    """(node index, fork turn b) for the root (node 0, b = 0) and every non-leaf turn node (turn t of a
    node, t before its last turn -> b = t + 1); each tree node appears exactly once."""
    cands = [(0, 0)]
    for i, nd in enumerate(nodes):
        t0 = nd.traj.start_turn
        cands += [(i, t + 1) for t in range(t0, nd.traj.end_turn)]
    return cands


@register_method("tree_grpo")
class TreeGRPO(GroupRelative):
    Config = TreeGRPOConfig

    def leaves_per_tree(self) -> int:
        return self.cfg.L * self.cfg.N + 1

    def begin(self, ctx: RunContext, query_ids: np.ndarray) -> IterationState:
        ctx.sync()
        cfg = self.cfg
        q = np.repeat(np.asarray(query_ids, dtype=np.int64), cfg.M)
        res = self.rollout(ctx, q, record_boundaries=True)
        trees = [[_Node([(t, j) for j in range(t.num_turns)], b, t)] for t, b in zip(res.trajectories, res.boundaries)]
        for _ in range(cfg.L):
            forks = []  # (tree, node, fork turn)
            for ti, nodes in enumerate(trees):
                cands = expansion_candidates(nodes)
                pick = ctx.rng.choice(len(cands), size=cfg.N, replace=len(cands) < cfg.N)
                forks += [(ti, *cands[c]) for c in pick]
            if not forks:
                continue
            snaps = [trees[ti][ni].boundaries[b - trees[ti][ni].traj.start_turn].snapshot for ti, ni, b in forks]
            fq = np.array([trees[ti][0].traj.query_id for ti, _, _ in forks], np.int64)
            new = self.rollout(ctx, fq, snaps, record_boundaries=True)
            for (ti, ni, b), t, bs in zip(forks, new.trajectories, new.boundaries):
                prefix = [(pt, j) for pt, j in trees[ti][ni].path if pt.start_turn + j < b]
                trees[ti].append(_Node(prefix + [(t, j) for j in range(t.num_turns)], bs, t))
        paths = [nd.path for nodes in trees for nd in nodes]
        qs = np.repeat(q, self.leaves_per_tree())
        metrics = {"tree/prefix_rows_mean": float(np.mean([len(p) for p in paths]))}
        return IterationState(pending=["update"], data=FlatIteration(paths, qs, metrics))

    def run_phase(self, ctx: RunContext, state: IterationState, key: object) -> dict[str, float]:
        data: FlatIteration = state.data
        cfg = self.cfg
        returns = np.array([path_return(p) for p in data.paths]).reshape(-1, cfg.M, self.leaves_per_tree())
        adv = estimators.tree_advantage(returns, std=self.cfg.std)
        flat_r = returns.reshape(returns.shape[0], -1)
        metrics = {
            "phase/turn": -1.0,
            **data.metrics,
            "return/mean": float(returns.mean()),
            "adv/zero_rate": float(estimators.zero_advantage_mask(flat_r).mean()),
            "adv/abs_mean": float(np.abs(adv).mean()),
        }
        return self.update(ctx, data.paths, adv.reshape(-1), metrics)

    def rollouts_per_query(self, num_turns: int) -> float:
        return float(self.cfg.M * self.leaves_per_tree())
