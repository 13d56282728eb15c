"""RTPO with multi-trunk sampling and retroactive trunk selection (F.4, a direction the paper leaves open).

Per query, `candidates` complete trunks are sampled under π_θ0; afterwards `trunks_per_query` of them
are kept as anchors and the reverse phases fork siblings only from their boundaries.  The rule:

- "max_return" (default, the paper's suggestion "a high-reward trunk is selected as the anchor"): keep
  the trunks with the highest return, ties broken uniformly at random.  A failed early turn strands a
  trunk's later boundaries in low-value states where every sibling returns 0 (F.4); preferring a
  successful trunk moves the boundaries to states where sibling returns still differ.
- "random": keep uniformly random candidates (the control: same cost, no selection).

Selection changes only *which* boundary states are trained on.  The sibling estimator is conditioned on
the boundary state (Eq. 7, 52), so its expectation at each selected state is unchanged: selection adds
no bias to A^H, unlike selecting GRPO trajectories by return.  Cost: candidates − trunks_per_query
extra trunk rollouts per query.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rtpo.core.methods.base import IterationState, RunContext, register_method
from rtpo.core.methods.reverse import ReverseTurn, RTPOConfig, RTPOIteration
from rtpo.core.types import ReverseTree

SELECTION_RULES = ("max_return", "random")


@dataclass(frozen=True)
class RTPOMultiTrunkConfig(RTPOConfig):
    """candidates: trunks sampled per query (≥ trunks_per_query, which is how many are kept).
    select: the retroactive selection rule, one of SELECTION_RULES."""

    candidates: int = 4
    select: str = "max_return"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.candidates < self.trunks_per_query:
            raise ValueError(f"candidates ({self.candidates}) must be >= trunks_per_query ({self.trunks_per_query})")
        if self.select not in SELECTION_RULES:
            raise ValueError(f"select must be one of {SELECTION_RULES}, got {self.select!r}")


def select_trunks(returns: np.ndarray, keep: int, rule: str, rng: np.random.Generator) -> np.ndarray:
    """returns: (Q, C) candidate returns per query -> (Q, keep) indices of the kept candidates."""
    q, c = returns.shape
    if rule not in SELECTION_RULES:
        raise ValueError(f"unknown selection rule {rule!r}; valid: {', '.join(SELECTION_RULES)}")
    if keep >= c:  # nothing to choose (and no draw, so candidates == trunks_per_query is plain RTPO)
        return np.tile(np.arange(c), (q, 1))[:, :keep]
    noise = rng.random((q, c))  # random tie-break (and the whole order for "random")
    if rule == "max_return":
        order = np.lexsort((noise, -returns), axis=-1)  # primary key: -return, then the noise
    else:
        order = np.argsort(noise, axis=-1)
    return order[:, :keep]


@register_method("rtpo_multitrunk")
class RTPOMultiTrunk(ReverseTurn):
    Config = RTPOMultiTrunkConfig

    def begin(self, ctx: RunContext, query_ids: np.ndarray) -> IterationState:
        ctx.sync()
        cfg = self.cfg
        c = cfg.candidates
        q = np.repeat(np.asarray(query_ids, dtype=np.int64), c)
        res = self.rollout(ctx, q, record_boundaries=True)
        cand_returns = np.array([t.ret for t in res.trajectories]).reshape(-1, c)
        keep = select_trunks(cand_returns, cfg.trunks_per_query, cfg.select, ctx.rng)
        chosen = (np.arange(len(query_ids))[:, None] * c + keep).reshape(-1)
        tree = ReverseTree.from_rollout(
            [res.trajectories[i] for i in chosen], [res.boundaries[i] for i in chosen], ctx.env.num_turns
        )
        trunks = tree.trunks
        kept = np.array([t.ret for t in trunks])
        metrics = {
            "trunk/return_mean": float(kept.mean()),
            "trunk/candidate_return_mean": float(cand_returns.mean()),
            "trunk/turns_mean": float(np.mean([t.num_turns for t in trunks])),
            "trunk/malformed_rate": float(np.mean([t.malformed.mean() for t in trunks])),
        }
        return IterationState(pending=list(range(ctx.env.num_turns - 1, -1, -1)), data=RTPOIteration(tree, metrics))

    def rollouts_per_query(self, num_turns: int) -> float:
        return float(self.cfg.candidates + self.cfg.trunks_per_query * (self.cfg.G - 1) * num_turns)
