"""The tool registry: registered tools with schemas, validation before execute, never raising; a
user-defined stateful tool whose per-episode state is forked, not shared."""

from __future__ import annotations

import collections

import pytest

pytest.importorskip("jsonschema")

from rtpo.llm.tools import TOOLS, Tool, ToolResult, ToolSet, make_toolset  # noqa: E402


class Counter(Tool):
    """A user-defined stateful tool: `add(n)` adds n to a per-episode total and reports it."""

    name = "add"
    description = "Add n to the running total."
    parameters = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    stateful = True

    def initial_state(self, item):
        return 0

    def execute(self, arguments, state=None):
        total = state + arguments["n"]
        return ToolResult(str(total), True, state=total)


def test_bad_calls_are_feedback_and_metrics_never_exceptions():
    ts = ToolSet([Counter()])
    m = collections.Counter()
    st = ts.initial_state(None)
    for name, args, problem in [
        ("nope", {}, "tool/unknown"),
        ("add", {"n": "3"}, "tool/invalid_arguments"),
        ("add", {}, "tool/invalid_arguments"),
        ("add", {"n": 1, "extra": 2}, "tool/invalid_arguments"),
        ("add", [1, 2], "tool/invalid_arguments"),
    ]:
        r = ts.call(name, args, st, m)
        assert not r.ok and r.text.startswith("Error: ") and r.state is st
        assert m[problem] >= 1
    assert m["tool/errors"] == 5 and m["tool/calls"] == 0


def test_state_is_a_value_forks_never_share_it():
    ts = ToolSet([Counter()])
    m = collections.Counter()
    s0 = ts.initial_state(None)
    s1 = ts.call("add", {"n": 2}, s0, m).state
    a = ts.call("add", {"n": 10}, s1, m).state  # sibling a
    b = ts.call("add", {"n": 100}, s1, m).state  # sibling b, forked from the same boundary
    assert (s0["add"], s1["add"], a["add"], b["add"]) == (0, 2, 12, 102)


def test_the_python_tool_is_registered_and_runs_in_the_sandbox():
    ts = make_toolset(["python"])
    assert ts.schemas[0]["function"]["name"] == "python" and "python" in TOOLS.names()
    m = collections.Counter()
    r = ts.call("python", {"code": "print(6 * 7)"}, None, m)
    assert (r.ok and r.text == "42") or "refused" in r.text  # refused only where the kernel cannot isolate
    assert ts.call("python", {"code": 5}, None, m).text.startswith("Error: ")
