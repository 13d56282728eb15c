"""KL in the reward on the llm backend: the FSDP learner's reference log-probs (ReferenceLogprobs), and a
tiny `rtpo run` with method.kl_placement=reward (and padding-free learner passes, backend.packing).

Mutant: ref_logprobs answering with the trained model's log-probs instead of the reference's turns
test_ref_logprobs_are_the_initial_policys red (they move with the step).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_learner import CFG, make_batch

from rtpo.core.loss import LossConfig
from rtpo.core.protocols import ReferenceLogprobs
from rtpo.llm.learner import FSDPLearner, LearnerConfig

ROOT = Path(__file__).resolve().parents[2]


def test_ref_logprobs_are_the_initial_policys(tiny_model_dir):
    """Before a step the reference's log-probs are the policy's; after one they stay the initial model's."""
    learner = FSDPLearner(tiny_model_dir, LearnerConfig(**{**CFG.__dict__, "kl_reference": True}))
    assert isinstance(learner, ReferenceLogprobs)
    batch = make_batch(tiny_model_dir, 4)
    before = learner.logprobs(batch)
    np.testing.assert_allclose(learner.ref_logprobs(batch).values, before.values, atol=1e-6, rtol=0)
    learner.train_step(batch, LossConfig())
    after = learner.logprobs(batch)
    assert np.abs(after.values - before.values).max() > 1e-3, "lr 1e-2 moves the policy"
    np.testing.assert_allclose(
        learner.ref_logprobs(batch).values, before.values, atol=1e-6, rtol=0, err_msg="the reference moved"
    )
    with pytest.raises(ValueError, match="kl_reference=True"):
        FSDPLearner(tiny_model_dir, CFG).ref_logprobs(batch)


@pytest.mark.slow  # a whole run (HF engine, FSDP learner) in a subprocess: ~1-2 min on 2 loaded cores
def test_tiny_run_with_kl_in_the_reward(tmp_path):
    """`rtpo run tiny-cpu` with the KL penalty in the reward (β = 1, k1) and packed learner passes: the loss
    carries no KL term, the first phase's returns are 0 (θ = θ_ref: the random model's raw reward is 0 and
    its KL is 0 within engine numerics; measured 6e-7), every later phase's are not (each update at lr 1e-2
    moves θ off the reference; measured −0.03 at the second), and the learner's packed log-probs still match
    the engine's (rollout/train ratio 1)."""
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        "-m",
        "rtpo",
        "run",
        str(ROOT / "scenarios/llm/tiny-cpu.yaml"),
        "budget.iterations=2",
        "task.num_turns=2",
        "backend.max_tokens=8",
        "backend.engine=hf",
        "backend.packing=true",
        "method.kl_coef=1.0",
        "method.kl_placement=reward",
        "method.kl_estimator=k1",
        "train.lr=0.01",
        "task.eval_queries=2",
        f"backend.model_cache={tmp_path / 'models'}",
        "--out",
        str(tmp_path / "runs"),
        "--no-progress",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = next((tmp_path / "runs").iterdir())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4, "2 iterations of K = 2 phases"
    for r in rows:
        assert "loss/kl_ref" not in r, "kl_placement reward: the loss has no KL term"
        assert abs(r["consistency/rollout_train_ratio"] - 1.0) < 1e-4, "packed log-probs must match the engine's"
    returns = [r["return/mean"] for r in rows]
    assert abs(returns[0]) < 1e-3, f"θ = θ_ref: no penalty in the first phase ({returns})"
    assert min(abs(x) for x in returns[1:]) > 1e-3, f"θ moved: the penalty shapes the later phases' returns ({returns})"
