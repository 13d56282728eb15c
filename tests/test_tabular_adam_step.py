"""The tabular learner's direct Adam step (issue 31: the per-phase fixed cost) is torch.optim.Adam.step:
after the same RTPO iterations the parameters, the optimiser state and the learning rate are the same
bits as a learner that calls Adam.step and steps its scheduler, with a constant rate and with a warm-up
schedule.  Mutant: pass beta1 for beta2 in `TabularLearner._adam_step` (or skip `sched.step()` for a
warm-up schedule) and the comparison fails."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rtpo.core import RunContext, methods
from rtpo.core.schedule import LRSchedule
from rtpo.tabular import SoftmaxTable, TabularEnv, TabularLearner, TabularSampler, tool_chain


def _run(direct: bool, schedule: LRSchedule, method: str = "rtpo"):
    mdp = tool_chain(num_turns=3, num_actions=4, p_advance=0.8, seed=0)
    policy = SoftmaxTable(mdp.num_turns, mdp.num_contexts, mdp.num_actions, init_scale=0.5)
    rng = np.random.default_rng(0)
    params = policy.init_params(rng)
    learner = TabularLearner(policy, params, lr=0.3, lr_schedule=schedule)
    if not direct:  # the plain torch path: Adam.step, then the scheduler's step
        learner._adam = learner._constant_lr = False
    ctx = RunContext(TabularEnv(mdp), TabularSampler(policy, params), learner, rng)
    cls = methods.get(method)
    m = cls(cls.Config(G=4, epochs=2))
    for _ in range(3):
        state = m.begin(ctx, np.arange(8))
        while state.pending:
            m.phase(ctx, state)
    return learner


@pytest.mark.parametrize("method", ["rtpo", "grpo"])
@pytest.mark.parametrize(
    "schedule", [LRSchedule(), LRSchedule(kind="cosine", warmup_steps=3, decay_steps=10)], ids=["constant", "cosine"]
)
def test_direct_adam_step_is_adam_step(schedule, method):
    fast, plain = _run(True, schedule, method), _run(False, schedule, method)
    assert fast._adam, "the direct step is taken on this torch"
    assert np.array_equal(fast.weights(), plain.weights()), "parameters differ from Adam.step's"
    a, b = fast.opt.state_dict(), plain.opt.state_dict()
    assert a["state"].keys() == b["state"].keys()
    for k in a["state"]:
        for name, x in a["state"][k].items():
            assert torch.equal(x, b["state"][k][name]), f"optimiser state {k}/{name} differs"
    assert fast.opt.param_groups[0]["lr"] == plain.opt.param_groups[0]["lr"], "the schedule's rate differs"
    assert fast.sched.last_epoch == plain.sched.last_epoch == fast.steps
