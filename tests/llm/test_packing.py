"""Padding-free learner passes (LearnerConfig.packing): a micro-batch's rows packed into one sequence give
the padded path's log-probs, entropies and update, and the plan's padding share is what they save.

The two-rank FSDP2 learner with packing against one padded process is in test_learner_dist.py (slow).

Mutants: position ids that run on across the packed rows instead of restarting at 0 per row (transformers
then sees one sequence: each row attends to the rows before it, at shifted rotary phases), or a logit
index off by one (start + c instead of start + c − 1), turn test_packed_logprobs_equal_padded red.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_learner import CFG, assert_weights_close, make_batch

from rtpo.core.loss import LossConfig
from rtpo.core.metrics import wall_clock
from rtpo.llm.learner import FSDPLearner, LearnerConfig, forward_tokens, plan_micro_batches

CONTEXTS = (20, 4, 9, 33, 1)
RESPONSES = (6, 3, 8, 5, 2)


def _cfg(packing: bool, micro: int, **kw) -> LearnerConfig:
    return LearnerConfig(**{**CFG.__dict__, "packing": packing, "micro_batch_tokens": micro, **kw})


@pytest.mark.parametrize("micro", [1, 30, 10_000])  # a row per pass, a few rows, everything in one pass
def test_packed_logprobs_equal_padded(tiny_model_dir, micro):
    """Log-probs of packed and padded passes agree to 1e-6 (float32's resolution; and the entropies):
    the packed row's block-diagonal mask and restarted positions are each row's own forward pass."""
    batch = make_batch(tiny_model_dir, 0, CONTEXTS, RESPONSES)
    padded, packed = FSDPLearner(tiny_model_dir, _cfg(False, micro)), FSDPLearner(tiny_model_dir, _cfg(True, micro))
    want, got = padded.logprobs(batch), packed.logprobs(batch)
    np.testing.assert_array_equal(got.offsets, want.offsets)
    # 1e-6, absolute or relative: float32 log-probs near −12 are spaced 1e-6 apart, and the two passes
    # reduce in other orders (measured: 4.8e-6 at −11.8, 4e-7 relative)
    np.testing.assert_allclose(got.values, want.values, atol=1e-6, rtol=1e-6, err_msg="packed log-probs differ")
    rows = np.arange(len(batch))
    with torch.no_grad():
        ent = []
        for learner in (padded, packed):
            learner._token_logp(learner.model, batch, rows)
            ent.append(learner._entropy.double().numpy())
    # an entropy (~3 nats) is a float32 sum over the vocabulary: equal to its rounding (32 ulps, 4e-6 relative)
    np.testing.assert_allclose(ent[1], ent[0], rtol=4e-6, atol=0, err_msg="packed entropies differ")


@pytest.mark.parametrize(
    "loss", [LossConfig(kl_coef=0.1), LossConfig(aggregation="token-mean", entropy_coef=0.05)], ids=["kl", "entropy"]
)
def test_packed_train_step_equals_padded(tiny_model_dir, loss):
    """One AdamW step through packed passes gives the padded step's metrics and weights (micro-batches of
    a few rows, with the KL reference's passes packed too, or a differentiable entropy bonus)."""
    batch = make_batch(tiny_model_dir, 1, CONTEXTS, RESPONSES, seq_id=[0, 1, 1, 2, 3])
    out = []
    for packing in (False, True):
        learner = FSDPLearner(tiny_model_dir, _cfg(packing, 30, kl_reference=loss.kl_coef > 0))
        out.append((learner.train_step(batch, loss), learner.weights()))
    (m0, w0), (m1, w1) = out
    assert set(m0) == set(m1)
    for key in m0:
        if not wall_clock(key):
            assert m1[key] == pytest.approx(m0[key], rel=1e-5, abs=1e-6), f"{key}: packed step differs from padded"
    assert_weights_close(w1, w0, atol=1e-6)


def test_forward_tokens_count_the_padding(tiny_model_dir):
    """Padded passes compute rows × the longest row per micro-batch; packed passes the real tokens."""
    batch = make_batch(tiny_model_dir, 2, CONTEXTS, RESPONSES)
    lengths = np.asarray(CONTEXTS) + np.asarray(RESPONSES)  # 26, 7, 17, 38, 3
    one = plan_micro_batches(batch, 1, 10_000)
    assert forward_tokens(batch, one, packing=False) == (91, 5 * 38)
    assert forward_tokens(batch, one, packing=True) == (91, 91)
    per_row = plan_micro_batches(batch, 1, 1)
    assert forward_tokens(batch, per_row, packing=False) == (int(lengths.sum()), int(lengths.sum()))
