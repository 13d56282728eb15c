"""What a method is: a way to build TurnBatches from rollouts plus an update schedule.

A method runs one iteration as a list of phases (RTPO: one per turn, K−1 down to 0; GRPO: one).  The
runner calls `begin` once per iteration and `phase` until nothing is pending, checkpointing between
phases, so the IterationState must be picklable and a resumed run continues at the next phase.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from rtpo.core.budget import Budget
from rtpo.core.protocols import Environment, Learner, Sampler
from rtpo.core.registry import Registry


@dataclass
class RunContext:
    """The backend objects a method drives, plus the shared rng and budget counter."""

    env: Environment
    sampler: Sampler
    learner: Learner
    rng: np.random.Generator
    budget: Budget = field(default_factory=Budget)

    def sync(self) -> None:
        """Push the learner's weights to the sampler (Algorithm 1 step 2.1)."""
        self.sampler.load_weights(self.learner.weights())


@dataclass
class IterationState:
    """pending: phases still to run, in order; data: the method's own picklable payload."""

    pending: list[Any]
    data: Any = None
    done_phases: int = 0


class Method(ABC):
    name: ClassVar[str]
    Config: ClassVar[type]

    def __init__(self, cfg: Any) -> None:
        if not isinstance(cfg, self.Config):
            raise TypeError(f"{type(self).__name__} needs a {self.Config.__name__}, got {type(cfg).__name__}")
        self.cfg = cfg

    @abstractmethod
    def begin(self, ctx: RunContext, query_ids: np.ndarray) -> IterationState:
        """Start an iteration on these queries (generate whatever the phases share)."""

    @abstractmethod
    def phase(self, ctx: RunContext, state: IterationState) -> dict[str, float]:
        """Run the next pending phase (pop it from state.pending) and return its metrics."""

    def rollouts_per_query(self, num_turns: int) -> float | None:
        """Rollouts this method plans per query and iteration, where known in advance (equal-budget runs)."""
        return None


METHODS: Registry[type[Method]] = Registry("method")


def register_method(name: str):
    def deco(cls: type[Method]) -> type[Method]:
        cls.name = name
        return METHODS.register(name)(cls)

    return deco
