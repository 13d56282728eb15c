"""The runner's hook: turn a built backend into a distributed one (`backend.distributed` in a scenario).

    built = get_backend(cfg.backend.kind).build(cfg)
    built = distribute(built, cfg, mode, resources, address)   # mode: "none" | "sharded" | "ray"

"sharded" runs the per-boundary-stream chunks in this process and reproduces a "ray" run exactly (the
reference the tests compare Ray against); "ray" builds rollout/trainer/tool workers with wrap_with_ray.
Each worker rebuilds the backend from the scenario itself (ScenarioFactory), so any registered backend
works without knowing about Ray.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any

from rtpo.core.methods.base import RunContext
from rtpo.distributed.resources import Resources
from rtpo.distributed.shards import local_sharded

MODES = ("none", "sharded", "ray")


@dataclass(frozen=True)
class ScenarioFactory:
    """A picklable context factory: the scenario's own backend builder, run inside a worker.

    A backend spec with an optional `build_role(cfg, role) -> RunContext` builds only what the role uses
    (and its learner for the trainer group's rank); otherwise the full `build(cfg).ctx` is used.
    """

    cfg: Any
    run_tool: Any = None  # the tool workers' runner (an ActorTool) for the rollout role's environment

    def __call__(self, role: str = "driver") -> RunContext:
        from rtpo.scenario import plugins
        from rtpo.scenario.backends import get_backend

        # a worker process imports the run's plugins first: a name its config only refers to (a text
        # environment, a tool) is registered by the plugin's import, which unpickling cfg does not do
        plugins.load(getattr(self.cfg, "plugins", None) or ())
        spec = get_backend(self.cfg.backend.kind)
        build_role = getattr(spec, "build_role", None)
        if build_role is not None:
            if role == "rollout" and self.run_tool is not None:
                return build_role(self.cfg, role, run_tool=self.run_tool)
            return build_role(self.cfg, role)
        return spec.build(self.cfg).ctx

    def with_tools(self, run_tool: Any) -> ScenarioFactory:
        """The same factory whose rollout workers send their tool calls to `run_tool` (wrap_with_ray)."""
        return dataclasses.replace(self, run_tool=run_tool)


def distribute(
    built: Any,
    cfg: Any,
    mode: str = "ray",
    resources: Resources | dict | None = None,
    address: str | None = None,
    *,
    num_cpus: int | None = None,
) -> Any:
    """Return `built` (a rtpo.scenario.backends.BuiltBackend) with its ctx replaced by a sharded or Ray one.

    evaluate() still runs on the driver's learner: with a trainer group it first receives the group's
    state.  sampler_state()/load_sampler_state() read and set the weights the rollout workers hold.
    With mode "ray" the returned ctx owns workers: call built.ctx.shutdown() when the run ends or fails.
    """
    if mode not in MODES:
        raise ValueError(f"backend.distributed must be one of {', '.join(MODES)}, got {mode!r}")
    res = resources if isinstance(resources, Resources) else Resources.from_dict(resources)
    if mode == "none":
        return built
    local = built.ctx
    if mode == "sharded":
        env, sampler = local_sharded(local.env, local.sampler, res.chunk_size)
        return dataclasses.replace(built, ctx=RunContext(env, sampler, local.learner, local.rng, local.budget))

    from rtpo.distributed.wrap import wrap_with_ray

    if address is None and num_cpus is None:
        # a local cluster gets at least the logical CPUs its own layout asks for (oversubscribing a
        # small machine is fine for actors that mostly wait), so the default layout always places
        need = math.ceil(sum(b.get("CPU", 0.0) for b in res.bundles()))
        num_cpus = max(os.cpu_count() or 1, need)
    tool_factory = None
    if res.tool_workers > 0:
        from rtpo.scenario.backends import get_backend
        from rtpo.scenario.schema import ConfigError

        make = getattr(get_backend(cfg.backend.kind), "tool_factory", None)
        tool_factory = make(cfg) if make is not None else None
        if tool_factory is None:
            raise ConfigError(
                f"resources.tool_workers: {res.tool_workers} tool workers, but this scenario "
                f"({cfg.backend.kind} backend, task kind {getattr(cfg.task, 'kind', '?')}) has no tool calls "
                "that run on them; set it to 0"
            )
    ctx = wrap_with_ray(ScenarioFactory(cfg), res, address, tool_factory=tool_factory, driver=local, num_cpus=num_cpus)

    def evaluate() -> dict[str, float]:
        if ctx.learner is not local.learner:
            local.learner.load_state_dict(ctx.learner.state_dict())
        return built.evaluate()

    def sampler_state() -> Any:
        import ray

        from rtpo.distributed.trainer import TrainerFailure

        try:
            return ctx.pool.current_weights()
        except ray.exceptions.ObjectLostError as e:
            # the workers' weights were put by trainer rank 0: a lost trainer node takes that copy with it
            # (OwnerDiedError), so the checkpoint cannot be written; the run resumes from the previous one
            raise TrainerFailure(
                f"the rollout workers' weights were lost with their owner, trainer rank 0 ({type(e).__name__}); "
                "resume the run from its last checkpoint"
            ) from None

    def load_sampler_state(weights: Any) -> None:
        if weights is not None:  # None: the workers still hold the factory's initial weights
            ctx.sampler.load_weights(weights)

    return dataclasses.replace(
        built,
        ctx=ctx,
        evaluate=evaluate,
        sampler_state=sampler_state,
        load_sampler_state=load_sampler_state,
        sampler_state_at_boundary=None,  # the workers' weights are checkpointed as they are
        sample_log=None,  # the episodes finish on the workers
    )
