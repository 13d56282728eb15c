"""Actor plumbing shared by the rollout and tool pools: pull scheduling, revival, fault injection.

Imports numpy only, so a tool actor does not pay for torch.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np


class Faulty:
    """Fault injection for tests: the process exits when asked for task number after_tasks + 1.

    Only the armed incarnation dies: a restarted actor runs its constructor again and is healthy.
    """

    tasks = 0
    fault_after: int | None = None

    def arm_fault(self, after_tasks: int) -> None:
        self.fault_after = int(after_tasks)

    def _task_started(self) -> None:
        if self.fault_after is not None and self.tasks >= self.fault_after:
            os._exit(1)  # die mid-phase, holding an unfinished task
        self.tasks += 1

    def ping(self) -> int:
        return os.getpid()


class PullPool:
    """Actors of one kind, fed from a queue by pull; a dead actor's task is re-queued and the actor revived."""

    def __init__(
        self,
        body: type,
        factory: Callable[..., Any],
        num_workers: int,
        *,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        max_restarts: int = 3,
        inflight_per_worker: int = 1,
        strategy: Callable[[int], Any] | None = None,
        revive_timeout_s: float = 120.0,
        prefix: str = "ray",
    ) -> None:
        import ray

        if num_workers < 1:
            raise ValueError(f"a worker pool needs at least one worker, got {num_workers}")
        self._ray = ray
        self.factory = factory
        self.inflight_per_worker = inflight_per_worker
        self.revive_timeout_s = revive_timeout_s
        self.prefix = prefix
        # max_task_retries=0: the pool, not Ray, decides what re-runs where, and counts it
        self._cls = ray.remote(body)
        self._opts = dict(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=max_restarts, max_task_retries=0)
        self._strategy = strategy
        self.workers = [self._spawn(i) for i in range(num_workers)]
        self.pids = ray.get([w.ping.remote() for w in self.workers])
        self._metrics: dict[str, float] = {}
        self.failures = 0
        self.recreated = 0

    def _spawn(self, i: int):
        opts = dict(self._opts)
        if self._strategy is not None:
            opts["scheduling_strategy"] = self._strategy(i)
        return self._cls.options(**opts).remote(self.factory)

    def _map(self, n: int, submit: Callable[[Any, int], Any], lock: Any = None) -> list:
        """Run tasks 0..n-1 (submit(actor, i) -> ObjectRef) on idle actors; results in task order."""
        results: list = [None] * n
        queue = deque(range(n))
        slots = deque(i for _ in range(self.inflight_per_worker) for i in range(len(self.workers)))
        inflight: dict[Any, tuple[int, int]] = {}
        per_worker = np.zeros(len(self.workers), dtype=np.int64)
        failures0 = self.failures
        while queue or inflight:
            while queue and slots:
                w, c = slots.popleft(), queue.popleft()
                inflight[submit(self.workers[w], c)] = (w, c)
            done, _ = self._ray.wait(list(inflight), num_returns=1)
            for ref in done:
                w, c = inflight.pop(ref)
                try:
                    results[c] = self._ray.get(ref)
                    per_worker[w] += 1
                except self._ray.exceptions.RayActorError:
                    # the actor died holding task c: it runs again, first in line; finished tasks are
                    # already in `results` and are not repeated
                    self.failures += 1
                    queue.appendleft(c)
                    if lock is None:
                        self._revive(w)
                    else:
                        with lock:
                            self._revive(w)
                slots.append(w)
        p = self.prefix
        self._add(f"{p}/tasks", float(n))
        self._add(f"{p}/worker_failures", float(self.failures - failures0))
        self._metrics[f"{p}/tasks_per_worker_max"] = float(per_worker.max())
        self._metrics[f"{p}/tasks_per_worker_min"] = float(per_worker.min())
        return results

    def _revive(self, i: int) -> None:
        """Wait for Ray to restart actor i; once its restarts are spent, create a fresh one in its bundle."""
        rex = self._ray.exceptions
        deadline = time.monotonic() + self.revive_timeout_s
        while True:
            try:
                self.pids[i] = self._ray.get(self.workers[i].ping.remote(), timeout=self.revive_timeout_s)
                return
            except rex.ActorUnavailableError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            except (rex.ActorDiedError, rex.GetTimeoutError):
                break
        self._ray.kill(self.workers[i], no_restart=True)
        self.workers[i] = self._spawn(i)
        self.pids[i] = self._ray.get(self.workers[i].ping.remote())
        self.recreated += 1
        self._add(f"{self.prefix}/workers_recreated", 1.0)

    def arm_fault(self, worker: int, after_tasks: int) -> None:
        """Test hook: actor `worker` exits when it starts task after_tasks + 1 (see _Faulty)."""
        self._ray.get(self.workers[worker].arm_fault.remote(after_tasks))

    def _add(self, key: str, value: float) -> None:
        self._metrics[key] = self._metrics.get(key, 0.0) + value

    def pop_metrics(self) -> dict[str, float]:
        """Metrics since the last call (times are sums over the calls in between)."""
        out, self._metrics = self._metrics, {}
        return out

    def shutdown(self) -> None:
        for w in self.workers:
            self._ray.kill(w, no_restart=True)
        self.workers = []
