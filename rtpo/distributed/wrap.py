"""`wrap_with_ray`: the same RunContext a method drives, with Ray workers behind its env, sampler and learner."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rtpo.core.budget import Budget
from rtpo.core.methods.base import RunContext
from rtpo.distributed.pool import RayRolloutPool
from rtpo.distributed.resources import Placement, Resources
from rtpo.distributed.shards import ShardedEnv, ShardedSampler, build_parts
from rtpo.distributed.tools import ActorTool, RayToolPool
from rtpo.distributed.trainer import RayLearner


def init_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Connect to a cluster (`address`: "auto", "ray://host:10001", host:port) or start a local one.

    Returns True if this call started Ray (so the caller owns the shutdown).  The dashboard stays off;
    token auth is turned off when HOME is not writable (Ray would store its token under ~/.ray).
    """
    import ray

    if ray.is_initialized():
        return False
    home = os.path.expanduser("~")
    if not os.access(home, os.W_OK):
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
    if address is not None:
        ray.init(address=address, **kwargs)
        return True
    # A local start waits a fixed 30 s for its raylet; on an overloaded machine that can pass, so a
    # local start is tried twice before the error goes up.
    for attempt in (1, 2):
        try:
            ray.init(num_cpus=num_cpus, **kwargs)
            return True
        except Exception as e:  # ray raises a bare Exception for this timeout
            ray.shutdown()
            if attempt == 2 or "timed out during startup" not in str(e):
                raise
    return True


@dataclass
class RayRunContext(RunContext):
    """A RunContext whose env/sampler run on a RayRolloutPool and whose learner may be a RayLearner.

    sync() sends the trainer's weights to the rollout workers through the object store without a detour
    through the driver when the learner is a trainer group, or over the weight group when
    resources.weight_sync is "collective" (weight_sync: a rtpo.distributed.collective.CollectiveWeightSync).
    """

    pool: Any = None
    tools: Any = None
    placement: Any = None
    owns_ray: bool = False
    extra: dict = field(default_factory=dict)
    weight_sync: Any = None

    def sync(self) -> None:
        t0 = time.perf_counter()
        if self.weight_sync is not None:
            self.weight_sync.sync()
        elif isinstance(self.learner, RayLearner):
            self.sampler.load_weights(self.learner.remote_weights())
        else:
            self.sampler.load_weights(self.learner.weights())
        self.extra["ray/sync_total_s"] = self.extra.get("ray/sync_total_s", 0.0) + time.perf_counter() - t0

    def pop_metrics(self) -> dict[str, float]:
        """Ray metrics since the last call: weight broadcast time, chunks per worker, failures, restarts."""
        out = dict(self.extra)
        self.extra = {}
        out.update(self.pool.pop_metrics())
        if self.tools is not None:
            out.update(self.tools.pop_metrics())
        return out

    def shutdown(self) -> None:
        """Kill every actor and the placement group; shut Ray down if wrap_with_ray started it."""
        import ray

        for part in (self.pool, self.tools, self.learner if isinstance(self.learner, RayLearner) else None):
            if part is not None:
                part.shutdown()
        if self.placement is not None:
            self.placement.remove()
        if self.owns_ray:
            ray.shutdown()


def wrap_with_ray(
    ctx_factory: Callable[..., Any],
    resources: Resources | dict | None = None,
    address: str | None = None,
    *,
    tool_factory: Callable[[], Callable[[Any], Any]] | None = None,
    driver: Any = None,
    num_cpus: int | None = None,
    placement_timeout_s: float = 120.0,
) -> RayRunContext:
    """Build the Ray layout for `resources` and return a RunContext over it.

    ctx_factory: picklable; called as ctx_factory(role=...) if it takes `role` ("driver", "rollout",
        "trainer"), else ctx_factory(); returns a RunContext (or anything with env, sampler, learner, rng).
        Rollout actors keep its env and sampler; trainer ranks keep its learner (built after the process
        group is up, so an FSDP learner finds it).
    driver: the driver's own RunContext if the caller already built one (the runner does): its rng and
        budget are kept, and its learner is used when resources.trainer_workers == 0.  None: the factory
        is called once more on the driver (role "driver") for them.
    address: None starts a local cluster (num_cpus CPUs); otherwise the cluster to join ("auto" after
        `ray start --head`, or "ray://host:10001").
    tool_factory: builds one tool callable per tool worker (resources.tool_workers of them).  A ctx_factory
        with `with_tools(run_tool)` (rtpo.distributed.ScenarioFactory) gets an ActorTool over those actors
        for its rollout role, so the rollout workers' tool calls run on the tool workers; ctx.tools is the
        pool itself (PoolTool(ctx.tools) calls it from the driver).
    """
    res = resources if isinstance(resources, Resources) else Resources.from_dict(resources)
    if res.tool_workers > 0 and tool_factory is None:
        raise ValueError("resources.tool_workers > 0 needs a tool_factory")
    owns = init_ray(address, num_cpus)
    placement = pool = tools = learner = None
    try:
        placement = Placement(res, timeout_s=placement_timeout_s)
        if res.tool_workers > 0:
            tools = RayToolPool(
                tool_factory,
                res.tool_workers,
                num_cpus=res.cpus_per_worker,
                max_restarts=res.max_restarts,
                strategy=lambda i: placement.strategy("tool", i),
            )
        rollout_factory = ctx_factory
        if tools is not None and hasattr(ctx_factory, "with_tools"):
            # the rollout workers' environments call the tool actors directly (no hop through the driver)
            rollout_factory = ctx_factory.with_tools(ActorTool(tuple(tools.workers)))
        pool = RayRolloutPool(
            rollout_factory,
            res.rollout_workers,
            num_cpus=res.cpus_per_worker,
            num_gpus=res.gpus_per_rollout_worker,
            max_restarts=res.max_restarts,
            inflight_per_worker=res.inflight_per_worker,
            strategy=lambda i: placement.strategy("rollout", i),
        )
        if driver is None:
            driver = build_parts(ctx_factory, "driver")
        if res.trainer_workers > 0:
            learner = RayLearner(
                ctx_factory,
                res.trainer_workers,
                backend=res.trainer_backend,
                num_cpus=res.cpus_per_worker,
                num_gpus=res.gpus_per_trainer_worker,
                strategy=lambda r: placement.strategy("trainer", r),
            )
        else:
            learner = driver.learner
            if learner is None:
                raise ValueError("resources.trainer_workers == 0 needs the factory's driver context to hold a learner")
        ctx = RayRunContext(
            env=ShardedEnv(pool),
            sampler=ShardedSampler(pool, res.chunk_size),
            learner=learner,
            rng=driver.rng,
            budget=getattr(driver, "budget", None) or Budget(),
            pool=pool,
            tools=tools,
            placement=placement,
            owns_ray=owns,
        )
        if res.weight_sync == "collective":
            from rtpo.distributed.collective import CollectiveWeightSync

            ctx.weight_sync = CollectiveWeightSync(learner, pool, res.weight_sync_backend, res.weight_bucket_mb)
        ctx.extra["ray/rollout_workers"] = float(res.rollout_workers)
        return ctx
    except BaseException:
        import ray

        for part in (pool, tools, learner if isinstance(learner, RayLearner) else None):
            if part is not None:
                part.shutdown()
        if placement is not None:
            placement.remove()
        if owns:
            ray.shutdown()
        raise
