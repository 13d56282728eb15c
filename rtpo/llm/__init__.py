"""The LLM backend: Qwen3 chat contexts, sandboxed tools, math tasks and rewards, engines and learner.

Owns everything that touches a model, a tokenizer or model text (hf_folder writes a policy as a Hugging
Face folder; data_files reads local data sets).  May import rtpo.core, the floor below the backends
(rtpo.scenario.schema, backends, plugins; rtpo.rundir.checkpoint) and rtpo.distributed.tools (the Ray tool
pool, imported when a scenario asks for it); never rtpo.tabular (rtpo.worlds wires the two), the runner or
a command.  Nothing heavy is imported here; import the submodules (rtpo.llm.chat, rtpo.llm.env, ...)
directly.
"""
