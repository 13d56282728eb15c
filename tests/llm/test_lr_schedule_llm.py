"""The FSDP learner's learning-rate schedule: one schedule step per optimiser step, and a learner loaded
from a sharded (DCP) checkpoint continues the schedule exactly.  The scenario's train.* schedule reaches
the LearnerConfig both the driver's learner and every Ray trainer rank are built from (learner_config).

Mutant: dropping `restore_lr` from FSDPLearner._do_load_sharded turns test_sharded_resume_continues_schedule
red (the resumed learner starts over at the warm-up's first rate).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_learner import CFG, assert_weights_close, make_batch

from rtpo.core.loss import LossConfig
from rtpo.core.schedule import LRSchedule
from rtpo.llm.learner import FSDPLearner, LearnerConfig
from rtpo.scenario.load import load_scenario

SCHED = LRSchedule("linear", warmup_steps=2, decay_steps=3, min_lr_ratio=0.25)


def test_sharded_resume_continues_schedule(tiny_model_dir, tmp_path):
    cfg = LearnerConfig(**{**CFG.__dict__, "lr_schedule": SCHED})
    batches = [make_batch(tiny_model_dir, 20 + i) for i in range(4)]
    full = FSDPLearner(tiny_model_dir, cfg)
    lrs = [full.train_step(b, LossConfig())["train/lr"] for b in batches]
    np.testing.assert_allclose(lrs, [CFG.lr * SCHED(i) for i in range(4)], rtol=1e-12, err_msg="schedule not followed")
    a = FSDPLearner(tiny_model_dir, cfg)
    for b in batches[:2]:
        a.train_step(b, LossConfig())
    info = a.save_sharded(tmp_path / "learner-0")
    resumed = FSDPLearner(tiny_model_dir, cfg)
    resumed.load_state_dict({"format": "torch-dcp", "path": info["dir"], "steps": info["steps"], "tied": info["tied"]})
    rest = [resumed.train_step(b, LossConfig())["train/lr"] for b in batches[2:]]
    assert rest == lrs[2:], f"resumed rates {rest} differ from the uninterrupted {lrs[2:]}"
    assert_weights_close(resumed.weights(), full.weights(), atol=0)


def test_scenario_schedule_reaches_learner_config():
    from rtpo.llm.build import learner_config

    cfg = load_scenario(
        str(Path(__file__).resolve().parents[2] / "scenarios/llm/tiny-cpu.yaml"),
        ["train.lr_schedule=cosine", "train.warmup_steps=3", "train.decay_steps=10", "train.min_lr_ratio=0.1"],
    )
    assert learner_config(cfg).lr_schedule == LRSchedule("cosine", 3, 10, 0.1)
    assert learner_config(cfg).lr == pytest.approx(cfg.train.lr)
