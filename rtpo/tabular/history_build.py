"""The `tabular_history` backend: the tabular backend with full-history contexts exposed beside ψ.

Same task section as `tabular` (rtpo.tabular.build), but the environment is a FullHistoryEnv and the
policy the log-linear one of rtpo.tabular.history, whose rollout (ψ) and full-history views share θ.
Flat baselines with train_context auto/full_history then train on full histories while rolling out
under ψ (the Eq. 2/10 mismatch); RTPO keeps training on the recorded c_k.  `task.policy` is ignored
(the policy is always the shared-θ log-linear one).  Importing this module registers the backend.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rtpo.scenario.backends import BackendSpec, BuiltBackend, register_backend
from rtpo.scenario.schema import BackendConfig, ScenarioConfig
from rtpo.tabular.build import (
    ROLLOUT_PATH,
    assemble,
    build_mdp,
    memory_estimate,
    parse_task,
    solve_text,
    task_schemas,
    variance_lines,
)
from rtpo.tabular.history import FullHistoryEnv, history_policy


class TabularHistoryBackendConfig(BackendConfig):
    kind: Literal["tabular_history"] = Field(description="tabular MDPs with full-history contexts beside ψ")
    rollout_path: Literal["columnar", "per_episode"] = ROLLOUT_PATH


def build(cfg: ScenarioConfig) -> BuiltBackend:
    mdp = build_mdp(cfg.task)
    return assemble(cfg, mdp, history_policy(mdp, init_scale=cfg.task.init_scale), FullHistoryEnv(mdp))


register_backend(
    "tabular_history",
    BackendSpec(
        config=TabularHistoryBackendConfig,
        parse_task=parse_task,
        build=build,
        solve=solve_text,
        memory=memory_estimate,
        task_schemas=task_schemas,
        diagnostic=variance_lines,
    ),
)
