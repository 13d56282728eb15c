"""The backend-agnostic algorithm core: types, protocols, rollout driver, estimators, the loss, methods,
and what every backend measures with: sampled evaluation (sampled_eval: Pass@k, rewards, turns), the
metrics record's keys (metrics) and torch's thread count for a block of work (threads).

Imports numpy and torch only; never a backend (rtpo.tabular, rtpo.llm, vllm, ray, transformers) nor any
other part of rtpo (the bottom floor, tests/test_architecture.py's FLOORS).
"""

from rtpo.core import estimators, methods
from rtpo.core.budget import Budget
from rtpo.core.loss import FlatBatch, LossConfig, clipped_policy_loss
from rtpo.core.methods import IterationState, Method, RunContext
from rtpo.core.protocols import Environment, Learner, Sampler
from rtpo.core.rollout import RolloutResult, rollout
from rtpo.core.train import ppo_update, rollout_train_ratio, turn_rows
from rtpo.core.types import (
    Boundary,
    Generation,
    Ragged,
    ReverseTree,
    StepOutcome,
    Trajectory,
    TurnBatch,
    discounted_return,
)

__all__ = [
    "Boundary",
    "Budget",
    "Environment",
    "FlatBatch",
    "Generation",
    "IterationState",
    "Learner",
    "LossConfig",
    "Method",
    "Ragged",
    "ReverseTree",
    "RolloutResult",
    "RunContext",
    "Sampler",
    "StepOutcome",
    "Trajectory",
    "TurnBatch",
    "clipped_policy_loss",
    "discounted_return",
    "estimators",
    "methods",
    "ppo_update",
    "rollout",
    "rollout_train_ratio",
    "turn_rows",
]
