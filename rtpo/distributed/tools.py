"""The tool / environment-call pool: actors each holding one tool callable, fed by pull, surviving deaths."""

from __future__ import annotations

from collections.abc import Callable, Sequence
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

    def map(self, items: Sequence[Any]) -> list:
        items = list(items)
        return self._map(len(items), lambda w, i: w.run.remote(items[i]))
