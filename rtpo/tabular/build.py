"""The `tabular` backend for scenario files: task section, builder (MDP, policy, env, sampler, learner,
exact evaluator) and the exact solver behind `rtpo solve`.  Importing this module registers it."""

from __future__ import annotations

import contextlib
from dataclasses import asdict
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rtpo.core.methods import RunContext
from rtpo.core.sampled_eval import EvalSplit, SampledEval
from rtpo.scenario.backends import BackendSpec, BuiltBackend, register_backend, rollout_memory
from rtpo.scenario.schema import (
    BackendConfig,
    ConfigError,
    ScenarioConfig,
    pydantic_error,
    registered_name,
    validate_dataclass,
)
from rtpo.tabular.backend import TabularEnv, TabularEvaluator, TabularLearner, TabularSampler
from rtpo.tabular.diagnostic import decompose, decomposition_text
from rtpo.tabular.mdp import TurnMDP
from rtpo.tabular.policy import LogLinear, SoftmaxTable, TabularPolicy
from rtpo.tabular.solve import ENUMERATION_LIMIT, best_deterministic_psi_policy, solve, uniform_policy
from rtpo.tabular.tasks import TASKS, apply_psi, build_task, check_psi

ROLLOUT_PATH = Field(
    "columnar",
    description="how methods read rollouts: columnar (arrays end to end, vectorised returns and batches) | "
    "per_episode (one Trajectory object per episode, the older path); identical results",
)


class TabularBackendConfig(BackendConfig):
    kind: Literal["tabular"] = Field(description="exact finite turn-boundary MDPs")
    rollout_path: Literal["columnar", "per_episode"] = ROLLOUT_PATH


class TabularTaskConfig(BaseModel):
    """`task: {kind, psi, policy, init_scale, **fields of the kind's Params dataclass}`."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, arbitrary_types_allowed=True)
    kind: str = Field(description="registered tabular task: tool_chain | region_chain | random")
    psi: str = Field("identity", description="context map the policy sees: identity | last_feedback | modulo:<n>")
    policy: Literal["softmax", "loglinear", "shared"] = Field(
        "softmax",
        description="softmax table, log-linear (table + per-turn bias) or shared across turns "
        "(features of (context, turn) only: one-hot(c, u) + one-hot(k, u))",
    )
    init_scale: float = Field(0.0, ge=0, description="initial parameters ~ init_scale * N(0, 1)")
    params: Any = Field(description="the task kind's Params dataclass")

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "psi": self.psi,
            "policy": self.policy,
            "init_scale": self.init_scale,
            **asdict(self.params),
        }


_OWN = ("kind", "psi", "policy", "init_scale")


def parse_task(data: Any) -> TabularTaskConfig:
    kind = registered_name(data, "task", "kind", TASKS, "tabular task")
    if "psi" in data:
        try:
            check_psi(data["psi"])
        except ValueError as e:
            raise ConfigError(f"task.psi: {e}") from None
    params = validate_dataclass(TASKS.get(kind).Params, data, "task", reserved=_OWN)
    try:
        return TabularTaskConfig(params=params, **{k: data[k] for k in _OWN if k in data})
    except ValidationError as e:
        raise pydantic_error(e, "task") from None


def build_mdp(task: TabularTaskConfig) -> TurnMDP:
    """The task's MDP seen through the task's ψ."""
    return apply_psi(build_task(task.kind, task.params), task.psi)


def loglinear_features(num_turns: int, num_contexts: int, num_actions: int) -> np.ndarray:
    """φ(k, c, u) = [one-hot(k, c, u) | one-hot(k, u)]: a per-context table plus a per-turn action bias
    shared by all contexts, so aliased and distinct contexts share part of the parameters."""
    K, C, A = num_turns, num_contexts, num_actions
    table = np.eye(K * C * A).reshape(K, C, A, K * C * A)
    bias = np.broadcast_to(np.eye(K * A).reshape(K, 1, A, K * A), (K, C, A, K * A))
    return np.concatenate([table, bias], axis=-1)


def shared_features(num_turns: int, num_contexts: int, num_actions: int) -> np.ndarray:
    """φ(k, c, u) = [one-hot(c, u) | one-hot(k, u)]: no per-turn table — a context's action preference
    is shared by every turn, plus a per-turn action bias.  Unlike the per-turn table (the flat methods'
    best case: a flat rollout trains every turn's own row), a sample at one turn moves every turn."""
    K, C, A = num_turns, num_contexts, num_actions
    ctx = np.broadcast_to(np.eye(C * A).reshape(1, C, A, C * A), (K, C, A, C * A))
    bias = np.broadcast_to(np.eye(K * A).reshape(K, 1, A, K * A), (K, C, A, K * A))
    return np.concatenate([ctx, bias], axis=-1)


def make_policy(task: TabularTaskConfig, mdp: TurnMDP) -> TabularPolicy:
    if task.policy == "softmax":
        return SoftmaxTable(mdp.num_turns, mdp.num_contexts, mdp.num_actions, init_scale=task.init_scale)
    size = mdp.num_turns * mdp.num_contexts * mdp.num_actions
    if task.policy == "shared":
        if size > 1 << 16:
            raise ConfigError(f"task.policy: shared builds dense features; K*C*A = {size} > 65536")
        return LogLinear(shared_features(mdp.num_turns, mdp.num_contexts, mdp.num_actions), task.init_scale)
    if size > 4096:
        raise ConfigError(f"task.policy: loglinear builds dense features; K*C*A = {size} > 4096")
    return LogLinear(loglinear_features(mdp.num_turns, mdp.num_contexts, mdp.num_actions), task.init_scale)


def build(cfg: ScenarioConfig) -> BuiltBackend:
    mdp = build_mdp(cfg.task)
    return assemble(cfg, mdp, make_policy(cfg.task, mdp), TabularEnv(mdp))


def assemble(cfg: ScenarioConfig, mdp: TurnMDP, policy: TabularPolicy, env: Any) -> BuiltBackend:
    """The tabular RunContext (seeded policy init, learner, sampler) and its exact evaluator around an
    environment; backends that change only the environment or the policy (tabular_history) reuse it."""
    rng = np.random.default_rng(cfg.seed)
    params = policy.init_params(rng)
    learner = TabularLearner(
        policy, params, lr=cfg.train.lr, optimizer=cfg.train.optimizer, lr_schedule=cfg.train.lr_schedule_config()
    )
    sampler = TabularSampler(policy, params)
    columnar = getattr(cfg.backend, "rollout_path", "columnar") == "columnar"
    ctx = RunContext(env=env, sampler=sampler, learner=learner, rng=rng, columnar=columnar)
    evaluator = TabularEvaluator(mdp, policy)

    @contextlib.contextmanager
    def eval_policy():
        # a sampler of its own with the learner's weights: the training sampler (whose weights may lag
        # on purpose in off-policy methods) is never touched
        yield TabularSampler(policy, learner.weights())

    # a tabular episode draws its start state, so a "problem" is one draw and ids are not a fixed set;
    # the policy is sampled as it is (no temperature or nucleus), success = return > 0
    sampled = SampledEval(
        splits={"eval": EvalSplit(env, None), "train": EvalSplit(env, None)},
        policy=eval_policy,
        settings={"temperature": 1.0, "top_p": 1.0},
        default_problems=1024,
        exact=lambda: evaluator(learner),
    )
    return BuiltBackend(
        ctx=ctx,
        evaluate=lambda: evaluator(learner),
        sampler_state=sampler.current_weights,
        load_sampler_state=sampler.load_weights,
        num_queries=None,
        value_key="eval/value",
        optimum_key="eval/v_star",
        reference_keys=("eval/v_star_psi",),
        sampled_eval=sampled,
    )


def _compact_policy(policy: np.ndarray, psi: tuple[np.ndarray, ...], limit: int = 24) -> list[str]:
    """One line per turn: the greedy action of every context some state maps to (c:u pairs)."""
    lines = []
    for k, psi_k in enumerate(psi):
        seen = np.unique(psi_k)
        acts = policy[k, seen].argmax(axis=1)
        pairs = " ".join(f"{c}:{a}" for c, a in zip(seen[:limit], acts[:limit]))
        more = f" ... (+{seen.size - limit} contexts)" if seen.size > limit else ""
        lines.append(f"  k={k}: {pairs}{more}")
    return lines


def initial_policy(cfg: ScenarioConfig, mdp: TurnMDP) -> np.ndarray:
    """The run's θ0 as a (K, C, A) table: the task's policy initialised from the scenario seed, exactly as
    `assemble` draws it (tabular_history's shared-θ policy starts uniform at init_scale 0 too)."""
    policy = make_policy(cfg.task, mdp)
    return policy.table(policy.init_params(np.random.default_rng(cfg.seed)))


def diagnostic_group_size(cfg: ScenarioConfig) -> int:
    """RTPO's G for the information index: the scenario's own when it runs an RTPO variant, else 3 (the
    smallest informative group, T2d)."""
    G = getattr(cfg.method.config, "G", None)
    return int(G) if cfg.method.name.startswith("rtpo") and G else 3


def variance_lines(cfg: ScenarioConfig) -> list[str]:
    """The exact variance decomposition and information index of the scenario under its initial policy."""
    mdp = build_mdp(cfg.task)
    return decomposition_text(decompose(mdp, initial_policy(cfg, mdp)), diagnostic_group_size(cfg))


def solve_text(cfg: ScenarioConfig) -> str:
    """V*, the optimum under the scenario's ψ (states pooled by a uniform prefix policy, as RTPO's θ0
    trunks would at initialisation), the recursively optimal policy, compactly, and the variance
    decomposition of the return under the initial policy (rtpo.tabular.diagnostic)."""
    mdp = build_mdp(cfg.task)
    full = solve(mdp)
    proj = solve(mdp, mdp.psi, prefix_policy=uniform_policy(mdp))
    out = [
        f"scenario {cfg.name}: task {cfg.task.kind}, K={mdp.num_turns}, A={mdp.num_actions}, "
        f"states per turn {list(mdp.num_states) if mdp.num_turns <= 12 else sum(mdp.num_states)}, psi {cfg.task.psi}",
        f"V* = {full.value:.12g}",
        "V*_psi (recursive optimum under psi: backward induction in which each context takes the action "
        "maximising Q~ averaged over the states it pools, weighted by their reach probability under a uniform "
        f"prefix policy, as RTPO's theta0 trunks at initialisation) = {proj.value:.12g}",
        "recursively optimal policy (context:action, identity psi):",
        *_compact_policy(full.policy, full.psi),
    ]
    if cfg.task.psi != "identity":
        out += ["recursively optimal psi-policy (context:action):", *_compact_policy(proj.policy, proj.psi)]
        best = best_deterministic_psi_policy(mdp)
        if best is None:
            out.append(
                f"best deterministic psi-policy: not enumerated (more than {ENUMERATION_LIMIT} policies); "
                "V*_psi above is a lower bound on it"
            )
        else:
            out += [
                f"best deterministic psi-policy (exhaustive over {best.count} policies) = {best.value:.12g} "
                "(a stochastic psi-policy can do better under aliasing)",
                *_compact_policy(best.policy, mdp.psi),
            ]
    out += decomposition_text(decompose(mdp, initial_policy(cfg, mdp)), diagnostic_group_size(cfg))
    return "\n".join(out)


# Bytes per unit, generous on purpose (a refusal must never be wrong by much the other way): a sparse
# MDP entry is a successor id and a probability plus the solver's temporaries; a policy cell holds the
# parameter, its gradient and Adam's two moments; a sampled turn is a few Python objects and arrays.
_BYTES_PER_MDP_ENTRY = 64
_BYTES_PER_POLICY_CELL = 4 * 8
_BYTES_PER_SAMPLED_TURN = 2048


def memory_estimate(cfg) -> list[tuple[str, int]]:
    """What building the MDP, the policy and one iteration's rollouts would allocate, by the key driving it."""
    K, S, A, B = TASKS.get(cfg.task.kind).shape(cfg.task.params)
    dims = {"num_turns": K, "num_states": S, "num_actions": A}
    size_key = "task." + max((n for n in dims if hasattr(cfg.task.params, n)), key=dims.get)
    return [
        (size_key, K * S * A * B * _BYTES_PER_MDP_ENTRY),
        (size_key, K * S * A * _BYTES_PER_POLICY_CELL),
        rollout_memory(cfg, K, _BYTES_PER_SAMPLED_TURN),
    ]


def task_schemas() -> list[dict]:
    """One JSON Schema per tabular task kind: the section's own keys plus the kind's Params fields."""
    from pydantic import TypeAdapter

    own = TabularTaskConfig.model_json_schema()["properties"]
    own.pop("params", None)
    out = []
    for kind in TASKS.names():
        p = TypeAdapter(TASKS.get(kind).Params).json_schema()
        p["properties"] = {**own, **p.get("properties", {}), "kind": {"const": kind}}
        p["additionalProperties"] = False
        p.pop("required", None)
        out.append(p)
    return out


register_backend(
    "tabular",
    BackendSpec(
        config=TabularBackendConfig,
        parse_task=parse_task,
        build=build,
        solve=solve_text,
        memory=memory_estimate,
        task_schemas=task_schemas,
        diagnostic=variance_lines,
    ),
)
