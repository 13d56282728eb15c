"""Tools from plain Python functions: the JSON schema of the arguments from the type hints (pydantic),
the descriptions from the docstring (Google, reST or NumPy style; docstring_parser).

    from rtpo.llm.tools import register_function

    @register_function
    def convert(amount: float, currency: Literal["EUR", "USD"] = "EUR") -> str:
        '''Convert an amount of dollars.

        Args:
            amount: how many dollars
            currency: the currency to convert to
        '''
        ...

registers a tool `convert` (a scenario names it in `task.tools`, a plugin module imports it).  The call's
arguments are checked against the schema by ToolSet.call like every tool's; the function gets them as
keyword arguments and its return value is the feedback text (a str as it is, anything else as JSON).  A
function that raises becomes "Error: ..." feedback (ToolSet.call), never a crash.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

from rtpo.llm.tools.base import TOOLS, Tool, ToolResult


def _strip_titles(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _strip_titles(v) for k, v in schema.items() if k != "title"}
    if isinstance(schema, list):
        return [_strip_titles(v) for v in schema]
    return schema


def function_schema(fn: Callable, name: str | None = None) -> dict:
    """The OpenAI function schema of `fn`: {name, description, parameters (JSON schema)}.  Every parameter
    needs a type hint; *args/**kwargs are refused (the model can only pass named JSON values)."""
    import docstring_parser
    from pydantic import TypeAdapter

    sig = inspect.signature(fn)
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ValueError(f"function tool {fn.__name__}: *{p.name} cannot be called with JSON arguments")
        if p.annotation is inspect.Parameter.empty:
            raise ValueError(f"function tool {fn.__name__}: parameter {p.name!r} has no type hint")
    params = _strip_titles(TypeAdapter(fn).json_schema())
    params.setdefault("properties", {})
    doc = docstring_parser.parse(inspect.getdoc(fn) or "")
    for p in doc.params:
        if p.arg_name in params["properties"] and p.description:
            params["properties"][p.arg_name]["description"] = " ".join(p.description.split())
    description = " ".join(part for part in (doc.short_description, doc.long_description) if part)
    return {"name": name or fn.__name__, "description": " ".join(description.split()), "parameters": params}


class FunctionTool(Tool):
    """A stateless Tool around a plain function (function_schema gives its schema)."""

    def __init__(self, fn: Callable, name: str | None = None) -> None:
        schema = function_schema(fn, name)
        self.fn = fn
        self.name, self.description, self.parameters = schema["name"], schema["description"], schema["parameters"]

    def execute(self, arguments: dict, state: Any = None) -> ToolResult:
        out = self.fn(**arguments)
        text = out if isinstance(out, str) else json.dumps(out, ensure_ascii=False, default=str)
        return ToolResult(text)


def register_function(fn: Callable | None = None, *, name: str | None = None):
    """Register `fn` as the tool `name` (default: the function's name); usable as @register_function or
    @register_function(name="..."); returns the function unchanged."""

    def deco(f: Callable) -> Callable:
        tool_name = name or f.__name__
        function_schema(f, tool_name)  # refuse a function without hints now, not when a scenario builds it
        TOOLS.register(tool_name)(lambda: FunctionTool(f, tool_name))
        return f

    return deco(fn) if fn is not None else deco
