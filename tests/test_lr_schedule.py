"""Learning-rate schedules (rtpo.core.schedule): the factor against hand values and torch's own schedulers,
the learners stepping it once per optimiser step, and a resumed run continuing it exactly.

Mutants that turn these red: dropping `restore_lr` from TabularLearner.load_state_dict (the resumed run
restarts the schedule at step 0: test_run_resume_with_schedule_is_exact and
test_tabular_learner_resumes_schedule fail); `(step + 1) / w` → `step / w` (hand values fail);
stepping the scheduler twice per optimiser step (test_tabular_learner_steps_schedule_once fails).
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch

from rtpo.core.metrics import reproducible
from rtpo.core.schedule import LRSchedule, make_lr_scheduler
from rtpo.rundir.runner import run_scenario
from rtpo.scenario.load import ConfigError, load_scenario


def test_factor_hand_values():
    s = LRSchedule("cosine", warmup_steps=4, decay_steps=10, min_lr_ratio=0.1)
    assert [s(i) for i in range(4)] == [0.25, 0.5, 0.75, 1.0], "warm-up: (s+1)/W"
    assert s(4) == pytest.approx(1.0), "cosine starts at 1 after the warm-up"
    assert s(9) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5))), "half-way: (1+m)/2"
    assert s(14) == pytest.approx(0.1) and s(100) == pytest.approx(0.1), "held at m after decay_steps"
    lin = LRSchedule("linear", warmup_steps=0, decay_steps=4, min_lr_ratio=0.0)
    assert [lin(i) for i in range(6)] == [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
    assert [LRSchedule("constant", warmup_steps=2)(i) for i in range(4)] == [0.5, 1.0, 1.0, 1.0]


def _lrs(sched_factory, steps: int, lr: float = 0.3) -> list[float]:
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=lr)
    sch = sched_factory(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sch.step()
    return out


@pytest.mark.parametrize("m", [0.0, 0.2])
def test_decays_match_torch_builtin_schedulers(m):
    """Independent reference: torch's CosineAnnealingLR and LinearLR give the same rates step by step."""
    D = 7
    ours = _lrs(lambda o: make_lr_scheduler(o, LRSchedule("cosine", decay_steps=D, min_lr_ratio=m)), D + 1)
    ref = _lrs(lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=D, eta_min=0.3 * m), D + 1)
    np.testing.assert_allclose(ours, ref, rtol=1e-12, err_msg="cosine decay differs from CosineAnnealingLR")
    ours = _lrs(lambda o: make_lr_scheduler(o, LRSchedule("linear", decay_steps=D, min_lr_ratio=m)), D + 3)
    ref = _lrs(lambda o: torch.optim.lr_scheduler.LinearLR(o, 1.0, max(m, 1e-300), total_iters=D), D + 3)
    np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-300, err_msg="linear decay differs from LinearLR")
    W = 5
    ours = _lrs(lambda o: make_lr_scheduler(o, LRSchedule("constant", warmup_steps=W)), W + 2)
    ref = _lrs(lambda o: torch.optim.lr_scheduler.LinearLR(o, 1 / W, 1.0, total_iters=W - 1), W + 2)
    np.testing.assert_allclose(ours, ref, rtol=1e-12, err_msg="warm-up differs from LinearLR(1/W -> 1)")


def test_bad_schedule_config_is_one_line_error():
    with pytest.raises(ConfigError, match=r"^train: .*decay_steps") as e:
        load_scenario(None, ["train.lr_schedule=cosine"])
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"train.min_lr_ratio"):
        load_scenario(None, ["train.min_lr_ratio=2"])
    with pytest.raises(ValueError, match="decay_steps"):
        LRSchedule("linear")


def _tabular_learner(schedule):
    from rtpo.tabular.backend import TabularLearner
    from rtpo.tabular.build import build_mdp, make_policy

    cfg = load_scenario(None, [])
    mdp = build_mdp(cfg.task)
    policy = make_policy(cfg.task, mdp)
    params = policy.init_params(np.random.default_rng(0))
    return TabularLearner(policy, params, lr=0.1, lr_schedule=schedule), mdp


def _batch(mdp, seed: int):
    from rtpo.core.types import Ragged, TurnBatch

    rng = np.random.default_rng(seed)
    n = 16
    ctx = rng.integers(0, mdp.num_contexts, n)
    return TurnBatch(
        contexts=Ragged.from_dense(np.stack([np.zeros(n, np.int64), ctx], 1)),
        tokens=Ragged.from_dense(rng.integers(0, mdp.num_actions, (n, 1))),
        old_logp=Ragged.from_dense(np.full((n, 1), -np.log(mdp.num_actions))),
        advantages=Ragged.from_dense(rng.normal(size=(n, 1))),
        seq_id=np.arange(n),
        weight=np.ones(n),
        turn=np.zeros(n, np.int64),
    )


SCHED = LRSchedule("cosine", warmup_steps=3, decay_steps=5, min_lr_ratio=0.1)


def test_tabular_learner_steps_schedule_once():
    from rtpo.core.loss import LossConfig

    learner, mdp = _tabular_learner(SCHED)
    lrs = [learner.train_step(_batch(mdp, i), LossConfig())["train/lr"] for i in range(10)]
    np.testing.assert_allclose(
        lrs, [0.1 * SCHED(i) for i in range(10)], rtol=1e-12, err_msg="one schedule step per opt step"
    )


@pytest.mark.parametrize("closed_form", [True, False])
def test_tabular_learner_resumes_schedule(closed_form):
    """k steps, state_dict through pickle into a fresh learner, the rest: the same rates and weights bit
    for bit as the uninterrupted learner."""
    from rtpo.core.loss import LossConfig

    loss = LossConfig()
    a, mdp = _tabular_learner(SCHED)
    a.closed_form = a.closed_form and closed_form
    full = [a.train_step(_batch(mdp, i), loss)["train/lr"] for i in range(9)]
    b, _ = _tabular_learner(SCHED)
    b.closed_form = a.closed_form
    part = [b.train_step(_batch(mdp, i), loss)["train/lr"] for i in range(4)]
    state = pickle.loads(pickle.dumps(b.state_dict()))
    c, _ = _tabular_learner(SCHED)
    c.closed_form = a.closed_form
    c.load_state_dict(state)
    part += [c.train_step(_batch(mdp, i), loss)["train/lr"] for i in range(4, 9)]
    assert part == full, "the resumed learner's learning rates differ from the uninterrupted one's"
    assert np.array_equal(c.weights(), a.weights()), "resumed weights differ"


def test_run_resume_with_schedule_is_exact(tmp_path, monkeypatch):
    """A run crashed mid-way and resumed gives the same metrics (train/lr included) as an uninterrupted one."""
    from rtpo.core.methods.rtpo import RTPO

    over = [
        "budget.iterations=3",
        "budget.queries_per_iteration=16",
        "logging.plot=false",
        "train.lr_schedule=cosine",
        "train.warmup_steps=2",
        "train.decay_steps=6",
    ]
    cfg = load_scenario(None, over)
    full = run_scenario(cfg, out_root=tmp_path / "a", progress=False)
    lrs = [m["train/lr"] for m in full.metrics]
    assert len(set(lrs)) > 3, f"the schedule should move the rate, got {lrs}"
    real = RTPO.phase
    calls = {"n": 0}

    def crashing(self, ctx, state):
        calls["n"] += 1
        if calls["n"] == 6:
            raise RuntimeError("simulated crash")
        return real(self, ctx, state)

    monkeypatch.setattr(RTPO, "phase", crashing)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_scenario(cfg, out_root=tmp_path / "b", progress=False)
    monkeypatch.setattr(RTPO, "phase", real)
    (run_dir,) = (tmp_path / "b").iterdir()
    resumed = run_scenario(None, resume=run_dir, progress=False)
    assert [reproducible(m) for m in resumed.metrics] == [reproducible(m) for m in full.metrics], (
        "resumed run's metrics (learning rates) differ"
    )
