"""vLLM starts in a process that imported numba/llvmlite first (bm25s, or any library, may do so):
vLLM's CPU platform walks sys.modules at engine start and used to fail on llvmlite's FFI wrappers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from llm_test_constants import vllm_missing

pytest.importorskip("numba", reason="numba is not installed (nothing to guard against)")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # starts vLLM in a subprocess: 23 s
@pytest.mark.skipif(vllm_missing, reason="vllm is not installed")
def test_engine_starts_after_numba_was_imported(tmp_path):
    code = textwrap.dedent(
        f"""
        import numba, sys
        from rtpo.llm.model import build_tiny_qwen3
        from rtpo.llm.engines import SamplingConfig
        from rtpo.llm.engines.vllm import VLLMEngine
        d = build_tiny_qwen3({str(tmp_path / "m")!r}, seed=0, init_std=0.2)
        VLLMEngine(d, SamplingConfig(max_tokens=4), kv_cache_gb=0.2, max_model_len=256)
        assert "numba" in sys.modules  # put back after the engine started
        print("ENGINE-OK")
        """
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), VLLM_ENABLE_V1_MULTIPROCESSING="0")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert "ENGINE-OK" in r.stdout, r.stderr[-2000:]
