"""Tabular benchmarks (pytest-benchmark).  Run them with `python bench/run.py`, which writes
bench/results.json; under the repository's default `--benchmark-disable` each body runs once as a test.

- exact solve of a sparse random MDP with 10⁵ states (K = 8 turns × 12 500 states, A = 8, 4 successors);
- one RTPO iteration on a tool chain, reported in sibling-turn samples per second, with the reference
  measured in the same run: drawing the same number of categorical samples in one vectorised numpy
  call.  extra_info["ratio_vs_vectorised"] is (RTPO time per sample) / (reference time per sample):
  the overhead of the whole algorithm (rollout driver, environment, policy, PPO) per sample drawn.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from rtpo.core import RunContext, methods
from rtpo.tabular import SoftmaxTable, TabularEnv, TabularLearner, TabularSampler, random_mdp, solve, tool_chain


@pytest.fixture(scope="module")
def big_mdp():
    return random_mdp(0, num_turns=8, num_states=12_500, num_actions=8, branching=4)


def test_bench_solve_sparse_1e5_states(benchmark, big_mdp):
    assert sum(big_mdp.num_states) == 100_000
    sol = benchmark.pedantic(solve, args=(big_mdp,), rounds=5, iterations=1, warmup_rounds=1)
    benchmark.extra_info.update(states=100_000, num_actions=8, num_turns=8, branching=4)
    # V* is at least the value of any fixed action sequence and at most K·max r
    assert 0.0 < sol.value <= 8.0


K, A, Q, G = 6, 4, 64, 8


def _rtpo_setup(seed: int = 0):
    torch.set_num_threads(1)  # as the tabular backend's builder does
    mdp = tool_chain(num_turns=K, num_actions=A, seed=0)
    policy = SoftmaxTable(mdp.num_turns, mdp.num_contexts, mdp.num_actions)
    rng = np.random.default_rng(seed)
    params = policy.init_params(rng)
    ctx = RunContext(TabularEnv(mdp), TabularSampler(policy, params), TabularLearner(policy, params, lr=0.1), rng)
    cls = methods.get("rtpo")
    return ctx, cls(cls.Config(G=G, epochs=1))


def _one_iteration(ctx, method) -> int:
    turns_before = ctx.budget.turns
    state = method.begin(ctx, np.arange(Q))
    trunk_turns = ctx.budget.turns - turns_before
    while state.pending:
        method.phase(ctx, state)
    return ctx.budget.turns - turns_before - trunk_turns  # sibling turns sampled this iteration


def _reference_seconds(n: int, repeats: int = 20) -> float:
    """Best time of one vectorised call drawing n categorical samples over A actions."""
    rng = np.random.default_rng(0)
    p = np.full(A, 1.0 / A)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        rng.choice(A, size=n, p=p)
        best = min(best, time.perf_counter() - t0)
    return best


def test_bench_rtpo_iteration_throughput(benchmark):
    ctx, method = _rtpo_setup()
    samples = _one_iteration(ctx, method)  # warm-up; tool_chain episodes never end early, so fixed
    # every trunk boundary k gets G-1 siblings of K-k turns each
    assert samples == Q * (G - 1) * K * (K + 1) // 2
    benchmark.pedantic(_one_iteration, args=(ctx, method), rounds=5, iterations=1)
    stats = getattr(benchmark, "stats", None)
    per_iter = stats.stats.min if stats is not None else None
    if per_iter is None:  # benchmarks disabled: time one more iteration by hand
        t0 = time.perf_counter()
        _one_iteration(ctx, method)
        per_iter = time.perf_counter() - t0
    ref = _reference_seconds(samples)
    benchmark.extra_info.update(
        sibling_turn_samples_per_iteration=samples,
        samples_per_s=samples / per_iter,
        reference_vectorised_samples_per_s=samples / ref,
        ratio_vs_vectorised=per_iter / ref,
    )
    assert samples / per_iter > 0
