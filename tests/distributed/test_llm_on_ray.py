"""A full RTPO iteration of an LLM scenario on a local Ray cluster: 2 HF rollout actors and a 2-rank gloo
FSDP2 trainer group (scenarios/llm/tiny-cpu-ray.yaml), against the single-process backends.

Three runs of the same scenario and seed, each one iteration (trunks, then all K phases, each phase a
weight sync and a train step):

  ray      rollout chunks on 2 actors (role "rollout": env + HF engine, no learner), the learner a 2-rank
           gloo FSDP2 group on 2 trainer actors (role "trainer": FSDPLearner in the actors' group).
  sharded  one process, the same per-chunk rng streams, a 1-process learner.  It must reproduce the Ray
           run: the HF engine's draws are a function of the chunk's stream, and a chunk is decoded as the
           same batch on whichever process runs it.  What is exact and what is not:
             - sampled tokens, contexts, rewards, returns, advantages: identical;
             - recorded log-probs: equal within LOGP_ATOL (measured 2.9e-6; most likely because the actors
               run torch with 1 thread and the test process with 2, so matmul reductions differ in the
               last bits);
             - trained weights: all but a share WEIGHT_OUTLIER_SHARE of the elements within WEIGHT_ATOL (a
               2-rank FSDP2 reduce-scatter sums gradients in another order than one process: the bound
               tests/distributed/test_fsdp_trainer_group.py uses), every element within ADAM_NOISE_ATOL
               (0.1 lr).  AdamW's first steps move each element by about lr * g / (|g| + eps), about
               lr * sign(g): where a gradient element is itself at the level of the summation noise its
               update can change by a good fraction of lr.  Measured: 8 of 426,752 elements beyond 5e-6,
               the largest 1.6e-4, against a median move of 3.7e-3; a trainer that computed other
               gradients (one rank's half of the batch, a wrong loss share) moves most elements differently;
             - loss and consistency metrics: within METRIC_ATOL (they are computed from those weights).
  none     the plain single-process backend: the driver's rng feeds the engine directly, so its draws differ
           and the comparison is in distribution.  The check (run on the ray run too): every sampled token
           is a draw from the policy the sampler was told to hold, i.e. softmax(logits / T) of the weights
           the trainer last sent, teacher-forced over the recorded context.  Summing over all N sampled
           tokens, Z = sum_t (log p_t(x_t) + H(p_t)) / sqrt(sum_t Var_t[log p_t]) is a martingale sum with
           mean 0 and variance 1 under that law (E[log p(x)] = -H(p) for x ~ p), so |Z| < Z_MAX holds at a
           fixed seed for a correct sampler (measured: Z = 0.68 over 224 tokens for ray, -0.19 over 200 for
           none).  Z is the score statistic of a temperature change (d/dβ log p^β(x)/Σp^β at β = 1 is
           log p(x) + H(p)), so it is the most sensitive test against a sampler that is too hot or too
           cold or greedy; with ~250 tokens it has limited power against a small change (rollout actors at
           T = 1.0 instead of 0.9 gave Z = -3.0).  It is cheap (one teacher-forced pass of the tiny model
           per rollout row) and compares with the exact law, not with a second noisy run.  The recorded
           log-probs must also equal the teacher-forced ones of the synced weights (within TF_LOGP_ATOL:
           the T = 1.0 actors miss by 0.88, actors that ignore weight syncs by 1.2e-3), and every phase's
           rollout/train ratio must be 1 within 1e-4.

The cluster is the session-shared 2-CPU one (conftest.ray_cluster): the scenario's 4 half-CPU bundles fill
it; every actor process is checked gone after the Ray run, and the session fixture checks that no Ray
process survives the tests.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the distributed extra (ray) is not installed")
pytest.importorskip("transformers", reason="the llm extra (transformers) is not installed")
pytest.importorskip("rtpo.llm.env", reason="the LLM backend (rtpo.llm) is not on this branch")

import rtpo.core.methods.base as method_base  # noqa: E402
from rtpo.core.protocols import ReportsMetrics  # noqa: E402
from rtpo.distributed import distribute  # noqa: E402
from rtpo.scenario.backends import get_backend  # noqa: E402
from rtpo.scenario.load import load_scenario  # noqa: E402

# Ray runs in module fixtures reached through request.getfixturevalue: the tier rule of tests/conftest.py
# cannot see them, so the module is marked (104 s together on 2 cores).
pytestmark = pytest.mark.slow

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "llm" / "tiny-cpu-ray.yaml"
LOGP_ATOL = 1e-5
WEIGHT_ATOL = 5e-6
WEIGHT_OUTLIER_SHARE = 1e-4
ADAM_NOISE_ATOL = 5e-4
METRIC_ATOL = 1e-5
TF_LOGP_ATOL = 1e-4
Z_MAX = 4.0
EXACT_KEYS = ("phase/", "trunk/", "return/", "adv/", "train/tokens", "train/steps")
NUMERIC_KEYS = ("loss/", "consistency/", "train/grad_norm")


@dataclass
class IterationRecord:
    rollouts: list  # [(RolloutResult, the weights the sampler held then)], trunks first, then one per phase
    phases: list  # the method's per-phase metrics (with the distributed context's own)
    weights: dict  # the learner's weights after the iteration
    pids: list  # actor processes (ray only)
    seconds: dict
    env_counters: dict  # the environment's counters over the iteration (env/<key>; time/ sums left out)


def _cfg(models: Path, mode: str, *extra: str):
    return load_scenario(
        SCENARIO, [f"backend.model_cache={models}", f"backend.distributed={mode}", "budget.iterations=1", *extra]
    )


def _iteration(cfg) -> IterationRecord:
    """Build the scenario's backend as the runner does (driver build, then distribute), run one RTPO
    iteration through the registered method, record every rollout call with the sampler's weights."""
    t0 = time.perf_counter()
    built = get_backend("llm").build(cfg)
    t1 = time.perf_counter()
    built = distribute(built, cfg, cfg.backend.distributed, cfg.resources, cfg.backend.address)
    t2 = time.perf_counter()
    ctx, rollouts, phases = built.ctx, [], []
    real_rollout = method_base.rollout

    def recording(*args, **kw):
        res = real_rollout(*args, **kw)
        rollouts.append((res, built.sampler_state()))
        return res

    pids: list[int] = []
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(method_base, "rollout", recording)
            method = cfg.method.build()
            state = method.begin(ctx, np.arange(cfg.budget.queries_per_iteration, dtype=np.int64))
            while state.pending:
                metrics = {**method.phase(ctx, state), **getattr(ctx, "pop_metrics", dict)()}
                if ctx.sampler is not ctx and isinstance(ctx.sampler, ReportsMetrics):  # as rtpo.rundir.runner does
                    metrics.update(ctx.sampler.pop_metrics())
                phases.append(metrics)
        weights = {k: v.detach().clone() for k, v in ctx.learner.weights().items()}
        if hasattr(ctx, "pool"):
            pids = list(ctx.pool.pids) + list(ctx.learner.pids)
            counters: dict = {}
            for p in phases:  # the workers' counters arrive with each phase's metrics
                for k, v in p.items():
                    if k.startswith("env/"):
                        counters[k] = counters.get(k, 0.0) + v
        else:  # one process: the counters are still in the environment the episodes ran on
            executor = getattr(ctx.sampler, "executor", None)  # sharded: the chunks' env; none: ctx.env
            env = executor.env if executor is not None else ctx.env
            counters = {f"env/{k}": float(v) for k, v in env.pop_metrics().items()}
        counters = {k: v for k, v in counters.items() if not k.startswith("env/time/")}
    finally:
        getattr(ctx, "shutdown", lambda: None)()
    t3 = time.perf_counter()
    return IterationRecord(
        rollouts,
        phases,
        weights,
        pids,
        {"build": t1 - t0, "distribute": t2 - t1, "iteration_and_shutdown": t3 - t2},
        counters,
    )


def _gone(pids: list[int], timeout_s: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if os.path.exists(f"/proc/{p}") and "zombie" not in _state(p)]
        if alive:
            time.sleep(0.2)
    return alive


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((line for line in f if line.startswith("State:")), "").lower()
    except OSError:
        return "zombie"  # gone meanwhile


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def ray_run(ray_cluster, models):
    # the driver builds the tiny model first; the actors, started afterwards, find it in model_cache
    run = _iteration(_cfg(models, "ray"))
    assert not _gone(run.pids), "Ray actor processes outlived ctx.shutdown()"
    return run


@pytest.fixture(scope="module")
def ray_collective_run(ray_cluster, models):
    """The same Ray run with resources.weight_sync=collective: trainer rank 0 of the FSDP group broadcasts
    the gathered weights to the HF rollout actors over a gloo weight group instead of the object store."""
    run = _iteration(_cfg(models, "ray", "resources.weight_sync=collective"))
    assert not _gone(run.pids), "Ray actor processes outlived ctx.shutdown()"
    return run


@pytest.fixture(scope="module")
def sharded_run(models):
    return _iteration(_cfg(models, "sharded"))


@pytest.fixture(scope="module")
def plain_run(models):
    return _iteration(_cfg(models, "none"))


def test_the_rollout_workers_environment_counters_reach_the_driver(ray_run, sharded_run):
    """Turns, malformed calls, answer statuses: what the workers' environments counted arrives with the
    chunks' results and sums to the one-process run's counters (the same episodes, so the same counts)."""
    ray, local = ray_run.env_counters, sharded_run.env_counters
    assert local.get("env/turns", 0) > 0 and local.get("env/episodes_done", 0) > 0
    assert set(ray) == set(local)
    for k in sorted(local):
        assert ray[k] == pytest.approx(local[k], rel=1e-12, abs=1e-12), k


GEN_KEYS = {
    "time/generate_s",
    "gen/tokens",
    "gen/responses",
    "gen/response_len_mean",
    "gen/tokens_per_s",
    "perf/generator_flops",
    "perf/generator_flops_per_s",
}


def test_ray_phases_report_generation_under_the_one_process_keys(ray_run, sharded_run, plain_run):
    """The rollout workers' generation reaches the driver's phase metrics under the keys a one-process
    run logs (gen/*, time/generate_s): each phase's tokens and responses are what its recorded rollouts
    generated (the first phase also carries begin's trunks) and equal the sharded run's (the same episodes),
    and so do the generator's model FLOPs (rtpo.llm.flops), summed over the workers."""
    for run in (ray_run, sharded_run, plain_run):
        for p in run.phases:
            assert GEN_KEYS <= set(p), sorted(GEN_KEYS - set(p))
            assert p["gen/tokens_per_s"] > 0 and p["time/generate_s"] > 0
            assert p["gen/response_len_mean"] == pytest.approx(p["gen/tokens"] / p["gen/responses"], rel=1e-12)
        assert sum(p["gen/tokens"] for p in run.phases) == sum(r.tokens for r, _ in run.rollouts)
        assert sum(p["gen/responses"] for p in run.phases) == sum(r.turns for r, _ in run.rollouts)
    for pa, pb in zip(ray_run.phases, sharded_run.phases, strict=True):
        assert (pa["gen/tokens"], pa["gen/responses"]) == (pb["gen/tokens"], pb["gen/responses"])
        assert pa["perf/generator_flops"] == pytest.approx(pb["perf/generator_flops"], rel=1e-12), "same episodes"


@pytest.mark.parametrize("which", ["ray_run", "ray_collective_run"])
def test_ray_iteration_reproduces_the_single_process_sharded_backend(which, request, sharded_run):
    """Trunks, siblings, returns and every phase's metrics of the Ray run (weights synced through the object
    store, or over the collective weight group) equal the one-process run with the same per-chunk streams;
    the 2-rank group's weights equal the 1-process learner's within WEIGHT_ATOL."""
    ray_run = request.getfixturevalue(which)
    cfg = _cfg(Path("unused"), "ray")
    k = cfg.task.num_turns
    assert len(ray_run.rollouts) == len(sharded_run.rollouts) == 1 + k  # trunks + one sibling rollout per phase
    assert len(ray_run.phases) == len(sharded_run.phases) == k
    worst_logp = 0.0
    for (a, _), (b, _) in zip(ray_run.rollouts, sharded_run.rollouts):
        assert len(a.trajectories) == len(b.trajectories) > 0
        for ta, tb in zip(a.trajectories, b.trajectories):
            assert (ta.query_id, ta.start_turn) == (tb.query_id, tb.start_turn)
            assert np.array_equal(ta.contexts.values, tb.contexts.values)
            assert np.array_equal(ta.contexts.offsets, tb.contexts.offsets)
            assert np.array_equal(ta.tokens.values, tb.tokens.values)
            assert np.array_equal(ta.tokens.offsets, tb.tokens.offsets)
            assert np.array_equal(ta.rewards, tb.rewards) and np.array_equal(ta.malformed, tb.malformed)
            worst_logp = max(worst_logp, float(np.max(np.abs(ta.logp.values - tb.logp.values), initial=0.0)))
        assert (a.boundaries is None) == (b.boundaries is None)
        if a.boundaries is not None:
            assert [[(x.trunk, x.k) for x in row] for row in a.boundaries] == [
                [(x.trunk, x.k) for x in row] for row in b.boundaries
            ]
    print(
        f"\nray vs sharded: worst recorded log-prob difference {worst_logp:.2e}; timings ray {ray_run.seconds}, "
        f"sharded {sharded_run.seconds}; phases {[(p.get('phase/boundaries'), p.get('return/mean')) for p in ray_run.phases]}"
    )
    assert worst_logp <= LOGP_ATOL, f"recorded log-probs differ by {worst_logp:.2e}"

    trained = [p for p in ray_run.phases if "train/steps" in p]
    assert trained, "no phase trained: the iteration exercised no train step on the group"
    for pa, pb in zip(ray_run.phases, sharded_run.phases):
        mine = {key for key in pb if key.startswith(EXACT_KEYS + NUMERIC_KEYS)}
        assert mine == {key for key in pa if key.startswith(EXACT_KEYS + NUMERIC_KEYS)}
        for key in sorted(mine):
            if key.startswith(EXACT_KEYS):
                assert pa[key] == pb[key], key
            else:
                assert pa[key] == pytest.approx(pb[key], abs=METRIC_ATOL), key
        if "train/steps" in pa:
            assert pa["ray/weight_syncs"] >= 1 and pa["ray/worker_failures"] == 0
        assert "ray/weight_sync_fallbacks" not in pa
    if which == "ray_collective_run":
        assert sum(p.get("ray/weight_group_forms", 0) for p in ray_run.phases) == 1
        assert all(p.get("ray/weight_broadcast_s", 0) > 0 for p in ray_run.phases if p.get("ray/weight_syncs"))

    assert set(ray_run.weights) == set(sharded_run.weights)
    diff = np.concatenate(
        [
            (ray_run.weights[n].double() - sharded_run.weights[n].double()).abs().flatten().numpy()
            for n in sorted(sharded_run.weights)
        ]
    )
    moved = np.concatenate(
        [
            (sharded_run.weights[n].double() - sharded_run.rollouts[0][1][n].double()).abs().flatten().numpy()
            for n in sorted(sharded_run.weights)
        ]
    )
    outside = int((diff > WEIGHT_ATOL).sum())
    print(
        f"weights: 2-rank group vs 1-process learner max {diff.max():.2e}, {outside} of {diff.size} elements "
        f"> {WEIGHT_ATOL:g}; median move by training {np.median(moved):.2e}"
    )
    assert np.median(moved) > 100 * WEIGHT_ATOL, (
        "the train steps did not move the weights: the comparison would be empty"
    )
    assert outside <= WEIGHT_OUTLIER_SHARE * diff.size, f"{outside} weights differ by more than {WEIGHT_ATOL:g}"
    assert diff.max() <= ADAM_NOISE_ATOL, f"2-rank group vs 1-process learner: {diff.max():.2e}"


def _sampling_z(model_dir: Path, temperature: float, rollouts: list) -> tuple[float, int, float]:
    """(Z, tokens, worst |recorded − teacher-forced| log-prob) of all sampled tokens under the law
    softmax(logits / T) of the weights the sampler held for that rollout call (see the module docstring)."""
    import torch

    from rtpo.llm.engines import HFEngine, SamplingConfig

    ref = HFEngine(model_dir, SamplingConfig(temperature=temperature, max_tokens=1))
    centred, variance, tokens, worst = 0.0, 0.0, 0, 0.0
    with torch.no_grad():
        for res, weights in rollouts:
            ref.load_weights(weights)
            for traj in res.trajectories:
                for ctx_ids, rsp, rec in zip(traj.contexts, traj.tokens, traj.logp):
                    if rsp.size == 0:
                        continue
                    ids = torch.as_tensor(np.concatenate([ctx_ids, rsp]), dtype=torch.long)[None]
                    logits = ref.model(input_ids=ids).logits[0, ctx_ids.size - 1 : ctx_ids.size + rsp.size - 1]
                    logp = torch.log_softmax(logits.double() / temperature, dim=-1)
                    p = logp.exp()
                    entropy = -(p * logp).sum(-1)
                    var = (p * logp.square()).sum(-1) - entropy.square()
                    drawn = logp.gather(1, torch.tensor(rsp, dtype=torch.long)[:, None]).squeeze(
                        1
                    )  # a copy: rsp is read-only
                    centred += float((drawn + entropy).sum())
                    variance += float(var.sum())
                    tokens += rsp.size
                    worst = max(worst, float(np.abs(drawn.numpy() - rec).max()))
    return centred / np.sqrt(variance), tokens, worst


@pytest.mark.parametrize("which", ["ray_run", "plain_run"])
def test_every_sampled_token_follows_the_policy_the_trainer_sent(which, request, models):
    """The Ray run and the plain single-process run (other rng streams) both sample from the law the
    trainer's weights define, at the training temperature, in every phase; their rollout/train ratios are 1."""
    run = request.getfixturevalue(which)
    cfg = _cfg(models, "none")
    model_dir = next(p for p in models.iterdir() if (p / "config.json").is_file())
    z, n, worst = _sampling_z(model_dir, cfg.backend.temperature, run.rollouts)
    print(f"\n{which}: Z = {z:.3f} over {n} tokens; recorded vs teacher-forced log-probs {worst:.2e}; {run.seconds}")
    assert n >= 100, f"only {n} sampled tokens: too few for the test to have power"
    assert abs(z) < Z_MAX, f"sampled tokens are not draws from softmax(logits/T) of the synced weights: Z = {z:.2f}"
    assert worst <= TF_LOGP_ATOL, f"recorded log-probs differ from the synced weights' by {worst:.2e}"
    for p in run.phases:
        if "consistency/rollout_train_ratio" in p:
            assert abs(p["consistency/rollout_train_ratio"] - 1.0) < 1e-4


def test_tool_workers_serve_the_rollout_workers_python_calls(ray_cluster, models):
    """resources.tool_workers > 0 (the 2x8 layouts) starts: the rollout worker's environment sends its
    python tool calls to the tool workers (an ActorTool over their actors), which run the sandbox.  The
    model here never writes a call, so the call is made inside the rollout actor through its environment's
    own runner.  Mutant: distribute() passing no tool factory fails at the start ("needs a tool_factory")."""
    from rtpo.distributed.tools import ActorTool

    cfg = _cfg(
        models,
        "ray",
        "resources.rollout_workers=1",
        "resources.trainer_workers=0",
        "resources.tool_workers=1",
        "resources.cpus_per_worker=0.5",
    )
    built = distribute(get_backend("llm").build(cfg), cfg, "ray", cfg.resources, cfg.backend.address)
    try:
        ctx = built.ctx
        assert ctx.tools is not None and len(ctx.tools.workers) == 1

        def probe(worker):
            from rtpo.llm.sandbox import SandboxLimits

            try:
                result = worker.env.run_tool("print(6 * 7)", SandboxLimits())
            except RuntimeError as e:
                return type(worker.env.run_tool).__name__, str(e)
            return type(worker.env.run_tool).__name__, result.stdout.strip()

        kind, answer = ray.get(ctx.pool.workers[0].__ray_call__.remote(probe))
        assert kind == ActorTool.__name__, f"the rollout worker's env runs its python calls itself ({kind})"
        assert answer == "42", answer
        # a whole iteration runs with the layout
        method = cfg.method.build()
        state = method.begin(ctx, np.arange(cfg.budget.queries_per_iteration, dtype=np.int64))
        while state.pending:
            method.phase(ctx, state)
        # the calls ran on the tool worker: without it they fail, naming the lost tool workers
        ray.kill(ctx.tools.workers[0], no_restart=True)
        _, answer = ray.get(ctx.pool.workers[0].__ray_call__.remote(probe))
        assert "every tool worker failed" in answer, answer
    finally:
        built.ctx.shutdown()
