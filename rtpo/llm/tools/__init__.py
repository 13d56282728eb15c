"""Tools as a registry (rtpo.llm.tools.base has the classes; docs in its docstring).

Importing the package registers the built-in tools.
"""

from rtpo.llm.tools import python as _python  # noqa: F401 - registers the python tool
from rtpo.llm.tools import search as _search  # noqa: F401 - registers the search tool
from rtpo.llm.tools.base import TOOLS, Tool, ToolResult, ToolSet, make_tool, make_toolset
from rtpo.llm.tools.function import FunctionTool, function_schema, register_function
from rtpo.llm.tools.mcp import McpServerConfig, McpTool  # registers the mcp entry (stdio servers)

__all__ = [
    "TOOLS",
    "FunctionTool",
    "McpServerConfig",
    "McpTool",
    "Tool",
    "ToolResult",
    "ToolSet",
    "function_schema",
    "make_tool",
    "make_toolset",
    "register_function",
]
