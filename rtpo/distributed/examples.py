"""Picklable context factories for the tabular backend (tests, docs, and the runner's tabular scenarios)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rtpo.core.methods.base import RunContext


@dataclass(frozen=True)
class TabularToolChain:
    """A RunContext on tool_chain(num_turns, num_actions, mdp_seed) with a SoftmaxTable initialised from
    param_seed; every call builds identical objects, so rollout actors, trainer ranks and the driver agree."""

    num_turns: int = 4
    num_actions: int = 3
    mdp_seed: int = 1
    param_seed: int = 0
    rng_seed: int = 0
    lr: float = 0.1

    def __call__(self, role: str = "driver") -> RunContext:
        from rtpo.tabular import SoftmaxTable, TabularEnv, TabularLearner, TabularSampler, tool_chain

        mdp = tool_chain(num_turns=self.num_turns, num_actions=self.num_actions, seed=self.mdp_seed)
        pol = SoftmaxTable(mdp.num_turns, mdp.num_contexts, mdp.num_actions)
        p0 = pol.init_params(np.random.default_rng(self.param_seed))
        return RunContext(
            env=TabularEnv(mdp),
            sampler=TabularSampler(pol, p0),
            learner=TabularLearner(pol, p0, lr=self.lr),
            rng=np.random.default_rng(self.rng_seed),
        )


@dataclass(frozen=True)
class FSDPTrainerFactory:
    """A trainer-role factory for the LLM backend's FSDP2 learner: each rank of a RayLearner group builds
    its shard with the group's rank and size (the process group already exists when it is called)."""

    model_dir: str
    learner_config: Any = None

    def __call__(self, role: str = "trainer") -> RunContext:
        import torch.distributed as dist

        from rtpo.llm.learner import FSDPLearner, LearnerConfig

        cfg = self.learner_config if self.learner_config is not None else LearnerConfig()
        rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        learner = FSDPLearner(self.model_dir, cfg, rank=rank, world_size=world)
        return RunContext(env=None, sampler=None, learner=learner, rng=np.random.default_rng(0))
