"""The LLM backend: Qwen3 contexts, engines (vLLM, HF), the FSDP2 learner, tools and math tasks."""
