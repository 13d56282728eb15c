"""The tool / environment-call pool: actors each holding one tool callable, fed by pull, surviving deaths."""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rtpo.distributed.actors import Faulty, PullPool


class ToolWorker(Faulty):
    """The tool actor body: one tool object (a callable built by the factory, e.g. a sandbox) per actor."""

    def __init__(self, factory: Callable[[], Callable[[Any], Any]]) -> None:
        self.tool = factory()

    def run(self, item: Any) -> Any:
        self._task_started()
        return self.tool(item)


class RayToolPool(PullPool):
    """A pool of tool / environment-call actors: `map(items)` runs tool(item) for each, load-balanced,
    surviving actor deaths (a lost call runs again; a tool must therefore be idempotent per item)."""

    def __init__(self, factory: Callable[[], Callable[[Any], Any]], num_workers: int, **kw: Any) -> None:
        super().__init__(ToolWorker, factory, num_workers, prefix="tools", **kw)

    def map(self, items: Sequence[Any], lock: Any = None) -> list:
        """tool(item) for each item, in order.  `lock` serialises actor revival between threads."""
        items = list(items)
        return self._map(len(items), lambda w, i: w.run.remote(items[i]), lock=lock)


def _star(fn: Callable[..., Any], args: tuple) -> Any:
    return fn(*args)


@dataclass(frozen=True)
class StarTool:
    """A picklable tool factory: each tool worker gets `args -> fn(*args)` (fn importable, e.g.
    rtpo.llm.sandbox.run_python)."""

    fn: Callable[..., Any]

    def __call__(self) -> Callable[[tuple], Any]:
        return functools.partial(_star, self.fn)


class PoolTool:
    """A plain callable `tool(*args)` that runs on a RayToolPool built with StarTool(fn): drop-in for an
    environment's injectable tool runner (LLMEnv(run_tool=PoolTool(pool))).  Safe to call from the
    environment's own threads: every call is its own pool task."""

    def __init__(self, pool: RayToolPool) -> None:
        self.pool = pool
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        return self.pool.map([args], lock=self._lock)[0]


@dataclass(frozen=True)
class ActorTool:
    """A picklable `tool(*args)` over a RayToolPool's actors, for use inside other actors (a rollout
    worker's environment: LLMEnv(run_tool=ActorTool(...)), wired by wrap_with_ray).  Each call goes to the
    next actor in turn; an actor Ray is restarting is waited for, a dead one is skipped (the call runs on
    the next), so a call is lost only when every tool actor is gone, and then it raises, naming that.
    Tools must be idempotent per call, as for RayToolPool."""

    actors: tuple
    wait_s: float = 120.0

    def __call__(self, *args: Any) -> Any:
        import ray

        rex = ray.exceptions
        start = next(_TURNS) % len(self.actors)
        errors = []
        for k in range(len(self.actors)):
            actor = self.actors[(start + k) % len(self.actors)]
            deadline = time.monotonic() + self.wait_s
            while True:
                try:
                    return ray.get(actor.run.remote(args))
                except rex.ActorUnavailableError:  # being restarted by Ray: wait for it
                    if time.monotonic() > deadline:
                        errors.append("unavailable")
                        break
                    time.sleep(0.05)
                except rex.RayActorError as e:  # died for good (or died holding this call): try the next
                    errors.append(type(e).__name__)
                    if isinstance(e, rex.ActorDiedError) or time.monotonic() > deadline:
                        break
        raise RuntimeError(
            f"every tool worker failed this call ({', '.join(errors)}); resources.tool_workers lost all actors"
        )


_TURNS = itertools.count()  # process-wide rotation over the tool actors
