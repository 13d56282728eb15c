"""Task sets for the LLM environments (math benchmarks from local files, generated arithmetic)."""

from rtpo.llm.tasks.math import LAYOUTS, MathDataError, MathItem, MathTask, arithmetic_task, load_math

__all__ = ["LAYOUTS", "MathDataError", "MathItem", "MathTask", "arithmetic_task", "load_math"]
