"""The LLM backend: Qwen3 chat contexts, sandboxed tools, math tasks and rewards, engines and learner.

Nothing heavy is imported here; import the submodules (rtpo.llm.chat, rtpo.llm.env, ...) directly.
"""
