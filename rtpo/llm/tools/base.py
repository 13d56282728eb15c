"""Tools as a registry: every tool an LLM environment offers is a registered object (docs/tools.md).

A tool has an OpenAI-style function schema (`name`, `description`, JSON-schema `parameters`), rendered
into the Qwen3 system prompt by the tokenizer's own chat template (`Qwen3Chat(tools=toolset.schemas)`,
so the prompt ids equal `apply_chat_template(..., tools=...)`), and an `execute(arguments, state)`
that returns a `ToolResult`: the feedback text the model reads, whether the call succeeded, metrics,
and the tool set's new per-episode state.

`ToolSet` is what an environment holds: the tools of a scenario (`task.tools: [python, search]`) in
order.  `ToolSet.call` is the only way a call is run; it never raises for anything the model wrote:
an unknown tool name, arguments that fail the schema (checked with `jsonschema`, imported lazily) and
a tool that raises all become "Error: ..." feedback with `ok=False` and a metric
(`tool/unknown`, `tool/invalid_arguments`, `tool/crashed`).

State: a tool set can carry per-episode state (`initial_state(item)`), a picklable value kept inside
the episode snapshot; `execute` reads the state it is given and returns the next one (never mutating
it), so restoring a boundary re-runs nothing and two siblings forked from one snapshot never see each
other's calls.  Stateless tools ignore it and return `state` unchanged (ToolResult.state = None means
"unchanged").  The per-episode state of a ToolSet is a dict {state key: state}; a tool's key is
`Tool.state_key` (default its name), so a family of tools over one database (the airline's 14 tools)
shares one slot by giving them one key; `initial_state` is asked of the first tool of each key.

Metrics: ToolSet.call counts `tool/calls`, `tool/ok`, `tool/errors` and per tool
`tool/<name>/calls`, `tool/<name>/ok`; a tool's own metrics (ToolResult.metrics) are added under
`tool/<name>/<key>` (and, for the python tool's historical names, also as given when
`Tool.flat_metrics` is True).
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rtpo.core.registry import Registry


@dataclass(frozen=True)
class ToolResult:
    """The outcome of one call.  text: what the model reads; ok: the call did what was asked;
    metrics: counters added to the environment's metrics (under tool/<name>/); state: the tool's next
    per-episode state (None: unchanged); found: the names of what the call found, in order (search: the
    passages' titles), so a summary never has to parse them back out of `text`."""

    text: str
    ok: bool = True
    metrics: Mapping[str, float] = field(default_factory=dict)
    state: Any = None
    found: tuple[str, ...] = ()


class Tool:
    """Base class of a registered tool.  Subclasses set name/description/parameters and implement execute.

    stateful:     True when execute reads/returns per-episode state (calls of one episode then run in
                  order; stateless calls of a batch run in parallel threads).
    flat_metrics: also add the tool's metrics without the tool/<name>/ prefix (tool/<key>).
    """

    name: str = ""
    description: str = ""
    parameters: Mapping[str, Any] = {"type": "object", "properties": {}}
    stateful: bool = False
    flat_metrics: bool = False
    state_key: str | None = None  # the slot of the episode state this tool reads/writes (None: its name)

    @property
    def slot(self) -> str:
        return self.state_key or self.name

    @property
    def schema(self) -> dict:
        """The OpenAI function schema the chat template renders."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": dict(self.parameters)},
        }

    def initial_state(self, item: Any) -> Any:
        """The per-episode state at reset (item: the task item of the episode)."""
        return None

    def end_metrics(self, state: Any, item: Any) -> Mapping[str, float]:
        """Metrics of a finished episode from its final state (e.g. recall of the gold titles retrieved)."""
        return {}

    def check(self, arguments: dict) -> str | None:
        """An optional friendlier message than the schema's for a bad call (run before the schema)."""
        return None

    def execute(self, arguments: dict, state: Any = None) -> ToolResult:
        raise NotImplementedError


TOOLS: Registry = Registry("tool")
"""name -> factory(**params) -> Tool.  Register a user tool with `@TOOLS.register("name")`."""


def make_tool(name: str, **params) -> Tool:
    return TOOLS.build(name, **params)


def _validator(schema: Mapping[str, Any]):
    try:
        import jsonschema
    except ModuleNotFoundError:  # pragma: no cover - jsonschema is in the llm extra
        raise ModuleNotFoundError("tool argument validation needs jsonschema: pip install 'rtpo[llm]'") from None
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)  # a tool with a broken schema is refused when the tool set is built
    return cls(schema)


def _short(obj: Any, limit: int = 120) -> str:
    if isinstance(obj, str):
        return obj if len(obj) <= limit else obj[:limit] + "..."
    try:
        s = json.dumps(obj, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        s = repr(type(obj))
    return s if len(s) <= limit else s[:limit] + "..."


class ToolSet:
    """The tools an environment offers, in order (the order of the system prompt's tool list).

    tools: Tool objects, or registered names (built with default parameters); a list of Tools in place of
           one (what the `mcp` factory builds: every tool of one server) is spread in order.
    """

    def __init__(self, tools: Iterable[Tool | str]) -> None:
        built: list = []
        for t in tools:
            t = make_tool(t) if isinstance(t, str) else t
            built.extend(t if isinstance(t, (list, tuple)) else [t])  # a factory may serve several (mcp)
        self.tools: dict[str, Tool] = {}
        for t in built:
            if not isinstance(t, Tool) and not callable(getattr(t, "execute", None)):
                raise TypeError(f"ToolSet: {t!r} is not a Tool")
            if not t.name:
                raise ValueError(f"ToolSet: {type(t).__name__} has no name")
            if t.name in self.tools:
                raise ValueError(f"ToolSet: tool {t.name!r} listed twice")
            self.tools[t.name] = t
        self._validators = {name: _validator(t.parameters) for name, t in self.tools.items()}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.tools)

    @property
    def schemas(self) -> tuple[dict, ...]:
        return tuple(t.schema for t in self.tools.values())

    def __contains__(self, name: object) -> bool:
        return name in self.tools

    def __len__(self) -> int:
        return len(self.tools)

    def initial_state(self, item: Any) -> dict | None:
        """{tool name: state} of the stateful tools, None when there are none (nothing to carry)."""
        st: dict = {}
        for t in self.tools.values():
            if t.stateful and t.slot not in st:
                st[t.slot] = t.initial_state(item)
        return st or None

    def end_metrics(self, state: dict | None, item: Any, metrics: collections.Counter) -> None:
        """Add each stateful tool's end-of-episode metrics (tool/<name>/<key>) for a finished episode."""
        seen = set()
        for t in self.tools.values():
            if t.stateful and t.slot not in seen:
                seen.add(t.slot)
                for k, v in t.end_metrics((state or {}).get(t.slot), item).items():
                    metrics[f"tool/{t.slot}/{k}"] += v

    def check(self, name: str, arguments: Any) -> str | None:
        """Why a call cannot run (unknown tool, arguments failing the schema), None when it can."""
        if name not in self.tools:
            return f"unknown tool {name!r}; the tools are " + ", ".join(repr(n) for n in self.tools)
        if not isinstance(arguments, dict):
            return f"the arguments of {name!r} must be a JSON object"
        own = self.tools[name].check(arguments) if hasattr(self.tools[name], "check") else None
        if own:
            return own
        errors = sorted(self._validators[name].iter_errors(arguments), key=lambda e: list(e.path))
        if errors:
            e = errors[0]
            where = "/".join(str(p) for p in e.path) or "arguments"
            return f"invalid arguments for {name!r}: {where}: {_short(e.message, 200)}"
        return None

    def call(self, name: str, arguments: Any, state: dict | None, metrics: collections.Counter) -> ToolResult:
        """Run one call on the episode state `state`; returns the result with `state` = the next tool-set
        state (a new dict, or the same object when nothing changed).  Never raises for a bad call."""
        metrics["tool/attempted"] += 1
        problem = self.check(name, arguments)
        if problem is not None:
            metrics["tool/unknown" if name not in self.tools else "tool/invalid_arguments"] += 1
            metrics["tool/errors"] += 1
            return ToolResult(f"Error: {problem}.", ok=False, state=state)
        tool = self.tools[name]
        own = state.get(tool.slot) if (state and tool.stateful) else None
        metrics["tool/calls"] += 1
        metrics[f"tool/{name}/calls"] += 1
        try:
            res = tool.execute(arguments, own)
        except Exception as e:  # a tool bug is feedback + a metric, the run goes on
            metrics["tool/crashed"] += 1
            metrics["tool/errors"] += 1
            return ToolResult(
                f"Error: the tool {name!r} failed ({type(e).__name__}: {_short(str(e))}).", False, state=state
            )
        if not isinstance(res, ToolResult):
            metrics["tool/crashed"] += 1
            metrics["tool/errors"] += 1
            return ToolResult(f"Error: the tool {name!r} returned no result.", False, state=state)
        metrics["tool/ok"] += int(res.ok)  # always present, as before the registry
        metrics["tool/errors"] += int(not res.ok)
        metrics[f"tool/{name}/ok"] += int(res.ok)
        for k, v in res.metrics.items():
            metrics[f"tool/{name}/{k}"] += v
            if tool.flat_metrics:
                metrics[f"tool/{k}"] += v
        new_state = state
        if tool.stateful and res.state is not None:
            new_state = dict(state or {})
            new_state[tool.slot] = res.state
        return ToolResult(res.text, res.ok, res.metrics, new_state, res.found)

    def run_batch(
        self,
        calls: Sequence[Sequence[tuple[str, Any]]],
        states: Sequence[dict | None],
        metrics: collections.Counter,
        threads: int = 4,
    ) -> list[tuple[list[ToolResult], dict | None]]:
        """The calls of many episodes: calls[i] = episode i's (name, arguments) in order, states[i] its state.

        Episodes run in parallel threads (a stateful episode's calls in order; the stateless calls of all
        episodes each on their own), so results are the same as running them one by one.
        Returns, per episode, its results and its final state."""
        n = len(calls)
        out: list[list[ToolResult | None]] = [[None] * len(c) for c in calls]
        final: list[dict | None] = list(states)
        jobs: list[Callable[[], None]] = []
        lock_free: list[collections.Counter] = []

        def chain(i: int) -> Callable[[], None]:
            local = collections.Counter()
            lock_free.append(local)

            def run() -> None:
                st = states[i]
                for j, (name, args) in enumerate(calls[i]):
                    r = self.call(name, args, st, local)
                    st = r.state
                    out[i][j] = r
                final[i] = st

            return run

        def single(i: int, j: int) -> Callable[[], None]:
            local = collections.Counter()
            lock_free.append(local)

            def run() -> None:
                name, args = calls[i][j]
                out[i][j] = self.call(name, args, states[i], local)

            return run

        for i in range(n):
            if not calls[i]:
                continue
            if any(name in self.tools and self.tools[name].stateful for name, _ in calls[i]):
                jobs.append(chain(i))
            else:
                jobs.extend(single(i, j) for j in range(len(calls[i])))
        if len(jobs) == 1 or threads <= 1:
            for job in jobs:
                job()
        elif jobs:
            with ThreadPoolExecutor(max_workers=max(1, min(threads, len(jobs)))) as pool:
                for f in [pool.submit(job) for job in jobs]:
                    f.result()
        for local in lock_free:
            metrics.update(local)
        return [([r for r in out[i] if r is not None], final[i]) for i in range(n)]


def make_toolset(spec: Iterable[str | Mapping[str, Any] | Tool]) -> ToolSet:
    """A ToolSet from a scenario's list: names, {name: params} mappings, or Tool objects."""
    tools: list[Tool] = []
    for s in spec:
        if isinstance(s, str):
            tools.append(make_tool(s))
        elif isinstance(s, Mapping):
            if len(s) != 1:
                raise ValueError(f"a tool entry must be a name or {{name: {{params}}}}, got {_short(s)}")
            ((name, params),) = s.items()
            tools.append(make_tool(name, **dict(params or {})))
        else:
            tools.append(s)
    return ToolSet(tools)


__all__ = ["TOOLS", "Tool", "ToolResult", "ToolSet", "make_tool", "make_toolset"]
