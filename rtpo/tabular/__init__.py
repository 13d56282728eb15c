"""The tabular backend: finite turn-boundary MDPs, exact solvers, tabular policies, protocol bindings."""

from rtpo.tabular.backend import TabularEnv, TabularEpisodes, TabularEvaluator, TabularLearner, TabularSampler
from rtpo.tabular.generators import last_feedback_psi, modulo_psi, random_mdp, tool_chain
from rtpo.tabular.mdp import TurnMDP
from rtpo.tabular.policy import LogLinear, SoftmaxTable, TabularPolicy, one_hot_features
from rtpo.tabular.solve import (
    Evaluation,
    Solution,
    backup,
    evaluate,
    policy_value,
    solve,
    state_distribution,
    uniform_policy,
)

__all__ = [
    "Evaluation",
    "LogLinear",
    "Solution",
    "SoftmaxTable",
    "TabularEnv",
    "TabularEpisodes",
    "TabularEvaluator",
    "TabularLearner",
    "TabularPolicy",
    "TabularSampler",
    "TurnMDP",
    "backup",
    "evaluate",
    "last_feedback_psi",
    "modulo_psi",
    "one_hot_features",
    "policy_value",
    "random_mdp",
    "solve",
    "state_distribution",
    "tool_chain",
    "uniform_policy",
]
