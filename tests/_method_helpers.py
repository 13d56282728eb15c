"""Shared fixtures for the method tests: a tabular stack on a tool chain (optionally with an aliasing ψ
and full-history contexts) and a loop that runs whole iterations."""

from __future__ import annotations

import numpy as np

from rtpo.core import RunContext, methods
from rtpo.tabular import SoftmaxTable, TabularEnv, TabularLearner, TabularSampler, last_feedback_psi, tool_chain
from rtpo.tabular.history import FullHistoryEnv, history_policy


def stack(mdp=None, K=3, seed=0, lr=0.1, truncate=False, init_scale=None, columnar=True, optimizer="adam"):
    """(mdp, policy, RunContext) on tool_chain(K) (or `mdp`); truncate=True: last-feedback ψ at rollout,
    full-history contexts exposed, log-linear policy sharing θ between the two views.  One rng (seed)
    draws θ0 and then drives the run; init_scale: the softmax table's init scale (None: its default);
    columnar / optimizer: RunContext's and TabularLearner's."""
    mdp = tool_chain(num_turns=K, num_actions=3, seed=1) if mdp is None else mdp
    if truncate:
        mdp = mdp.with_psi(last_feedback_psi(mdp))
        env, pol = FullHistoryEnv(mdp), history_policy(mdp)
    else:
        scale = {} if init_scale is None else {"init_scale": init_scale}
        env, pol = TabularEnv(mdp), SoftmaxTable(mdp.num_turns, mdp.num_contexts, mdp.num_actions, **scale)
    rng = np.random.default_rng(seed)
    p0 = pol.init_params(rng)
    learner = TabularLearner(pol, p0, lr=lr, optimizer=optimizer)
    return mdp, pol, RunContext(env, TabularSampler(pol, p0), learner, rng, columnar=columnar)


def make(name: str, **cfg):
    cls = methods.get(name)
    return cls(cls.Config(**cfg))


def run(method, ctx, iterations: int, queries: int = 4) -> list[dict]:
    """All phase metrics of `iterations` iterations, in order."""
    out = []
    for _ in range(iterations):
        state = method.begin(ctx, np.arange(queries))
        while state.pending:
            out.append(method.phase(ctx, state))
    return out
