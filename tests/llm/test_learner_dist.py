"""Two gloo ranks of the FSDP2 learner give the same log-probs and the same update as one process.

The driver (rank 0) runs in a spawned process, because this pytest process may already hold a
one-rank process group from the other learner tests; it starts rank 1 itself via launch_learner.
"""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest
import torch
from test_learner import CFG, assert_weights_close, make_batch

from rtpo.core.loss import LossConfig
from rtpo.core.metrics import wall_clock
from rtpo.llm.learner import FSDPLearner, LearnerConfig, launch_learner

# Uneven sequences (one of two rows) so the ranks get different numbers of sequences and tokens, and
# small micro-batches so rank 0 and rank 1 need different numbers of passes (dummy passes align them).
CONTEXTS = (20, 4, 9, 33, 12)
RESPONSES = (6, 3, 8, 5, 7)
SEQ_ID = [0, 1, 1, 2, 3]
LOSSES = (LossConfig(kl_coef=0.1), LossConfig(aggregation="token-mean", ratio="sequence"))


def _steps(learner: FSDPLearner, model_dir) -> dict:
    out = {"logp": learner.logprobs(make_batch(model_dir, 0, CONTEXTS, RESPONSES, SEQ_ID)).values, "metrics": []}
    for i, loss in enumerate(LOSSES):
        out["metrics"].append(learner.train_step(make_batch(model_dir, 10 + i, CONTEXTS, RESPONSES, SEQ_ID), loss))
    out["weights"] = learner.weights()
    return out


def _driver(model_dir, cfg: LearnerConfig, out_path: str) -> None:
    import torch.distributed as dist

    learner = launch_learner(model_dir, cfg, world_size=2, threads_per_rank=1)
    try:
        torch.save(_steps(learner, model_dir), out_path)
    finally:
        learner.close()
        dist.destroy_process_group()


@pytest.mark.slow  # two FSDP processes: 18 s
@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
def test_two_gloo_ranks_equal_one_process(tiny_model_dir, tmp_path, packing):
    """packed: the two ranks run padding-free passes (LearnerConfig.packing) and still equal one padded
    process (mutant: position ids not restarted per packed row turns it red)."""
    cfg = LearnerConfig(**{**CFG.__dict__, "kl_reference": True, "micro_batch_tokens": 24})
    out_path = str(tmp_path / "two_ranks.pt")
    two_cfg = LearnerConfig(**{**cfg.__dict__, "packing": packing})
    proc = mp.get_context("spawn").Process(target=_driver, args=(str(tiny_model_dir), two_cfg, out_path))
    proc.start()
    proc.join(timeout=600)
    assert proc.exitcode == 0, f"two-rank driver exited with {proc.exitcode}"
    two = torch.load(out_path, weights_only=False)
    one = _steps(FSDPLearner(tiny_model_dir, cfg), tiny_model_dir)
    np.testing.assert_allclose(two["logp"], one["logp"], atol=1e-5, rtol=0)
    for m2, m1 in zip(two["metrics"], one["metrics"]):
        assert set(m2) == set(m1)
        for key in m1:
            if wall_clock(key):  # the machine's own measurements (FLOP/s, RSS) differ from run to run
                continue
            assert abs(m2[key] - m1[key]) <= 1e-4 * max(1.0, abs(m1[key])), key
    assert_weights_close(two["weights"], one["weights"], atol=5e-6)
