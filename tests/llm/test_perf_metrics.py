"""The learner's throughput and memory metrics: model FLOPs of a step against the formula by hand, achieved
FLOP/s and MFU against a configured peak, peak RSS of the process; all declared machine measurements
(rtpo.core.metrics.wall_clock), so resumed runs still compare exactly.

Mutants: dropping the attention term of train_flops, or counting the tied embedding as body parameters,
turns test_train_step_reports_flops_mfu_and_memory red.
"""

from __future__ import annotations

import pytest
from test_learner import CFG, make_batch

from rtpo.core.loss import LossConfig
from rtpo.core.metrics import wall_clock
from rtpo.llm.learner import FSDPLearner, LearnerConfig


def test_train_step_reports_flops_mfu_and_memory(tiny_model_dir):
    learner = FSDPLearner(tiny_model_dir, LearnerConfig(**{**CFG.__dict__, "peak_flops": 1e12}))
    batch = make_batch(tiny_model_dir, 3)
    m = learner.train_step(batch, LossConfig())
    c = learner.model.config
    n = sum(p.numel() for p in learner.model.parameters())
    d, v, L, H = c.hidden_size, c.vocab_size, c.num_hidden_layers, c.num_attention_heads
    hd = getattr(c, "head_dim", None) or d // H
    assert c.tie_word_embeddings
    hand = 0.0
    for ctx, rsp in zip(batch.contexts.lengths.tolist(), batch.tokens.lengths.tolist()):
        s = ctx + rsp
        hand += 3 * (2 * (n - d * v) * s + 2 * d * v * (rsp + 1) + 2 * L * H * hd * s * s)
    assert m["perf/learner_flops"] == pytest.approx(hand, rel=1e-12), "step FLOPs differ from the formula by hand"
    assert m["perf/learner_flops_per_s"] > 0
    assert m["perf/learner_mfu"] == pytest.approx(m["perf/learner_flops_per_s"] / 1e12, rel=1e-12)
    assert m["memory/learner_peak_rss_mb"] > 50, "a process holding torch and a model uses more than 50 MB"
    assert "memory/learner_peak_accel_mb" not in m  # CPU: no accelerator
    for key in ("perf/learner_flops", "perf/learner_flops_per_s", "perf/learner_mfu", "memory/learner_peak_rss_mb"):
        assert wall_clock(key), f"{key} measures the machine: resumed-run comparisons must drop it"
    no_peak = FSDPLearner(tiny_model_dir, CFG).train_step(batch, LossConfig())
    assert "perf/learner_mfu" not in no_peak and no_peak["perf/learner_flops"] == m["perf/learner_flops"]
