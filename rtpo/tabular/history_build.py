"""The `tabular_history` backend: the tabular backend with full-history contexts exposed beside ψ.

Same task section as `tabular` (rtpo.tabular.build), but the environment is a FullHistoryEnv and the
policy the log-linear one of rtpo.tabular.history, whose rollout (ψ) and full-history views share θ.
Flat baselines with train_context auto/full_history then train on full histories while rolling out
under ψ (the Eq. 2/10 mismatch); RTPO keeps training on the recorded c_k.  `task.policy` is ignored
(the policy is always the shared-θ log-linear one).  Importing this module registers the backend.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from rtpo.backends import BackendSpec, BuiltBackend, register_backend
from rtpo.config import BackendConfig, ScenarioConfig
from rtpo.core.methods import RunContext
from rtpo.tabular.backend import TabularEvaluator, TabularLearner, TabularSampler
from rtpo.tabular.build import build_mdp, parse_task, solve_text
from rtpo.tabular.history import FullHistoryEnv, history_policy


class TabularHistoryBackendConfig(BackendConfig):
    kind: Literal["tabular_history"] = Field(description="tabular MDPs with full-history contexts beside ψ")


class _Sampler(TabularSampler):
    def load_weights(self, weights: np.ndarray) -> None:
        super().load_weights(weights)
        self.current = np.array(weights, dtype=np.float64, copy=True)


def build(cfg: ScenarioConfig) -> BuiltBackend:
    mdp = build_mdp(cfg.task)
    policy = history_policy(mdp, init_scale=cfg.task.init_scale)
    rng = np.random.default_rng(cfg.seed)
    params = policy.init_params(rng)
    learner = TabularLearner(policy, params, lr=cfg.train.lr, optimizer=cfg.train.optimizer)
    sampler = _Sampler(policy, params)
    ctx = RunContext(env=FullHistoryEnv(mdp), sampler=sampler, learner=learner, rng=rng)
    evaluator = TabularEvaluator(mdp, policy)
    return BuiltBackend(
        ctx=ctx, evaluate=lambda: evaluator(learner), sampler_state=lambda: sampler.current.copy(),
        load_sampler_state=sampler.load_weights, num_queries=None, value_key="eval/value",
        optimum_key="eval/v_star", reference_keys=("eval/v_star_psi",),
    )


register_backend("tabular_history", BackendSpec(config=TabularHistoryBackendConfig, parse_task=parse_task,
                                                build=build, solve=solve_text))
