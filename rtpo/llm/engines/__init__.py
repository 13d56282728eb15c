"""Samplers for the LLM backend: vLLM (`VLLMEngine`) and the transformers reference (`HFEngine`).

Both implement rtpo.core.protocols.Sampler with one contract (engines/base.py).  The modules are
imported lazily so that `import rtpo.llm.engines` needs neither vLLM nor transformers.
"""

from rtpo.llm.engines.base import SamplingConfig

__all__ = ["SamplingConfig", "HFEngine", "VLLMEngine"]


def __getattr__(name: str):
    if name == "HFEngine":
        from rtpo.llm.engines.hf import HFEngine

        return HFEngine
    if name == "VLLMEngine":
        from rtpo.llm.engines.vllm import VLLMEngine

        return VLLMEngine
    raise AttributeError(name)
