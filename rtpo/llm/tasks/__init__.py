"""Task sets for the LLM environments (math benchmarks from local files, generated arithmetic)."""

from rtpo.llm.tasks.math import (
    LAYOUTS,
    TASK_BUILDERS,
    MathDataError,
    MathItem,
    MathTask,
    arithmetic_task,
    build_task,
    load_math,
)

__all__ = [
    "LAYOUTS",
    "TASK_BUILDERS",
    "MathDataError",
    "MathItem",
    "MathTask",
    "arithmetic_task",
    "build_task",
    "load_math",
]
