"""The batched multi-turn rollout driver: from fresh queries or from boundary snapshots to episode end.

One call runs every episode of a batch turn by turn: at each step one Sampler.generate over all live
episodes, one Environment.step, and finished episodes drop out.  Records are kept column-wise per
step and assembled once at the end into columns (rtpo.core.types.Rollouts: one row per turn), so
neither the per-turn cost nor the assembly is a Python loop over episodes; a Trajectory object is built
only for code that asks for one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rtpo.core.protocols import Environment, Sampler
from rtpo.core.types import Boundary, Ragged, Rollouts, Trajectory


@dataclass(frozen=True)
class RolloutResult:
    """trajectories[i] is episode i (after the n-fold expansion of the first step, row-major).

    boundaries[i][j] is the boundary before turn start_turn+j of episode i (only when recorded).
    tokens: number of response tokens generated; turns: number of turns generated.
    columns: the same episodes as columns (rtpo.core.types.Rollouts), when the rollout was run here;
             then `trajectories` is that Rollouts itself (a Sequence building each Trajectory on
             demand) and `boundaries` builds each episode's list on demand.  None for results
             assembled elsewhere (distributed runners), whose trajectories are a plain list.
    """

    trajectories: Sequence[Trajectory]
    boundaries: Sequence[list[Boundary]] | None
    tokens: int
    turns: int
    columns: Rollouts | None = None

    def per_episode(self) -> RolloutResult:
        """The same result with one eager Trajectory (and list of Boundary) per episode and no columns:
        the per-episode path, which methods follow when columns is None."""
        bounds = None if self.boundaries is None else [list(b) for b in self.boundaries]
        return RolloutResult(list(self.trajectories), bounds, self.tokens, self.turns, None)


class _EpisodeBoundaries(Sequence):
    """boundaries[e] of a columnar rollout, built when asked for."""

    def __init__(self, columns: Rollouts) -> None:
        self.columns = columns

    def __len__(self) -> int:
        return len(self.columns)

    def __getitem__(self, e):
        if isinstance(e, slice):
            return [self[i] for i in range(len(self))[e]]
        return self.columns.boundaries_of(e)


def rollout(
    env: Environment,
    sampler: Sampler,
    episodes: Any,
    query_ids: np.ndarray,
    rng: np.random.Generator,
    n: int = 1,
    record_boundaries: bool = False,
) -> RolloutResult:
    """Run `episodes` (B live episodes at their current boundaries) to the end.

    n > 1 samples n responses per episode at the first step (one generate call with n samples per
    context: vLLM shares the prompt's prefix cache) and forks the episode n ways, giving B·n results.

    A sampler that runs whole episodes on its own workers (rtpo.distributed) is an EpisodeRunner; the
    call is handed to its `run_rollout` unchanged, so methods drive local and distributed backends
    through this one function.
    """
    # the two capability checks read the one method each protocol names (what isinstance on a
    # runtime-checkable protocol tests, without typing's per-call walk over the protocol's attributes)
    run_rollout = getattr(sampler, "run_rollout", None)  # an EpisodeRunner
    if run_rollout is not None:
        return run_rollout(env, episodes, query_ids, rng, n=n, record_boundaries=record_boundaries)
    query_ids = np.asarray(query_ids, dtype=np.int64)
    num = len(query_ids) * n
    live = np.arange(num, dtype=np.int64)  # episode id of every live row
    start_turn = np.asarray(env.turn_index(episodes), dtype=np.int64)
    if n > 1:
        start_turn = np.repeat(start_turn, n)
    steps: list[dict[str, Any]] = []
    first = True
    # optional: environments that can also show the full-history context (flat baselines train on it)
    full_fn = getattr(env, "full_contexts", None)  # a FullHistoryEnvironment
    while live.size:
        contexts = env.contexts(episodes)
        full = full_fn(episodes) if full_fn is not None else None
        turn = np.asarray(env.turn_index(episodes), dtype=np.int64)
        snaps = env.snapshot(episodes) if record_boundaries else None
        if first and n > 1:
            gen = sampler.generate(contexts, turn, n, rng)
            rep = np.repeat(np.arange(len(contexts)), n)
            episodes = env.take(episodes, rep)
            contexts = contexts.take(rep)
            turn = turn[rep]
            if snaps is not None:
                snaps = snaps[rep] if isinstance(snaps, np.ndarray) else [snaps[i] for i in rep]
            if full is not None:
                full = full.take(rep)
        else:
            gen = sampler.generate(contexts, turn, 1, rng)
        first = False
        episodes, out = env.step(episodes, gen, rng)
        steps.append(
            dict(
                ids=live,
                turn=turn,
                contexts=contexts,
                tokens=gen.tokens,
                logp=gen.logp,
                reward=np.asarray(out.reward, np.float64),
                duration=np.asarray(out.duration, np.float64),
                malformed=np.asarray(out.malformed, bool),
                snaps=snaps,
                full=full,
            )
        )
        keep = np.flatnonzero(~np.asarray(out.done, bool))
        if keep.size < live.size:
            episodes = env.take(episodes, keep)
            live = live[keep]
    return _assemble(steps, num, np.repeat(query_ids, n), start_turn, env.gamma, record_boundaries)


def _assemble(steps, num, query_ids, start_turn, gamma, record_boundaries) -> RolloutResult:
    """The per-step records as one Rollouts: rows sorted episode by episode (a stable sort, so each
    episode's rows stay in turn order), no per-episode objects."""
    ids = np.concatenate([s["ids"] for s in steps])
    order = np.argsort(ids, kind="stable")  # steps are in time order, so each episode stays ordered
    counts = np.bincount(ids, minlength=num)
    bounds = np.zeros(num + 1, dtype=np.int64)
    np.cumsum(counts, out=bounds[1:])
    turn = np.concatenate([s["turn"] for s in steps])[order]
    # every step of an episode advances its turn by one (checked once, vectorised)
    local = np.arange(ids.size) - np.repeat(bounds[:-1], counts)
    if not np.array_equal(turn, np.repeat(start_turn, counts) + local):
        raise RuntimeError("environment turn index did not advance by one per step")
    snaps = None
    if record_boundaries:
        if all(isinstance(s["snaps"], np.ndarray) for s in steps):
            snaps = np.concatenate([s["snaps"] for s in steps])[order]
        else:
            flat_snaps = [x for s in steps for x in s["snaps"]]
            snaps = [flat_snaps[i] for i in order]
    cols = Rollouts(
        turn=turn,
        contexts=Ragged.concat([s["contexts"] for s in steps]).take(order),
        tokens=Ragged.concat([s["tokens"] for s in steps]).take(order),
        logp=Ragged.concat([s["logp"] for s in steps]).take(order),
        reward=np.concatenate([s["reward"] for s in steps])[order],
        duration=np.concatenate([s["duration"] for s in steps])[order],
        malformed=np.concatenate([s["malformed"] for s in steps])[order],
        full_contexts=Ragged.concat([s["full"] for s in steps]).take(order) if steps[0]["full"] is not None else None,
        snapshots=snaps,
        row_start=bounds[:-1],
        num_rows=counts,
        query_id=query_ids,
        start_turn=start_turn,
        gamma=gamma,
    )
    return RolloutResult(
        cols,
        _EpisodeBoundaries(cols) if record_boundaries else None,
        tokens=int(cols.tokens.values.size),
        turns=int(ids.size),
        columns=cols,
    )
