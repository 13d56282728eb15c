"""Rollouts cut into chunks with their own rng streams, so a result never depends on who ran a chunk.

A distributed sampler receives the core driver's whole `rollout(...)` call (the hook in
rtpo.core.rollout), cuts it into chunks — one per boundary (or per trunk query) by default — and runs
each chunk as an ordinary local rollout on some worker.  Chunk i of a call draws from the stream
SeedSequence(key, spawn_key=(i,)), where `key` is one draw from the driver's rng: the driver's rng is a
function of (seed, iteration, phase) in a run, so each boundary's siblings are a function of
(seed, iteration, phase, boundary index) and of the weights, and of nothing else.  Snapshots travel
inside their chunk, so any worker can fork any boundary.

`LocalShards` runs the same chunks in this process: the single-process backend with per-boundary
streams, which the Ray pool must reproduce exactly.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from rtpo.core.protocols import ReportsMetrics
from rtpo.core.rollout import RolloutResult, rollout
from rtpo.core.types import Generation, Ragged

STREAM_KEY_BOUND = 2**63


@dataclass(frozen=True)
class DeferredEpisodes:
    """Episodes a worker pool will create: B fresh episodes of `query_ids`, or B forks of `snapshots`.

    The driver never holds live episodes of a distributed environment; it holds this description and
    hands it to the paired sampler's run_rollout.
    """

    query_ids: np.ndarray | None = None
    snapshots: tuple | None = None

    def __post_init__(self) -> None:
        if (self.query_ids is None) == (self.snapshots is None):
            raise ValueError("DeferredEpisodes holds either query_ids (reset) or snapshots (restore)")

    def __len__(self) -> int:
        return len(self.query_ids) if self.query_ids is not None else len(self.snapshots)


@dataclass(frozen=True)
class Chunk:
    """One unit of work: a few consecutive episodes of a rollout call, and everything needed to run them.

    index:     position in the call; selects the rng stream and the place in the merged result.
    key:       the call's stream key (one draw from the driver rng).
    query_ids: (b,) query ids of the chunk's episodes (before the n-fold expansion).
    snapshots: the boundaries' snapshots to fork from, or None to reset fresh episodes.
    n:         responses per episode at the first step (G−1 siblings per boundary).
    record_boundaries: whether the result carries boundaries (trunk rollouts).
    """

    index: int
    key: int
    query_ids: np.ndarray
    snapshots: tuple | None
    n: int
    record_boundaries: bool

    @property
    def num_results(self) -> int:
        return len(self.query_ids) * self.n


def chunk_rng(key: int, index: int) -> np.random.Generator:
    """The stream of chunk `index` of the call keyed `key` (independent streams via SeedSequence spawn keys)."""
    return np.random.default_rng(np.random.SeedSequence(int(key), spawn_key=(int(index),)))


def run_chunk(env: Any, sampler: Any, chunk: Chunk) -> RolloutResult:
    """Run one chunk with local env and sampler objects: what every worker executes."""
    rng = chunk_rng(chunk.key, chunk.index)
    if chunk.snapshots is None:
        episodes = env.reset(chunk.query_ids, rng)
    else:
        episodes = env.restore(list(chunk.snapshots))
    return rollout(env, sampler, episodes, chunk.query_ids, rng, n=chunk.n, record_boundaries=chunk.record_boundaries)


def make_chunks(
    episodes: DeferredEpisodes, query_ids: np.ndarray, key: int, n: int, record_boundaries: bool, chunk_size: int
) -> list[Chunk]:
    query_ids = np.asarray(query_ids, dtype=np.int64)
    if len(query_ids) != len(episodes):
        raise ValueError(f"rollout got {len(query_ids)} query ids for {len(episodes)} episodes")
    chunks = []
    for index, lo in enumerate(range(0, len(query_ids), chunk_size)):
        hi = min(lo + chunk_size, len(query_ids))
        snaps = None if episodes.snapshots is None else tuple(episodes.snapshots[lo:hi])
        chunks.append(Chunk(index, key, query_ids[lo:hi], snaps, n, record_boundaries))
    return chunks


def merge_results(chunks: Sequence[Chunk], results: Sequence[RolloutResult]) -> RolloutResult:
    """Concatenate chunk results in chunk order, renumbering each boundary's trunk to the merged index."""
    trajectories, boundaries = [], None
    if chunks and chunks[0].record_boundaries:
        boundaries = []
    base = 0
    for chunk, res in zip(chunks, results):
        if len(res.trajectories) != chunk.num_results:
            raise RuntimeError(
                f"chunk {chunk.index} returned {len(res.trajectories)} episodes, expected {chunk.num_results}"
            )
        trajectories.extend(res.trajectories)
        if boundaries is not None:
            for row in res.boundaries:
                boundaries.append([dataclasses.replace(b, trunk=b.trunk + base) for b in row])
        base += chunk.num_results
    return RolloutResult(
        trajectories, boundaries, tokens=sum(r.tokens for r in results), turns=sum(r.turns for r in results)
    )


class ChunkExecutor(Protocol):
    """Where chunks run: this process (LocalShards) or a pool of Ray actors (rtpo.distributed.pool)."""

    def env_info(self) -> tuple[int, float]:
        """(num_turns, gamma) of the environment the workers hold."""

    def run_chunks(self, chunks: Sequence[Chunk]) -> list[RolloutResult]:
        """Results in chunk order, each chunk run exactly as run_chunk would run it."""

    def load_weights(self, weights: Any) -> None: ...

    def generate(self, contexts: Ragged, turn: np.ndarray, n: int, seed: int) -> Generation: ...


class ShardedEnv:
    """Environment protocol on the driver for episodes that live on workers.

    reset/restore only describe the episodes (DeferredEpisodes); the paired ShardedSampler runs them.
    The per-step methods exist on the workers only.
    """

    def __init__(self, executor: ChunkExecutor) -> None:
        self.executor = executor
        self.num_turns, self.gamma = executor.env_info()

    def reset(self, query_ids: np.ndarray, rng: np.random.Generator) -> DeferredEpisodes:
        # the rng is not used here: each chunk resets with its own stream on its worker
        return DeferredEpisodes(query_ids=np.asarray(query_ids, dtype=np.int64).copy())

    def restore(self, snapshots: Sequence[Any]) -> DeferredEpisodes:
        return DeferredEpisodes(snapshots=tuple(snapshots))

    def _remote_only(self, name: str):
        raise TypeError(
            f"ShardedEnv.{name}: episodes of a distributed environment live on the workers; "
            "run them through rtpo.core.rollout.rollout with the paired sampler"
        )

    def contexts(self, episodes):
        self._remote_only("contexts")

    def turn_index(self, episodes):
        self._remote_only("turn_index")

    def step(self, episodes, gen, rng):
        self._remote_only("step")

    def snapshot(self, episodes):
        self._remote_only("snapshot")

    def take(self, episodes, idx):
        self._remote_only("take")


class ShardedSampler:
    """Sampler protocol whose rollouts run as chunks on an executor (see the module docstring).

    chunk_size: boundaries (or trunk queries) per chunk; 1 = per-boundary streams.  The result depends
                on chunk_size, never on the number of workers or on which worker ran a chunk.
    """

    def __init__(self, executor: ChunkExecutor, chunk_size: int = 1) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.executor = executor
        self.chunk_size = chunk_size

    def run_rollout(
        self,
        env: Any,
        episodes: Any,
        query_ids: np.ndarray,
        rng: np.random.Generator,
        n: int = 1,
        record_boundaries: bool = False,
    ) -> RolloutResult:
        if not isinstance(episodes, DeferredEpisodes):
            raise TypeError(
                f"a sharded sampler runs episodes made by its paired ShardedEnv, got {type(episodes).__name__}"
            )
        key = int(rng.integers(STREAM_KEY_BOUND))
        chunks = make_chunks(episodes, query_ids, key, n, record_boundaries, self.chunk_size)
        if not chunks:
            return RolloutResult([], [] if record_boundaries else None, 0, 0)
        return merge_results(chunks, self.executor.run_chunks(chunks))

    def generate(self, contexts: Ragged, turn: np.ndarray, n: int, rng: np.random.Generator) -> Generation:
        return self.executor.generate(contexts, np.asarray(turn), n, int(rng.integers(STREAM_KEY_BOUND)))

    def load_weights(self, weights: Any) -> None:
        self.executor.load_weights(weights)

    def pop_metrics(self) -> dict[str, float]:
        """The executor's generation metrics (gen/*, time/generate_s) since the last call, as the run loop
        pops a sampler's (rtpo.core.protocols.ReportsMetrics); {} from an executor that keeps none."""
        return self.executor.pop_metrics() if isinstance(self.executor, ReportsMetrics) else {}


def build_parts(factory: Callable[..., Any], role: str) -> Any:
    """Call a context factory for one role: factory(role=role) if it takes `role`, else factory().

    A factory returns a RunContext (or anything with env/sampler/learner/rng attributes); a role-aware
    one may leave out what the role does not use (an LLM rollout worker need not build a learner).
    """
    try:
        takes_role = "role" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        takes_role = False
    return factory(role=role) if takes_role else factory()


class LocalShards:
    """ChunkExecutor in this process, over one env and sampler."""

    def __init__(self, env: Any, sampler: Any) -> None:
        self.env = env
        self.sampler = sampler

    def env_info(self) -> tuple[int, float]:
        return int(self.env.num_turns), float(self.env.gamma)

    def run_chunks(self, chunks: Sequence[Chunk]) -> list[RolloutResult]:
        return [run_chunk(self.env, self.sampler, c) for c in chunks]

    def load_weights(self, weights: Any) -> None:
        self.sampler.load_weights(weights)

    def generate(self, contexts: Ragged, turn: np.ndarray, n: int, seed: int) -> Generation:
        return self.sampler.generate(contexts, turn, n, np.random.default_rng(seed))

    def pop_metrics(self) -> dict[str, float]:
        """The sampler's own metrics (an llm TrackedSampler: gen/*, time/generate_s), as in a plain run."""
        return self.sampler.pop_metrics() if isinstance(self.sampler, ReportsMetrics) else {}


def local_sharded(env: Any, sampler: Any, chunk_size: int = 1) -> tuple[ShardedEnv, ShardedSampler]:
    """The single-process backend with per-chunk streams: (env, sampler) for a RunContext."""
    ex = LocalShards(env, sampler)
    return ShardedEnv(ex), ShardedSampler(ex, chunk_size)
