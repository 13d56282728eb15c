"""The sandboxed Python tool (rtpo.llm.sandbox, fail closed) as a registered tool: `task.tools: [python]`.

LLMEnv runs its python calls through this tool (ToolSet.run_batch: parallel threads), with the
feedback format and flat `tool/*` metric names it had before the registry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rtpo.llm.chat import PYTHON_TOOL
from rtpo.llm.sandbox import SandboxLimits, SandboxResult, run_python
from rtpo.llm.tools.base import TOOLS, Tool, ToolResult

PYTHON_SCHEMA: dict[str, Any] = PYTHON_TOOL  # defined beside the chat format (its default tool list)


@TOOLS.register("python")
class PythonTool(Tool):
    """Runs `code` in a fresh sandboxed subprocess (no state between calls).

    limits: the sandbox limits of one call; run: the code runner (default: the sandbox; the Ray tool
    pool and tests inject theirs); max_feedback_chars: output shown to the model is cut to this.
    Metrics (also under their historical flat names tool/<key>): timeouts, truncated, refused, unisolated.
    """

    name = "python"
    description = PYTHON_SCHEMA["function"]["description"]
    parameters = PYTHON_SCHEMA["function"]["parameters"]
    flat_metrics = True

    def __init__(
        self,
        limits: SandboxLimits | dict | None = None,
        max_feedback_chars: int = 2000,
        run: Callable[[str, SandboxLimits], SandboxResult] | None = None,
    ) -> None:
        self.limits = SandboxLimits(**limits) if isinstance(limits, dict) else (limits or SandboxLimits())
        self.run = run or run_python
        self.max_feedback_chars = max_feedback_chars

    def check(self, arguments: dict) -> str | None:
        code = arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            return "the python tool needs a non-empty string argument 'code'"
        return None

    def execute(self, arguments: dict, state: Any = None) -> ToolResult:
        res = self.run(arguments["code"], self.limits)
        metrics = {
            "timeouts": int(res.timed_out),
            "truncated": int(res.truncated),
            "refused": int(res.isolation == "refused"),  # no kernel isolation: fail closed
            "unisolated": int(res.isolation == "rlimits"),  # sandbox.allow_unisolated
        }
        return ToolResult(self.format(res), ok=bool(res.ok), metrics=metrics)

    def format(self, res: SandboxResult) -> str:
        if res.error:
            return f"Error: the tool could not run ({res.error})."
        text = res.stdout
        if res.stderr.strip():
            text = (text + ("\n" if text and not text.endswith("\n") else "") + res.stderr) if text else res.stderr
        text = text.rstrip("\n")
        cap = self.max_feedback_chars
        notes = []
        if len(text) > cap:
            text = text[:cap]
            notes.append("output cut")
        if res.truncated:
            notes.append("output limit reached, program stopped")
        if res.timed_out:
            notes.append(f"time limit of {self.limits.wall_time_s:g}s reached, program stopped")
        elif res.signal is not None:
            notes.append(
                f"killed by signal {res.signal}" + (" (" + ", ".join(res.limits_hit) + ")" if res.limits_hit else "")
            )
        elif res.exit_code not in (0, None):
            notes.append(f"exit code {res.exit_code}")
        if not text and not notes:
            return "(no output)"
        return text + ("\n" if text and notes else "") + "".join(f"[{n}]" for n in notes)
