"""The batched multi-turn rollout driver: from fresh queries or from boundary snapshots to episode end.

One call runs every episode of a batch turn by turn: at each step one Sampler.generate over all live
episodes, one Environment.step, and finished episodes drop out.  Records are kept column-wise per
step and assembled into Trajectories once at the end, so the per-turn cost is array work, not a
Python loop over episodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rtpo.core.protocols import Environment, EpisodeRunner, FullHistoryEnvironment, Sampler
from rtpo.core.types import Boundary, Ragged, Trajectory


@dataclass(frozen=True)
class RolloutResult:
    """trajectories[i] is episode i (after the n-fold expansion of the first step, row-major).

    boundaries[i][j] is the boundary before turn start_turn+j of episode i (only when recorded).
    tokens: number of response tokens generated; turns: number of turns generated.
    """

    trajectories: list[Trajectory]
    boundaries: list[list[Boundary]] | None
    tokens: int
    turns: int


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
    if isinstance(sampler, EpisodeRunner):
        return sampler.run_rollout(env, episodes, query_ids, rng, n=n, record_boundaries=record_boundaries)
    query_ids = np.asarray(query_ids, dtype=np.int64)
    num = len(query_ids) * n
    live = np.arange(num, dtype=np.int64)  # episode id of every live row
    start_turn = np.asarray(env.turn_index(episodes), dtype=np.int64)
    if n > 1:
        start_turn = np.repeat(start_turn, n)
    steps: list[dict[str, Any]] = []
    first = True
    # optional: environments that can also show the full-history context (flat baselines train on it)
    full_fn = env.full_contexts if isinstance(env, FullHistoryEnvironment) else None
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
                snaps = [snaps[i] for i in rep]
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
    ids = np.concatenate([s["ids"] for s in steps])
    order = np.argsort(ids, kind="stable")  # steps are in time order, so each episode stays ordered
    ids_sorted = ids[order]
    counts = np.bincount(ids_sorted, minlength=num)
    bounds = np.zeros(num + 1, dtype=np.int64)
    np.cumsum(counts, out=bounds[1:])
    contexts = Ragged.concat([s["contexts"] for s in steps]).take(order)
    full = Ragged.concat([s["full"] for s in steps]).take(order) if steps[0]["full"] is not None else None
    tokens = Ragged.concat([s["tokens"] for s in steps]).take(order)
    logp = Ragged.concat([s["logp"] for s in steps]).take(order)
    turn = np.concatenate([s["turn"] for s in steps])[order]
    reward = np.concatenate([s["reward"] for s in steps])[order]
    duration = np.concatenate([s["duration"] for s in steps])[order]
    malformed = np.concatenate([s["malformed"] for s in steps])[order]
    snaps = None
    if record_boundaries:
        flat_snaps = [x for s in steps for x in s["snaps"]]
        snaps = [flat_snaps[i] for i in order]

    # every step of an episode advances its turn by one (checked once, vectorised)
    local = np.arange(ids.size) - np.repeat(bounds[:-1], counts)
    if not np.array_equal(turn, np.repeat(start_turn, counts) + local):
        raise RuntimeError("environment turn index did not advance by one per step")
    trajectories: list[Trajectory] = []
    boundaries: list[list[Boundary]] | None = [] if record_boundaries else None
    for e in range(num):
        lo, hi = int(bounds[e]), int(bounds[e + 1])
        trajectories.append(
            Trajectory(
                contexts=_rows(contexts, lo, hi),
                tokens=_rows(tokens, lo, hi),
                logp=_rows(logp, lo, hi),
                rewards=reward[lo:hi],
                durations=duration[lo:hi],
                malformed=malformed[lo:hi],
                query_id=int(query_ids[e]),
                start_turn=int(start_turn[e]),
                gamma=gamma,
                full_contexts=_rows(full, lo, hi) if full is not None else None,
            )
        )
        if boundaries is not None:
            boundaries.append(
                [Boundary(trunk=e, k=int(turn[i]), snapshot=snaps[i], context=contexts[i]) for i in range(lo, hi)]
            )
    return RolloutResult(trajectories, boundaries, tokens=int(tokens.values.size), turns=int(ids.size))


def _rows(r: Ragged, lo: int, hi: int) -> Ragged:
    """Rows lo..hi-1 of r, which are contiguous after the episode sort: a slice, not a gather."""
    off = r.offsets[lo : hi + 1]
    rebased = off - off[0]
    rebased.flags.writeable = False
    return Ragged._unchecked(r.values[off[0] : off[-1]], rebased)  # a read-only view of a checked Ragged
