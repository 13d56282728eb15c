"""The pieces the flat (whole-trajectory) methods share: root-to-leaf paths, their returns, the
flattened training batch of Eq. 9, the training-context choice, and GRPO's update phase.

GRPO, GSPO, SeeUPO, Tree-GRPO and ARPO import these from here, never from each other.  A trajectory is
one sequence (one seq_id) spread over its turn rows.  Training contexts are either the ones recorded at
rollout or the full-history contexts the environment exposes (`FullHistoryEnvironment`): with a
truncating ψ at rollout and full history at training this reproduces the mismatch of Eq. 2/10, and the
logged rollout/train ratio moves away from 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rtpo.core import estimators
from rtpo.core.loss import Aggregation, LossConfig, RatioLevel
from rtpo.core.methods.base import IterationState, Method, RunContext, UpdateConfig
from rtpo.core.train import rollout_train_ratio, turn_rows
from rtpo.core.types import Ragged, Rollouts, Trajectory, TurnBatch, discounted_return

TRAIN_CONTEXTS = ("auto", "rollout", "full_history")

# A path is the list of (trajectory, local turn index) rows from the root to a leaf; a plain trajectory
# is the path [(t, 0), (t, 1), ...]; a tree expansion is its parent's prefix rows followed by its own.
Path = list


def trajectory_path(t: Trajectory) -> Path:
    return [(t, j) for j in range(t.num_turns)]


def path_return(path: Path | Trajectory) -> float:
    """R of the whole root-to-leaf path (SPEC §1): Σ_j γ^{Σ_{m<j} τ_m} r_j over its rows in turn order.
    A Trajectory (an episode of a columnar rollout) is the path of its own turns."""
    if isinstance(path, Trajectory):
        return path.ret
    rewards = np.array([t.rewards[j] for t, j in path])
    durations = np.array([t.durations[j] for t, j in path])
    return discounted_return(rewards, durations, path[0][0].gamma)


def path_returns(paths: Sequence[Path] | Rollouts) -> np.ndarray:
    """R of every path; a Rollouts (columns) is one path per episode, its returns vectorised."""
    if isinstance(paths, Rollouts):
        return paths.returns()
    return np.array([path_return(p) for p in paths])


def training_contexts(rows: Sequence[tuple[Trajectory, int]], mode: str) -> Ragged | None:
    """The contexts a flat baseline trains on: None = the rollout contexts (turn_rows' default)."""
    if mode not in TRAIN_CONTEXTS:
        raise ValueError(f"train_context must be one of {TRAIN_CONTEXTS}, got {mode!r}")
    has_full = all(t.full_contexts is not None for t, _ in rows)
    if mode == "rollout" or (mode == "auto" and not has_full):
        return None
    if not has_full:
        raise ValueError("train_context='full_history' needs an environment that exposes full_contexts")
    return Ragged.from_rows([t.full_contexts[j] for t, j in rows], dtype=np.int64)


def flat_batch(paths: Sequence[Path] | Rollouts, advantages: np.ndarray, train_context: str) -> TurnBatch:
    """Flattened training batch: every row of path i carries advantages[i] and seq_id i (Eq. 9).
    paths may be a Rollouts (columns): path i is episode i, its rows gathered without a loop."""
    if isinstance(paths, Rollouts):
        if train_context not in TRAIN_CONTEXTS:
            raise ValueError(f"train_context must be one of {TRAIN_CONTEXTS}, got {train_context!r}")
        ep, rows = paths.episode_rows()
        adv = np.asarray(advantages, np.float64)[ep]
        batch = turn_rows(paths.select(ep), rows - paths.row_start[ep], adv, seq_id=ep)
        full = paths.full_contexts
        if train_context == "rollout" or (train_context == "auto" and full is None):
            return batch
        if full is None:
            raise ValueError("train_context='full_history' needs an environment that exposes full_contexts")
        full = full.take(rows)
        return dataclasses.replace(batch, contexts=Ragged(full.values.astype(np.int64), full.offsets))
    rows = [r for p in paths for r in p]
    seq = np.repeat(np.arange(len(paths)), [len(p) for p in paths])
    adv = np.asarray(advantages, np.float64)[seq]
    batch = turn_rows([t for t, _ in rows], [j for _, j in rows], adv, seq_id=seq)
    full = training_contexts(rows, train_context)
    return batch if full is None else dataclasses.replace(batch, contexts=full)


def _lengths(paths: Sequence[Path] | Rollouts) -> list[np.ndarray]:
    """Each path's per-turn response lengths (tokens)."""
    if isinstance(paths, Rollouts):
        _, rows = paths.episode_rows()
        return np.split(paths.tokens.lengths[rows], np.cumsum(paths.num_rows)[:-1])
    return [np.array([t.tokens.lengths[j] for t, j in p]) for p in paths]


def _groups(res, G: int) -> list[tuple[int, list]]:
    """(query, its G paths) of a rollout of G episodes per query, in order (per-episode paths)."""
    trajs = list(res.trajectories)
    return [(trajs[i].query_id, [trajectory_path(t) for t in trajs[i : i + G]]) for i in range(0, len(trajs), G)]


@dataclass(frozen=True)
class FlatUpdateConfig(UpdateConfig):
    """UpdateConfig plus the training context of the flat (whole-trajectory) methods.

    train_context: "rollout" (the recorded c_k), "full_history" (the environment's full-history
                   context; Eq. 2/10 mismatch under a truncating ψ) or "auto" (full history where the
                   environment exposes it, else the rollout contexts).
    """

    train_context: str = "auto"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.train_context not in TRAIN_CONTEXTS:
            raise ValueError(f"train_context must be one of {TRAIN_CONTEXTS}, got {self.train_context!r}")


@dataclass(frozen=True)
class GRPOConfig(FlatUpdateConfig):
    """GRPO's settings.

    G:              full trajectories per query (E.3: 16).
    normalize:      A = (R − μ)/(σ + 1e-6) (True) or R − μ (False, the form Eq. 1 writes, "Dr.GRPO").
    std:            σ of the normalised advantage: unbiased (n − 1, as verl, TRL and Tree-GRPO compute
                    it) or population (n).
    epochs, minibatch_size, clip_eps, clip_eps_high, kl_coef, log_ratio_clip, train_context:
                    FlatUpdateConfig's.
    dynamic_sampling: DAPO's dynamic sampling (Yu et al. 2025, §3.2): a query group whose returns are all
                    equal (zero advantage) is sampled again, up to max_resample_rounds more times, and
                    only groups with differing returns are trained on (all of them if none differ).  Every
                    rollout, kept or not, is charged to the budget (metrics dapo/*).
    max_resample_rounds: rounds of re-sampling the uninformative groups (dynamic_sampling).
    max_response_tokens: L_max, the longest response of a turn (set it to the backend's max_tokens); a
                    response this long was cut off.  Needed by overlong_filter and overlong_buffer.
    overlong_filter: DAPO's overlong filtering: trajectories with a cut-off response take part in their
                    group's advantage but leave the loss (their tokens are masked out).
    overlong_buffer: L_cache of DAPO's soft overlong punishment (Eq. 13): each turn whose response has ℓ >
                    L_max − L_cache tokens adds overlong_penalty·max((L_max − L_cache − ℓ)/L_cache, −1) to
                    the trajectory's return before the advantages (0 = off).
    overlong_penalty: the punishment's scale (DAPO: 1, the reward range).
    """

    G: int = 16
    normalize: bool = True
    std: str = "unbiased"
    dynamic_sampling: bool = False
    max_resample_rounds: int = 3
    max_response_tokens: int | None = None
    overlong_filter: bool = False
    overlong_buffer: int = 0
    overlong_penalty: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.std not in estimators.GROUP_STDS:
            raise ValueError(f"std must be one of {estimators.GROUP_STDS}, got {self.std!r}")
        if self.G < 2:
            raise ValueError(f"G must be >= 2 for a group-relative advantage, got {self.G}")
        if self.max_resample_rounds < 0:
            raise ValueError(f"max_resample_rounds must be >= 0, got {self.max_resample_rounds}")
        if self.overlong_buffer < 0 or self.overlong_penalty < 0:
            raise ValueError("overlong_buffer and overlong_penalty must be >= 0")
        if (self.overlong_filter or self.overlong_buffer) and self.max_response_tokens is None:
            raise ValueError(
                "max_response_tokens is needed by overlong_filter / overlong_buffer (L_max: backend.max_tokens)"
            )
        if self.max_response_tokens is not None and not 0 <= self.overlong_buffer < self.max_response_tokens:
            raise ValueError("overlong_buffer must be below max_response_tokens")


@dataclass
class FlatIteration:
    paths: list | Rollouts  # root-to-leaf paths; a Rollouts (columns) is one path per episode
    query_ids: np.ndarray  # (P,) query of each path
    metrics: dict


def group_metrics(returns: np.ndarray, adv: np.ndarray) -> dict[str, float]:
    """returns, adv: (Q, n) one group per query."""
    return {
        "return/mean": float(returns.mean()),
        "adv/zero_rate": float(estimators.zero_advantage_mask(returns).mean()),
        "adv/abs_mean": float(np.abs(adv).mean()),
    }


class GroupRelative(Method):
    """GRPO's iteration (Eq. 1, 9; SPEC §3), unregistered: G independent full trajectories per query, one
    group-relative advantage per trajectory spread over every response token, one flattened update.

    The registered flat methods subclass it and override the hooks: `ratio`/`aggregation` (GSPO),
    `begin` (how the paths are sampled: Tree-GRPO, ARPO), `group_size` and `advantages`."""

    Config: ClassVar[type] = GRPOConfig
    ratio: ClassVar[RatioLevel] = "token"
    aggregation: ClassVar[Aggregation] = "token-mean"

    def loss(self) -> LossConfig:
        c = self.cfg
        return c.loss_config(self.ratio, self.aggregation)

    def begin(self, ctx: RunContext, query_ids: np.ndarray) -> IterationState:
        ctx.sync()
        q = np.repeat(np.asarray(query_ids, dtype=np.int64), self.cfg.G)
        res = self.rollout(ctx, q)
        if getattr(self.cfg, "dynamic_sampling", False):
            return self._dynamic_sampling(ctx, res)
        paths = res.columns if res.columns is not None else [trajectory_path(t) for t in res.trajectories]
        return IterationState(pending=["update"], data=FlatIteration(paths, q, {}))

    def _dynamic_sampling(self, ctx: RunContext, res) -> IterationState:
        """DAPO's dynamic sampling (GRPOConfig.dynamic_sampling): keep the groups whose returns differ,
        sample the others' queries again (up to max_resample_rounds rounds), train on the kept ones."""
        G = self.cfg.G
        groups = _groups(res, G)
        kept, first = [], groups
        rounds = 0
        rollouts = len(res.trajectories)
        while True:
            pending = []
            for query, paths in groups:
                (kept if np.ptp(self.returns(paths)) > 0 else pending).append((query, paths))
            if not pending or rounds >= self.cfg.max_resample_rounds:
                break
            rounds += 1
            res = self.rollout(ctx, np.repeat(np.array([qq for qq, _ in pending], np.int64), G))
            rollouts += len(res.trajectories)
            groups = _groups(res, G)
        chosen = kept if kept else first  # nothing informative: the first round (zero advantages, no update)
        paths = [p for _, ps in chosen for p in ps]
        q = np.repeat(np.array([qq for qq, _ in chosen], np.int64), G)
        metrics = {
            "dapo/informative_groups": float(len(kept)),
            "dapo/resample_rounds": float(rounds),
            "dapo/rollouts": float(rollouts),
        }
        return IterationState(pending=["update"], data=FlatIteration(paths, q, metrics))

    def returns(self, paths: Sequence[Path] | Rollouts) -> np.ndarray:
        """R of each path, with DAPO's soft overlong punishment added when overlong_buffer > 0."""
        r = path_returns(paths)
        buf = getattr(self.cfg, "overlong_buffer", 0)
        if buf:
            lmax = self.cfg.max_response_tokens
            pen = [np.maximum((lmax - buf - lengths) / buf, -1.0).clip(max=0.0).sum() for lengths in _lengths(paths)]
            r = r + self.cfg.overlong_penalty * np.asarray(pen)
        return r

    def group_size(self) -> int:
        """Rows per query group (the paths of one query are contiguous in FlatIteration.paths)."""
        return self.cfg.G

    def advantages(self, returns: np.ndarray) -> np.ndarray:
        """(Q, G) returns of each query's group -> (Q, G) advantages (Eq. 1 / Eq. 9)."""
        return estimators.group_advantage(returns, normalize=self.cfg.normalize, std=self.cfg.std)

    def run_phase(self, ctx: RunContext, state: IterationState, key: Any) -> dict[str, float]:
        data: FlatIteration = state.data
        returns = self.returns(data.paths).reshape(-1, self.group_size())
        adv = self.advantages(returns)
        metrics = {"phase/turn": -1.0, **data.metrics, **group_metrics(returns, adv)}
        return self.update(ctx, data.paths, adv.reshape(-1), metrics)

    def update(self, ctx: RunContext, paths: list, adv: np.ndarray, metrics: dict) -> dict[str, float]:
        """The flattened PPO update on these paths with one advantage each (Eq. 9), metrics added.  With
        overlong_filter, paths holding a cut-off response leave the batch (DAPO's overlong filtering)."""
        batch = flat_batch(paths, adv, self.cfg.train_context)
        if getattr(self.cfg, "overlong_filter", False):
            cut = np.array([lengths.max() >= self.cfg.max_response_tokens for lengths in _lengths(paths)])
            metrics["dapo/overlong_rate"] = float(cut.mean()) if cut.size else 0.0
            if cut.all():  # nothing left to train on
                return metrics
            if cut.any():
                batch = batch.take(np.flatnonzero(~cut[batch.seq_id]))
        metrics.update(rollout_train_ratio(ctx.learner, batch))
        metrics.update(self.ppo(ctx, batch, self.loss()))
        return metrics

    def rollouts_per_query(self, num_turns: int) -> float:
        return float(self.cfg.G)
