"""The sandboxed Python tool on the registry: `python(code)` runs in rtpo.llm.sandbox (fail closed).

LLMEnv's math task still runs this tool through its own batched path (parallel threads, its
historical `tool/*` metric names); this registered form is what a ToolSet offers (`task.tools`).
"""

from __future__ import annotations

from typing import Any

from rtpo.llm.chat import PYTHON_TOOL
from rtpo.llm.sandbox import SandboxLimits, run_python
from rtpo.llm.tools.base import TOOLS, Tool, ToolResult


@TOOLS.register("python")
class PythonTool(Tool):
    """Run a program in a fresh sandbox; feedback is stdout then stderr, capped at max_feedback_chars."""

    name = "python"
    description = PYTHON_TOOL["function"]["description"]
    parameters = PYTHON_TOOL["function"]["parameters"]

    def __init__(self, limits: SandboxLimits | None = None, max_feedback_chars: int = 2000) -> None:
        self.limits = limits or SandboxLimits()
        self.max_feedback_chars = max_feedback_chars

    def execute(self, arguments: dict, state: Any = None) -> ToolResult:
        res = run_python(str(arguments.get("code", "")), self.limits)
        if res.error:
            return ToolResult(
                f"Error: the tool could not run ({res.error}).", False, {"refused": float(res.isolation == "refused")}
            )
        text = (
            res.stdout + ("\n" if res.stdout and res.stderr and not res.stdout.endswith("\n") else "") + res.stderr
        ).rstrip("\n")
        cut = len(text) > self.max_feedback_chars
        text = text[: self.max_feedback_chars] + (" [output cut]" if cut else "")
        metrics = {"timeouts": float(res.timed_out), "truncated": float(res.truncated or cut)}
        return ToolResult(text, res.ok, metrics)
