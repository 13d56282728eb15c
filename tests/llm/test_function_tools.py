"""Tools from plain Python functions (rtpo.llm.tools.function): the schema from type hints and the
docstring, registration by name, and calls through ToolSet.call (checked arguments, errors as feedback).

Mutants: dropping the docstring's parameter descriptions, or leaving pydantic's titles in, turns
test_schema_from_hints_and_docstring red; calling the function positionally breaks test_calls_through_a_toolset.
"""

from __future__ import annotations

import collections
from typing import Literal

import pytest

from rtpo.llm.tools import TOOLS, ToolSet, function_schema, make_toolset, register_function


def convert(amount: float, currency: Literal["EUR", "GBP"] = "EUR", rounded: bool = True) -> str:
    """Convert an amount of US dollars.

    Uses a fixed table.

    Args:
        amount: how many dollars
        currency: the currency to convert to
        rounded: round to cents
    """
    rate = {"EUR": 0.5, "GBP": 0.25}[currency]
    value = amount * rate
    return f"{round(value, 2) if rounded else value} {currency}"


def test_schema_from_hints_and_docstring():
    assert function_schema(convert) == {
        "name": "convert",
        "description": "Convert an amount of US dollars. Uses a fixed table.",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "amount": {"type": "number", "description": "how many dollars"},
                "currency": {
                    "type": "string",
                    "enum": ["EUR", "GBP"],
                    "default": "EUR",
                    "description": "the currency to convert to",
                },
                "rounded": {"type": "boolean", "default": True, "description": "round to cents"},
            },
            "required": ["amount"],
        },
    }


def test_functions_without_hints_are_refused():
    def bad(x, y: int) -> str:
        return ""

    with pytest.raises(ValueError, match="parameter 'x' has no type hint"):
        function_schema(bad)

    def star(*xs: int) -> str:
        return ""

    with pytest.raises(ValueError, match="cannot be called with JSON"):
        register_function(star, name="star_tool_never_registered")
    assert "star_tool_never_registered" not in TOOLS


def test_calls_through_a_toolset():
    register_function(convert, name="convert_test_tool")

    @register_function(name="boom_test_tool")
    def boom(n: int) -> dict:
        """Fails for odd n."""
        if n % 2:
            raise RuntimeError("odd")
        return {"half": n // 2}

    tools: ToolSet = make_toolset(["convert_test_tool", "boom_test_tool"])
    m: collections.Counter = collections.Counter()
    assert tools.call("convert_test_tool", {"amount": 3, "currency": "GBP"}, {}, m).text == "0.75 GBP"
    assert tools.call("boom_test_tool", {"n": 4}, {}, m).text == '{"half": 2}'
    bad = tools.call("convert_test_tool", {"amount": "lots"}, {}, m)
    assert not bad.ok and bad.text.startswith("Error") and m["tool/invalid_arguments"] == 1
    crashed = tools.call("boom_test_tool", {"n": 3}, {}, m)
    assert not crashed.ok and "odd" in crashed.text and m["tool/crashed"] == 1
    names = [s["function"]["name"] for s in tools.schemas]
    assert names == ["convert_test_tool", "boom_test_tool"]
