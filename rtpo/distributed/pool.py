"""Rollout worker actors and the driver-side pool that feeds them chunks by pull (a ChunkExecutor).

Each rollout actor holds one Sampler + Environment built by a picklable factory.  The driver keeps a
queue of chunks; whenever an actor is idle it gets the next one (pull scheduling, so a slow actor or a
long chunk never holds the others up).  Weights go out once per sync: `ray.put` on the driver (or on
the trainer's rank 0), then every actor gets the same ObjectRef.  Each task carries the current
weights version and ref, so an actor that was restarted mid-phase reloads exactly the weights its lost
chunks were meant to run with; with the chunk's own rng stream the re-run reproduces the lost result
exactly, and chunks that had finished are already on the driver.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rtpo.core.metrics import GENERATION_COUNTS, generation_metrics
from rtpo.core.protocols import CountsGeneration, ReportsMetrics
from rtpo.core.rollout import RolloutResult
from rtpo.core.types import Generation, Ragged
from rtpo.distributed.actors import Faulty, PullPool
from rtpo.distributed.shards import Chunk, build_parts, run_chunk


@dataclass(frozen=True)
class RemoteWeights:
    """Weights already in the Ray object store (put by the trainer's rank 0); `ref` is an ObjectRef."""

    ref: Any


class RolloutWorker(Faulty):
    """The rollout actor body (wrapped with ray.remote by the pool): one env + sampler, weights by version."""

    def __init__(self, factory: Callable[..., Any]) -> None:
        parts = build_parts(factory, "rollout")
        self.env, self.sampler = parts.env, parts.sampler
        self.version = -1  # -1: the factory's initial weights

    def env_info(self) -> tuple[int, float]:
        return int(self.env.num_turns), float(self.env.gamma)

    def sync(self, version: int, ref_box: list) -> float:
        """Load weights `version` (ref_box = [ObjectRef], boxed so Ray resolves it only when needed)."""
        t0 = time.perf_counter()
        if version != self.version and version >= 0:
            import ray

            if ref_box[0] is None:
                raise RuntimeError(
                    f"rollout worker holds weights version {self.version}, needs {version}, and no "
                    "object-store copy came with the task"
                )
            self.sampler.load_weights(ray.get(ref_box[0]))
            self.version = version
        return time.perf_counter() - t0

    # -- collective weight sync (rtpo.distributed.collective) --------------------------------------------
    def join_weight_group(
        self, host: str, port: int, rank: int, size: int, epoch: int, backend: str, timeout_s: float
    ) -> None:
        from rtpo.distributed.collective import WeightGroupMember

        if getattr(self, "_member", None) is None:
            self._member = WeightGroupMember()
        self._member.join(host, port, rank, size, epoch, backend, timeout_s)

    def receive_weights(self, version: int, spec: Any, bucket_bytes: int) -> float:
        """Receive weights `version` from trainer rank 0 over the weight group and load them."""
        t0 = time.perf_counter()
        self.sampler.load_weights(self._member.receive(spec, bucket_bytes))
        self.version = version
        return time.perf_counter() - t0

    def _generation_counts(self) -> dict[str, float]:
        return self.sampler.pop_generation_counts() if isinstance(self.sampler, CountsGeneration) else {}

    def run(
        self, version: int, ref_box: list, chunk: Chunk
    ) -> tuple[RolloutResult, dict[str, float], dict[str, float]]:
        """The chunk's result, the environment's counters it added (tool calls, answers, time/ sums) and
        the sampler's generation counts (rtpo.core.metrics.GENERATION_COUNTS).

        The counters travel with the result they belong to, so a chunk lost with a dead actor and run
        again is counted once, and only by the run whose result the driver keeps."""
        self._task_started()
        self.sync(version, ref_box)
        if isinstance(self.env, ReportsMetrics):
            self.env.pop_metrics()  # counters of anything before this chunk (e.g. a sync-time probe)
        self._generation_counts()
        result = run_chunk(self.env, self.sampler, chunk)
        counters = self.env.pop_metrics() if isinstance(self.env, ReportsMetrics) else {}
        return result, {k: float(v) for k, v in counters.items()}, self._generation_counts()

    def generate(
        self, version: int, ref_box: list, contexts: Ragged, turn: np.ndarray, n: int, seed: int
    ) -> tuple[Generation, dict[str, float]]:
        self.sync(version, ref_box)
        self._generation_counts()
        out = self.sampler.generate(contexts, turn, n, np.random.default_rng(seed))
        return out, self._generation_counts()


class RayRolloutPool(PullPool):
    """ChunkExecutor over RolloutWorker actors (metrics under `ray/`)."""

    def __init__(self, factory: Callable[..., Any], num_workers: int, **kw: Any) -> None:
        super().__init__(RolloutWorker, factory, num_workers, prefix="ray", **kw)
        self.version = -1
        self._ref = None  # the current weights' ObjectRef, kept alive while any task may need it
        self._box: list = [None]  # what tasks carry: [ref]; filled lazily after a collective sync
        self._provider: Callable[[], RemoteWeights] | None = None
        self._gen: dict[str, float] = {}  # the workers' generation counts since the last pop_metrics

    def env_info(self) -> tuple[int, float]:
        return self._ray.get(self.workers[0].env_info.remote())

    def load_weights(self, weights: Any) -> None:
        """Broadcast: one object in the store, every actor loads it (timed: ray/weight_sync_s)."""
        t0 = time.perf_counter()
        self._ref = weights.ref if isinstance(weights, RemoteWeights) else self._ray.put(weights)
        self._box, self._provider = [self._ref], None
        self.version += 1
        calls = [(i, w.sync.remote(self.version, self._box)) for i, w in enumerate(self.workers)]
        load_s = []
        for i, ref in calls:
            try:
                load_s.append(self._ray.get(ref))
            except self._ray.exceptions.RayActorError:
                # a dead actor catches up lazily: every task carries the version and the ref
                self.failures += 1
                self._revive(i)
        self._add("ray/weight_syncs", 1.0)
        self._add("ray/weight_sync_s", time.perf_counter() - t0)
        if load_s:
            self._metrics["ray/weight_load_max_s"] = max(self._metrics.get("ray/weight_load_max_s", 0.0), max(load_s))

    def set_version(self, version: int, provider: Callable[[], RemoteWeights]) -> None:
        """Every worker already holds weights `version` (a collective sync delivered them); `provider` puts
        a copy in the object store on demand, for a worker revived later and for current_weights()."""
        self.version, self._ref, self._box, self._provider = version, None, [None], provider

    def _ensure_ref(self) -> None:
        if self._ref is None and self._provider is not None:
            self._ref = self._provider().ref
            self._box[0] = self._ref  # the same list in-flight submissions of this version carry

    def _revive(self, i: int) -> None:
        super()._revive(i)
        self._ensure_ref()  # the new incarnation holds the factory's weights: it catches up from the store

    def current_weights(self) -> Any:
        """The weights the workers hold (None before the first load_weights: the factory's own)."""
        self._ensure_ref()
        return None if self._ref is None else self._ray.get(self._ref)

    def run_chunks(self, chunks: Sequence[Chunk]) -> list[RolloutResult]:
        t0 = time.perf_counter()
        version, box = self.version, self._box
        done = self._map(len(chunks), lambda w, c: w.run.remote(version, box, chunks[c]))
        for _, counters, gen in done:
            # the workers' environment counters, summed, under the names the in-process env logs them:
            # env/<key>, and the wall-clock sums time/<key> (summed over workers that ran in parallel)
            for k, v in counters.items():
                self._add(k if k.startswith("time/") else f"env/{k}", v)
            self._add_generation(gen)
        self._add("ray/rollout_s", time.perf_counter() - t0)
        return [r for r, _, _ in done]

    def generate(self, contexts: Ragged, turn: np.ndarray, n: int, seed: int) -> Generation:
        out, gen = self._ray.get(self.workers[0].generate.remote(self.version, self._box, contexts, turn, n, seed))
        self._add_generation(gen)
        return out

    def _add_generation(self, counts: dict[str, float]) -> None:
        for k in GENERATION_COUNTS:
            self._gen[k] = self._gen.get(k, 0.0) + float(counts.get(k, 0.0))

    def pop_metrics(self) -> dict[str, float]:
        """The pool's ray/* metrics and the workers' generation as an in-process sampler reports it:
        time/generate_s, gen/tokens, gen/responses, gen/response_len_mean, gen/tokens_per_s (summed
        counts, then rtpo.core.metrics.generation_metrics)."""
        out = super().pop_metrics()
        gen, self._gen = self._gen, {}
        out.update(generation_metrics(gen))
        return out
