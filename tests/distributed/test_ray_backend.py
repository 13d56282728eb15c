"""The Ray backend on a 2-CPU local cluster: same results as the single-process backend, load balancing,
weight broadcast, and runs that survive dead rollout, tool and trainer workers."""

import functools
import operator
import pickle

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the distributed extra (ray) is not installed")

from rtpo.core import Budget, methods  # noqa: E402
from rtpo.core.methods.base import RunContext  # noqa: E402
from rtpo.distributed import (  # noqa: E402
    LocalShards,
    RayLearner,
    RayRolloutPool,
    RayToolPool,
    ShardedSampler,
    TrainerFailure,
    local_sharded,
    wrap_with_ray,
)
from rtpo.distributed.examples import TabularToolChain  # noqa: E402
from rtpo.distributed.shards import DeferredEpisodes  # noqa: E402

FACTORY = TabularToolChain(num_turns=4, num_actions=3)
QUERIES = np.arange(6)


class Recorder:
    """Wraps a sampler and keeps every rollout result, to compare runs sibling by sibling."""

    def __init__(self, sampler):
        self.inner, self.results = sampler, []

    def run_rollout(self, *a, **kw):
        res = self.inner.run_rollout(*a, **kw)
        self.results.append(res)
        return res

    def generate(self, *a):
        return self.inner.generate(*a)

    def load_weights(self, w):
        self.inner.load_weights(w)


def _method():
    cls = methods.get("rtpo")
    return cls(cls.Config(G=4, trunks_per_query=2))


def _iterate(ctx, iterations=1):
    m = _method()
    for _ in range(iterations):
        state = m.begin(ctx, QUERIES)
        while state.pending:
            m.phase(ctx, state)


def _local_run(iterations=1):
    """The single-process backend with per-boundary streams: the reference every Ray run must equal."""
    base = FACTORY()
    env, sampler = local_sharded(base.env, base.sampler)
    ctx = RunContext(env, Recorder(sampler), base.learner, base.rng)
    _iterate(ctx, iterations)
    return ctx


def _assert_same_rollouts(a, b):
    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        assert len(ra.trajectories) == len(rb.trajectories)
        for ta, tb in zip(ra.trajectories, rb.trajectories):
            assert np.array_equal(ta.tokens.values, tb.tokens.values)
            assert np.array_equal(ta.contexts.values, tb.contexts.values)
            assert np.array_equal(ta.rewards, tb.rewards) and ta.start_turn == tb.start_turn
            assert np.allclose(ta.logp.values, tb.logp.values, rtol=0, atol=1e-12)


def recorded_ray_ctx(**resources):
    """A Ray context over FACTORY (2 rollout workers, 1 trainer rank, plus `resources`) whose sampler
    records every rollout, with the state _restart puts back."""
    ctx = wrap_with_ray(FACTORY, {"rollout_workers": 2, "trainer_workers": 1, "cpus_per_worker": 0.5, **resources})
    ctx.sampler = Recorder(ctx.sampler)
    ctx.fresh = (ctx.learner.state_dict(), FACTORY().rng.bit_generator.state)
    return ctx


def iterate_like_reference(ctx) -> dict:
    """One RTPO iteration on ctx; its rollouts and trained weights must equal the single-process
    reference's.  Returns the iteration's Ray metrics."""
    ref = _local_run()
    _iterate(ctx)
    _assert_same_rollouts(ref.sampler.results, ctx.sampler.results)
    assert np.allclose(ref.learner.weights(), ctx.learner.weights(), rtol=0, atol=1e-12)
    return ctx.pop_metrics()


@pytest.fixture(scope="module")
def ray_ctx(ray_cluster):
    ctx = recorded_ray_ctx(max_restarts=1)
    yield ctx
    ctx.shutdown()


def _restart(ctx):
    """Put the Ray context back at the start of a run (learner state, driver rng, records)."""
    state, rng_state = ctx.fresh
    ctx.learner.load_state_dict(state)
    ctx.rng = np.random.default_rng()
    ctx.rng.bit_generator.state = rng_state
    ctx.sampler.results = []
    ctx.budget = Budget()
    ctx.pop_metrics()


def test_ray_rtpo_iteration_equals_the_single_process_backend(ray_ctx):
    """Trunks, every phase's siblings and the trained weights are identical, whichever worker ran what."""
    _restart(ray_ctx)
    met = iterate_like_reference(ray_ctx)
    assert len(ray_ctx.sampler.results) == 1 + 4  # trunks, then one sibling rollout per phase
    assert met["ray/weight_syncs"] == 5  # trunks + one per phase (Algorithm 1 step 2.1)
    assert met["ray/weight_sync_s"] > 0 and met["ray/worker_failures"] == 0
    # load balancing: the last phase (boundaries at turn 0, one per trunk) was shared by both workers
    assert met["ray/tasks_per_worker_min"] >= 1
    assert met["ray/tasks_per_worker_max"] + met["ray/tasks_per_worker_min"] == len(QUERIES) * 2


def test_a_rollout_worker_dying_mid_phase_changes_nothing(ray_ctx):
    """Worker 0 exits when it starts its 3rd chunk (mid trunk rollout); Ray restarts it, the lost chunk
    re-runs with the same weights and stream, and the whole iteration is identical to the reference."""
    _restart(ray_ctx)
    pid0 = ray_ctx.pool.pids[0]
    ray_ctx.pool.arm_fault(0, after_tasks=2)
    met = iterate_like_reference(ray_ctx)
    assert met["ray/worker_failures"] == 1
    assert ray_ctx.pool.pids[0] != pid0  # a new process, restarted by Ray (max_restarts=1)
    assert "ray/workers_recreated" not in met


def test_a_worker_past_its_restarts_is_recreated_and_the_phase_is_unchanged(ray_cluster):
    """With no restarts left the pool creates a fresh actor; it catches up on the weights version and
    re-runs the lost chunk; chunk 0, finished before the death, is kept, not re-run."""
    base = FACTORY()
    q = np.arange(5)
    trunks = _local_run().sampler.results[0]
    snaps = [row[0].snapshot for row in trunks.boundaries[:5]]
    local = ShardedSampler(LocalShards(base.env, base.sampler))
    want = local.run_rollout(None, DeferredEpisodes(snapshots=tuple(snaps)), q, np.random.default_rng(3), n=3)
    # the module's placement group holds 1.5 of the 2 CPUs: this pool fits in the rest
    pool = RayRolloutPool(FACTORY, 1, num_cpus=0.25, max_restarts=0)
    try:
        pool.arm_fault(0, after_tasks=1)  # finishes chunk 0, dies on chunk 1, no restarts left
        got = ShardedSampler(pool).run_rollout(
            None, DeferredEpisodes(snapshots=tuple(snaps)), q, np.random.default_rng(3), n=3
        )
        _assert_same_rollouts([want], [got])
        assert pool.recreated == 1 and pool.failures == 1
    finally:
        pool.shutdown()


def test_tool_pool_survives_a_dead_worker(ray_cluster):
    triple = functools.partial(functools.partial, operator.mul, 3)  # factory() -> the tool x -> 3x
    pool = RayToolPool(triple, 2, num_cpus=0.25, max_restarts=2)
    try:
        pool.arm_fault(0, after_tasks=3)
        assert pool.map(range(40)) == [3 * x for x in range(40)]
        met = pool.pop_metrics()
        assert met["tools/worker_failures"] == 1 and met["tools/tasks"] == 40
    finally:
        pool.shutdown()


def _checkpoint(path, ctx, iteration, state):
    """Atomic: write aside, then rename over the previous checkpoint."""
    blob = dict(
        learner=ctx.learner.state_dict(),
        rng=ctx.rng.bit_generator.state,
        budget=ctx.budget,
        iteration=iteration,
        state=state,
    )
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(blob))
    tmp.replace(path)


def test_a_dead_trainer_resumes_from_the_last_checkpoint_and_ends_where_an_unbroken_run_ends(ray_ctx, tmp_path):
    """Kill the trainer rank in iteration 2, phase 3; the next Learner call raises TrainerFailure; a new
    trainer group loads the last checkpoint (taken after every phase) and the run finishes with exactly the
    weights of an uninterrupted run."""
    _restart(ray_ctx)
    ref = _local_run(iterations=2)
    ckpt = tmp_path / "ckpt.pkl"
    m = _method()
    killed = False
    iteration, state = 0, None
    while iteration < 2:
        try:
            if state is None:
                state = m.begin(ray_ctx, QUERIES)
                _checkpoint(ckpt, ray_ctx, iteration, state)
            while state.pending:
                if iteration == 1 and state.done_phases == 2 and not killed:
                    ray.kill(ray_ctx.learner.workers[0])
                    killed = True
                m.phase(ray_ctx, state)
                _checkpoint(ckpt, ray_ctx, iteration, state)
            iteration, state = iteration + 1, None
        except TrainerFailure:
            blob = pickle.loads(ckpt.read_bytes())
            ray_ctx.learner.shutdown()
            ray_ctx.learner = RayLearner(
                FACTORY, 1, num_cpus=0.5, strategy=lambda r: ray_ctx.placement.strategy("trainer", r)
            )
            ray_ctx.learner.load_state_dict(blob["learner"])
            ray_ctx.rng.bit_generator.state = blob["rng"]
            ray_ctx.budget, iteration, state = blob["budget"], blob["iteration"], blob["state"]
    assert killed
    assert np.allclose(ref.learner.weights(), ray_ctx.learner.weights(), rtol=0, atol=1e-12)
    assert ray_ctx.budget == ref.budget


def test_a_resources_section_the_cluster_cannot_hold_is_a_clear_error(ray_cluster):
    with pytest.raises(RuntimeError, match="cannot place the resources section"):
        wrap_with_ray(FACTORY, {"rollout_workers": 1, "gpus_per_rollout_worker": 1.0}, placement_timeout_s=2.0)
    assert ray.is_initialized()  # a cluster the caller started stays up


def test_the_llm_python_sandbox_runs_on_the_tool_pool_and_survives_a_dead_worker(ray_cluster):
    """LLMEnv's injectable run_tool backed by the Ray tool pool: same results as the local sandbox."""
    sandbox = pytest.importorskip("rtpo.llm.sandbox", reason="the LLM environment (rtpo.llm) is not on this branch")
    from rtpo.distributed import PoolTool, StarTool

    pool = RayToolPool(StarTool(sandbox.run_python), 2, num_cpus=0.25, max_restarts=1)
    try:
        tool = PoolTool(pool)
        pool.arm_fault(0, after_tasks=2)  # single calls go to worker 0 first: it dies on the 3rd
        codes = [f"print({i} * {i} + 1)" for i in range(4)]
        got = [tool(c, sandbox.SandboxLimits()) for c in codes]
        assert [r.stdout.strip() for r in got] == [str(i * i + 1) for i in range(4)]
        assert all(r.ok for r in got) and pool.failures == 1
        want = sandbox.run_python(codes[3], sandbox.SandboxLimits())
        assert (got[3].stdout, got[3].ok) == (want.stdout, want.ok)
    finally:
        pool.shutdown()


def test_an_actor_tool_serves_calls_from_inside_other_actors_and_skips_dead_tool_workers(ray_cluster):
    """ActorTool is how a rollout worker's environment reaches the tool workers (wrap_with_ray hands it to
    ScenarioFactory.with_tools): picklable into a task, each call on one tool actor, a dead actor skipped,
    and a clear error once every actor is gone.  Mutant: raising on the first RayActorError instead of
    trying the next actor fails the middle assertion."""
    sandbox = pytest.importorskip("rtpo.llm.sandbox", reason="the LLM environment (rtpo.llm) is not on this branch")
    from rtpo.distributed import StarTool
    from rtpo.distributed.tools import ActorTool

    pool = RayToolPool(StarTool(sandbox.run_python), 2, num_cpus=0.25, max_restarts=0)
    try:
        tool = ActorTool(tuple(pool.workers), wait_s=10.0)

        @ray.remote(num_cpus=0)
        def inside(tool, codes):  # as a rollout actor would call it
            return [tool(c, sandbox.SandboxLimits()).stdout.strip() for c in codes]

        codes = [f"print({i} * 7)" for i in range(4)]
        assert ray.get(inside.remote(tool, codes)) == [str(7 * i) for i in range(4)]
        ray.kill(pool.workers[0], no_restart=True)
        got = [tool(c, sandbox.SandboxLimits()).stdout.strip() for c in codes]
        assert got == [str(7 * i) for i in range(4)], "a dead tool worker must be skipped, not fail the call"
        ray.kill(pool.workers[1], no_restart=True)
        with pytest.raises(RuntimeError, match="every tool worker failed"):
            tool("print(1)", sandbox.SandboxLimits())
    finally:
        pool.shutdown()


def test_tool_workers_for_a_scenario_without_tool_calls_are_refused_before_any_cluster_starts():
    from rtpo.distributed import distribute
    from rtpo.scenario.backends import build_backend
    from rtpo.scenario.load import ConfigError, load_scenario

    cfg = load_scenario(None, ["budget.iterations=1", "resources.tool_workers=1"])
    with pytest.raises(ConfigError, match=r"resources\.tool_workers: 1 tool workers, but this scenario \(tabular"):
        distribute(build_backend(cfg), cfg, "ray", cfg.resources, num_cpus=1)
