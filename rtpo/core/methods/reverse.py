"""The pieces RTPO and its variants share: the settings, the trunk statistics, the clamped continuation
weights of Eq. 105/109, and the reverse-turn iteration of Algorithm 1 itself.

Algorithm 1 (§3, E.1): trunk rollout, then reverse-order per-turn phases with on-policy siblings.  For
k = K−1 down to 0: synchronise the sampler to the current θ (θ_{>k}); fork G−1 siblings from every trunk
boundary at turn k and continue each to the end under π_{θ>k}; advantage A^H_{j,k} = R_j − V̂_k with V̂_k
the siblings' mean return (Eq. 7, 52); PPO on the siblings' turn-k tokens only (Eq. 6, 80).  The trunk
gets no gradient and is in no baseline.  rtpo, rtpo_offpolicy, rtpo_sync_interval, rtpo_sync_kl,
rtpo_multitrunk and rtpo_adaptive import these from here, never from each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rtpo.core import estimators
from rtpo.core.loss import LossConfig
from rtpo.core.methods.base import IterationState, Method, RunContext, UpdateConfig
from rtpo.core.protocols import Learner
from rtpo.core.train import rollout_train_ratio, turn_rows
from rtpo.core.types import BoundaryRows, Ragged, ReverseTree, Rollouts, Trajectory, discounted_return


@dataclass(frozen=True)
class RTPOConfig(UpdateConfig):
    """RTPO's settings (E.3 defaults where the paper gives them); the update settings are UpdateConfig's.

    G:                group size; each boundary gets G−1 on-policy siblings (G ≥ 2; G = 2 is degenerate).
    trunks_per_query: trunks sampled per query (E.3: 4 for math, 2 for search).
    estimator:        registered advantage estimator applied to each sibling group.
    drop_zero_groups: leave groups whose siblings all tie (every A = 0) out of the update.
    """

    G: int = 4
    trunks_per_query: int = 1
    estimator: str = "sibling_mean"
    drop_zero_groups: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.G < 2:
            raise ValueError(f"G must be >= 2 (G-1 >= 1 siblings), got {self.G}")
        if self.trunks_per_query < 1:
            raise ValueError("trunks_per_query must be >= 1")
        estimators.get(self.estimator)  # unknown names fail here, listing the valid ones

    def loss(self) -> LossConfig:
        """Eq. 6: token ratio, mean over siblings of each sibling's token mean."""
        return self.loss_config("token", "seq-mean-token-mean")


def trunk_outcomes(returns: np.ndarray, turns: list[int] | np.ndarray, num_turns: int) -> dict[str, float]:
    """Trunk outcome statistics (Appendix G, Tables 7, 12, 13): the online success rate (return > 0),
    and for failed trunks (return <= 0) the share of all trunks failing at each turn k (the turn their
    episode ended in) and their mean length in turns."""
    returns = np.asarray(returns, dtype=np.float64)
    turns = np.asarray(turns, dtype=np.int64)
    failed = returns <= 0
    out = {"trunk/success_rate": float((~failed).mean())}
    for k in range(num_turns):
        out[f"trunk/fail_turn_{k}"] = float((failed & (turns == k + 1)).mean())
    if failed.any():
        out["trunk/failed_turns_mean"] = float(turns[failed].mean())
    return out


@dataclass
class RTPOIteration:
    tree: ReverseTree
    trunk_metrics: dict


def continuation_weight(learner: Learner, siblings: list[Trajectory], rho_min: float, rho_max: float) -> np.ndarray:
    """ω̄_j of Eq. 105 for each sibling: the product over its continuation turns (after its first turn)
    of π_learner / π_rollout, clamped.  (n,) ones where a sibling has no continuation."""
    rows = [(s, j) for s in siblings for j in range(1, s.num_turns)]
    if not rows:
        return np.ones(len(siblings))
    batch = turn_rows([s for s, _ in rows], [j for _, j in rows], np.zeros(len(rows)))
    new = learner.logprobs(batch).values
    per_sib = np.array([sum(s.tokens.lengths[1:]) for s in siblings], np.int64)
    offsets = np.concatenate([[0], np.cumsum(per_sib)])
    new_d, _ = Ragged(new, offsets).to_dense(0.0)
    old_d, _ = Ragged(batch.old_logp.values, offsets).to_dense(0.0)
    if new_d.shape[1] == 0:
        return np.ones(len(siblings))
    return estimators.clamped_trajectory_weight(new_d, old_d, rho_min, rho_max)


def reweighted_returns(
    learner: Learner, siblings: list[Trajectory], rho_min: float, rho_max: float
) -> tuple[np.ndarray, np.ndarray]:
    """(Q̂^off of Eq. 109 for each sibling, its ω̄).  With a sampler synced to the learner ω̄ ≡ 1 and
    Q̂^off is the plain return (Eq. 108)."""
    omega = continuation_weight(learner, siblings, rho_min, rho_max)
    r_k = np.array([s.rewards[0] for s in siblings])
    disc = np.array([s.gamma ** s.durations[0] if s.gamma != 1.0 else 1.0 for s in siblings])
    f = np.array(
        [discounted_return(s.rewards[1:], s.durations[1:], s.gamma) if s.num_turns > 1 else 0.0 for s in siblings]
    )
    return estimators.off_policy_turn_value(r_k, disc, f, omega), omega


def boundary_inputs(tree: ReverseTree, k: int) -> tuple[np.ndarray, Any, Ragged]:
    """(query id, snapshot, recorded context c_k) of every trunk boundary at turn k, columnar or not."""
    bounds, trunks = tree.boundaries[k], tree.trunks
    if isinstance(bounds, BoundaryRows) and isinstance(trunks, Rollouts):
        return trunks.query_id[bounds.trunk], bounds.snapshots, bounds.contexts
    trunk_q = np.array([trunks[b.trunk].query_id for b in bounds], dtype=np.int64)
    return trunk_q, [b.snapshot for b in bounds], Ragged.from_rows([b.context for b in bounds], dtype=np.int64)


def check_sibling_contexts(sibs, recorded: Ragged, boundary_of: np.ndarray, k: int) -> None:
    """Sibling i must see exactly the recorded c_k of boundary boundary_of[i] (snapshot/restore is exact)."""
    if isinstance(sibs, Rollouts):
        seen = sibs.contexts.take(sibs.row_start)
        w = seen._uniform_width()
        if w and w == recorded._uniform_width():  # equal-length contexts: compare the (rows, w) blocks
            got, want = seen.values.reshape(-1, w), np.take(recorded.values.reshape(-1, w), boundary_of, axis=0)
            if not np.array_equal(got, want):
                raise RuntimeError(f"sibling context differs from the recorded c_{k}: snapshot/restore is not exact")
            return
    else:
        seen = Ragged.from_rows([s.contexts[0] for s in sibs], dtype=np.int64)
    if not seen.equals(recorded.take(boundary_of)):
        raise RuntimeError(f"sibling context differs from the recorded c_{k}: snapshot/restore is not exact")


class ReverseTurn(Method):
    """RTPO's iteration (Algorithm 1), unregistered: the registered RTPO and its variants subclass it and
    override the schedule hooks (`should_sync`, `sibling_returns`) or `begin`/`run_phase`."""

    Config: ClassVar[type] = RTPOConfig

    # -- schedule hooks (variants override these, the algorithm body stays one) --------------------
    def should_sync(self, k: int, state: IterationState) -> bool:
        """On-policy RTPO pushes θ_{>k} to the sampler before every phase (Algorithm 1 step 2.1)."""
        return True

    def sibling_returns(self, ctx: RunContext, state: IterationState, k: int, siblings: list) -> np.ndarray:
        """R_j of each sibling; on-policy the plain return (Eq. 108, ω ≡ 1).  Variants whose sampler is
        stale (sync schedules, G.6) reweight the continuation here (Eq. 109)."""
        if isinstance(siblings, Rollouts):
            return siblings.returns()
        return np.array([s.ret for s in siblings])

    def begin(self, ctx: RunContext, query_ids: np.ndarray) -> IterationState:
        ctx.sync()  # trunks are sampled under the current θ (θ_0 of this iteration)
        q = np.repeat(np.asarray(query_ids, dtype=np.int64), self.cfg.trunks_per_query)
        res = self.rollout(ctx, q, record_boundaries=True)
        num_turns = ctx.env.num_turns
        cols = res.columns
        if cols is not None:  # columnar: the boundaries stay arrays (BoundaryRows per turn)
            tree = ReverseTree.from_columns(cols, num_turns)
            trunk_returns, turns, malformed = cols.returns(), cols.num_rows, cols.malformed_rate()
        else:
            tree = ReverseTree.from_rollout(res.trajectories, res.boundaries, num_turns)
            trunk_returns = np.array([t.ret for t in res.trajectories])
            turns = np.array([t.num_turns for t in res.trajectories])
            malformed = np.array([t.malformed.mean() for t in res.trajectories])
        metrics = {
            "trunk/return_mean": float(trunk_returns.mean()),
            **trunk_outcomes(trunk_returns, turns, num_turns),
            "trunk/turns_mean": float(np.mean(turns)),
            "trunk/malformed_rate": float(np.mean(malformed)),
        }
        return IterationState(pending=list(range(num_turns - 1, -1, -1)), data=RTPOIteration(tree, metrics))

    def run_phase(self, ctx: RunContext, state: IterationState, k: int) -> dict[str, float]:
        data: RTPOIteration = state.data
        metrics: dict[str, float] = {"phase/turn": float(k)}
        if state.done_phases == 1:  # the iteration's first phase reports the trunks
            metrics.update(data.trunk_metrics)
        if self.should_sync(k, state):
            ctx.sync()
            metrics["phase/synced"] = 1.0
        else:
            metrics["phase/synced"] = 0.0
        bounds = data.tree.boundaries[k]
        metrics["phase/boundaries"] = float(len(bounds))
        if not bounds:
            return metrics
        return self.fork_and_train(ctx, state, k, metrics)

    def fork_and_train(self, ctx: RunContext, state: IterationState, k: int, metrics: dict) -> dict[str, float]:
        """Algorithm 1 steps 2.2–2.4 at the (non-empty) turn-k boundaries: G−1 siblings from each, the
        sibling advantage, PPO on turn k.  Variants that allocate siblings differently override this."""
        tree = state.data.tree
        n, m = self.cfg.G - 1, len(tree.boundaries[k])
        trunk_q, snaps, recorded = boundary_inputs(tree, k)
        res = self.rollout(ctx, trunk_q, snaps, n=n)
        sibs = res.trajectories
        check_sibling_contexts(sibs, recorded, np.repeat(np.arange(m), n), k)
        returns = np.asarray(self.sibling_returns(ctx, state, k, sibs), np.float64).reshape(m, n)
        return self.train_on_siblings(ctx, sibs, returns, metrics)

    def train_on_siblings(self, ctx: RunContext, sibs: list, returns: np.ndarray, metrics: dict) -> dict[str, float]:
        """Algorithm 1 steps 2.3–2.4: the configured estimator on each sibling group (returns: (boundaries,
        G−1), sibs in the same row-major order), then PPO on the siblings' turn-k tokens only (Eq. 6, 80)."""
        n = returns.shape[1]
        adv = estimators.get(self.cfg.estimator)(returns)
        zero = estimators.zero_advantage_mask(returns)
        metrics.update(self.advantage_metrics(returns, adv, zero))
        keep = ~np.repeat(zero, n) if self.cfg.drop_zero_groups else np.ones(len(sibs), dtype=bool)
        return self.update_turn(ctx, sibs, adv.reshape(-1), keep, metrics)

    def update_turn(
        self,
        ctx: RunContext,
        sibs: list,
        adv: np.ndarray,
        keep: np.ndarray,
        metrics: dict,
        weight: np.ndarray | None = None,
    ) -> dict[str, float]:
        """Algorithm 1 step 2.4: PPO on the turn-k tokens (Eq. 6, 80) of the siblings with keep[i], sibling
        i carrying the advantage adv[i] (both (len(sibs),)) and, if given, the surrogate weight weight[i]."""
        rows = np.flatnonzero(keep)
        if rows.size == 0:
            return metrics
        chosen = sibs.select(rows) if isinstance(sibs, Rollouts) else [sibs[i] for i in rows]
        w = None if weight is None else np.asarray(weight, np.float64)[rows]
        batch = turn_rows(chosen, np.zeros(rows.size, np.int64), np.asarray(adv)[rows], weight=w)
        metrics.update(rollout_train_ratio(ctx.learner, batch))
        metrics.update(self.ppo(ctx, batch, self.cfg.loss()))
        return metrics

    @staticmethod
    def advantage_metrics(returns: np.ndarray, adv: np.ndarray, zero: np.ndarray) -> dict[str, float]:
        zero_rate = float(zero.mean())
        return {
            "return/mean": float(returns.mean()),
            "adv/zero_rate": zero_rate,
            "adv/zero_rollout_share": zero_rate,  # equal groups: the share of siblings in tied groups
            "adv/abs_mean": float(np.abs(adv).mean()),
            "adv/value_std_across_boundaries": float(returns.mean(axis=1).std()),
        }

    def rollouts_per_query(self, num_turns: int) -> float:
        """Upper bound: trunks + (G−1) siblings at every boundary, if every trunk reaches every turn."""
        return self.cfg.trunks_per_query * (1 + (self.cfg.G - 1) * num_turns)
