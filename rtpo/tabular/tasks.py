"""Tabular task kinds for scenario files: name -> (parameter dataclass, MDP builder), plus the ψ parser.

A scenario's `task` section names a registered kind and gives that kind's parameters; the parameters
are a frozen dataclass, so the config loader validates them field by field without knowing the kind.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Generic, TypeVar

from rtpo.core.registry import Registry
from rtpo.tabular.generators import last_feedback_psi, modulo_psi, random_mdp, region_chain, tool_chain
from rtpo.tabular.mdp import TurnMDP

P = TypeVar("P")


@dataclass(frozen=True)
class TaskKind(Generic[P]):
    """Params: the parameter dataclass; build(params) -> TurnMDP with identity ψ.
    shape(params) -> (K, S, A, B): turns, states per turn, actions, successors per (s, a) — known before
    anything is allocated, so a scenario too large for the machine is refused at load time."""

    Params: type
    build: Callable[[P], TurnMDP]
    shape: Callable[[P], tuple[int, int, int, int]]


TASKS: Registry[TaskKind] = Registry("tabular task")


@dataclass(frozen=True)
class ToolChainParams:
    """The sparse-reward tool-use chain of rtpo.tabular.generators.tool_chain.

    num_turns:   K, turns per episode (the last one answers).
    num_actions: A, tools to choose from at each turn.
    p_advance:   chance that the right tool advances progress.
    seed:        which tool is right at each (turn, progress).
    sharpness:   answer reward = (progress / K) ** sharpness.
    gamma:       per-token-step discount.
    max_tau:     token durations τ are drawn from 1..max_tau.
    bernoulli:   reward ~ Bernoulli(mean) (true) or the mean paid exactly (false: a deterministic,
                 verifiable reward).
    early_answer: the last action answers at once at any turn, so episodes can end before K.
    """

    num_turns: int = 6
    num_actions: int = 4
    p_advance: float = 0.8
    seed: int = 0
    sharpness: float = 2.0
    gamma: float = 1.0
    max_tau: int = 1
    bernoulli: bool = True
    early_answer: bool = False

    def __post_init__(self) -> None:
        _check_chain(self)


def _check_chain(self) -> None:
    """Bounds shared by the chain families."""
    if not 1 <= self.num_turns <= 64:
        raise ValueError(f"num_turns must be in [1, 64], got {self.num_turns}")
    if self.num_actions < 2:
        raise ValueError(f"num_actions must be >= 2, got {self.num_actions}")
    if not 0.0 < self.p_advance <= 1.0:
        raise ValueError(f"p_advance must be in (0, 1], got {self.p_advance}")
    if not 0.0 < self.gamma <= 1.0:
        raise ValueError(f"gamma must be in (0, 1], got {self.gamma}")
    if self.max_tau < 1:
        raise ValueError(f"max_tau must be >= 1, got {self.max_tau}")
    if self.early_answer and self.num_actions < 3:
        raise ValueError(f"early_answer needs num_actions >= 3, got {self.num_actions}")


@dataclass(frozen=True)
class RegionChainParams:
    """The tool chain plus an exogenous region bit (rtpo.tabular.generators.region_chain).

    num_turns, num_actions, p_advance, seed, sharpness, gamma, max_tau, early_answer: as tool_chain.
    bernoulli: reward ~ Bernoulli(mean) (true) or the mean paid exactly (false, the default here).
    w:         share of the reward set by the region bit g drawn after turn 0, outside the agent's
               control: reward = (1 − w) · tool-chain reward + w · g.
    p_region:  P(g = 1).
    """

    num_turns: int = 6
    num_actions: int = 4
    p_advance: float = 0.8
    seed: int = 0
    sharpness: float = 2.0
    gamma: float = 1.0
    max_tau: int = 1
    bernoulli: bool = False
    early_answer: bool = False
    w: float = 0.8
    p_region: float = 0.5

    def __post_init__(self) -> None:
        _check_chain(self)
        if not 0.0 <= self.w <= 1.0:
            raise ValueError(f"w must be in [0, 1], got {self.w}")
        if not 0.0 < self.p_region < 1.0:
            raise ValueError(f"p_region must be in (0, 1), got {self.p_region}")


@dataclass(frozen=True)
class RandomParams:
    """A random MDP from rtpo.tabular.generators.random_mdp.

    seed:                 generator seed.
    num_turns:            K.
    num_states:           S states per turn.
    num_actions:          A.
    branching:            successors per (s, a); null = all S (dense).
    gamma:                per-token-step discount.
    max_tau:              token durations τ are drawn from 1..max_tau.
    terminal_reward_only: reward only where the episode ends (sparse).
    end_prob:             chance that an (s, a) row ends the episode early.
    bernoulli_rewards:    sample binary rewards with the table's mean.
    """

    seed: int = 0
    num_turns: int = 3
    num_states: int = 4
    num_actions: int = 3
    branching: int | None = None
    gamma: float = 1.0
    max_tau: int = 1
    terminal_reward_only: bool = False
    end_prob: float = 0.0
    bernoulli_rewards: bool = False

    def __post_init__(self) -> None:
        for name in ("num_turns", "num_states", "num_actions", "max_tau"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.branching is not None and self.branching < 1:
            raise ValueError(f"branching must be >= 1, got {self.branching}")
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma}")
        if not 0.0 <= self.end_prob <= 1.0:
            raise ValueError(f"end_prob must be in [0, 1], got {self.end_prob}")


# tool_chain's boundary state is (progress 0..K, last call ok): 2(K+1) states, 2 successors per (s, a)
TASKS.register("tool_chain")(
    TaskKind(
        ToolChainParams,
        lambda p: tool_chain(**asdict(p)),
        lambda p: (p.num_turns, 2 * (p.num_turns + 1), p.num_actions, 2),
    )
)
# region_chain: the tool chain's states in up to two region blocks (g = 0, 1), 4 successors at most
TASKS.register("region_chain")(
    TaskKind(
        RegionChainParams,
        lambda p: region_chain(**asdict(p)),
        lambda p: (p.num_turns, 4 * (p.num_turns + 1), p.num_actions, 4),
    )
)
TASKS.register("random")(
    TaskKind(
        RandomParams,
        lambda p: random_mdp(**asdict(p)),
        lambda p: (p.num_turns, p.num_states, p.num_actions, min(p.branching or p.num_states, p.num_states)),
    )
)

_PSI = re.compile(r"^(identity|last_feedback|modulo:([1-9][0-9]*))$")


def check_psi(spec: str) -> str:
    """Validate a context-map spec: identity | last_feedback | modulo:<n>."""
    if not isinstance(spec, str) or not _PSI.match(spec):
        raise ValueError(f"must be identity, last_feedback or modulo:<n> (n >= 1), got {spec!r}")
    return spec


def apply_psi(mdp: TurnMDP, spec: str) -> TurnMDP:
    """The MDP seen through the context map `spec` (identity keeps every state distinct)."""
    m = _PSI.match(check_psi(spec))
    if m.group(1) == "identity":
        return mdp.identity_psi()
    if m.group(1) == "last_feedback":
        return mdp.with_psi(last_feedback_psi(mdp))
    return mdp.with_psi(modulo_psi(mdp, int(m.group(2))))


def build_task(kind: str, params) -> TurnMDP:
    task = TASKS.get(kind)
    if not isinstance(params, task.Params):
        raise TypeError(f"task {kind!r} needs {task.Params.__name__}, got {type(params).__name__}")
    return task.build(params)
