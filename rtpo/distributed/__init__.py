"""Scale-out on Ray behind the core's protocols: rollout, trainer and tool workers, with fault tolerance.

May import rtpo.core, the floor below the backends (rtpo.scenario.schema, backends) and the other backends'
learners and examples (rtpo.llm.learner, rtpo.tabular), never the runner or a command; rtpo.core never
imports this package.  Nothing here imports ray at module load (the Ray parts import it
when they start), and names load lazily, so `rtpo.distributed.tools` stays free of torch in a tool actor
and the in-process sharded backend works where ray is absent.
"""

import importlib

_WHERE = {
    "Chunk": "shards",
    "DeferredEpisodes": "shards",
    "LocalShards": "shards",
    "ShardedEnv": "shards",
    "ShardedSampler": "shards",
    "chunk_rng": "shards",
    "local_sharded": "shards",
    "run_chunk": "shards",
    "Placement": "resources",
    "Resources": "resources",
    "RayRolloutPool": "pool",
    "RemoteWeights": "pool",
    "RayToolPool": "tools",
    "PoolTool": "tools",
    "StarTool": "tools",
    "RayLearner": "trainer",
    "TrainerFailure": "trainer",
    "ScenarioFactory": "runner",
    "distribute": "runner",
    "RayRunContext": "wrap",
    "init_ray": "wrap",
    "wrap_with_ray": "wrap",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'rtpo.distributed' has no attribute {name!r}")
    return getattr(importlib.import_module(f"rtpo.distributed.{_WHERE[name]}"), name)
