"""The tabular backend: finite turn-boundary MDPs, exact solvers, tabular policies, protocol bindings.

Owns the tabular task kinds (tasks, generators), the exact solver (solve: V*, backward induction) and
the tabular Environment/Sampler/Learner/evaluator the runner builds through the backend registry.  May
import rtpo.core and the floor below the backends (rtpo.scenario.schema, backends, plugins); never
rtpo.llm or rtpo.distributed (rtpo.worlds wires tabular tasks into the llm backend), the runner or a
command.  One module sits a floor higher: gym_env, a Gymnasium env that loads a scenario file.
"""

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
