"""Running the real RTPO method on the tabular backend, with spies on what each phase generates and trains.

The spies wrap the names RTPO's phase looks up at call time (`rollout` and `ppo_update` in
rtpo.core.methods.base, behind Method.rollout and Method.ppo), so whatever is installed there — the real
code or a mutant — is what runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rtpo.core import methods
from rtpo.core.methods import RunContext
from rtpo.core.methods import base as base_mod
from rtpo.core.types import Ragged, Trajectory, TurnBatch
from rtpo.tabular import SoftmaxTable, TabularEnv, TabularLearner, TabularSampler, TurnMDP
from rtpo.tabular.policy import TabularPolicy


def make_context(
    mdp: TurnMDP,
    policy: TabularPolicy | None = None,
    params: np.ndarray | None = None,
    lr: float = 0.1,
    optimizer: str = "adam",
    seed: int = 0,
) -> RunContext:
    policy = policy or SoftmaxTable(mdp.num_turns, mdp.num_contexts, mdp.num_actions)
    params = policy.init_params(np.random.default_rng(seed)) if params is None else params
    return RunContext(
        env=TabularEnv(mdp),
        sampler=TabularSampler(policy, params),
        learner=TabularLearner(policy, params, lr=lr, optimizer=optimizer),
        rng=np.random.default_rng(seed),
    )


def make_rtpo(**cfg: Any):
    cls = methods.get("rtpo")
    return cls(cls.Config(**cfg))


def run_iteration(method, ctx: RunContext, num_queries: int) -> list[dict[str, float]]:
    """One RTPO iteration (trunks, then every pending phase) on queries 0..num_queries−1."""
    state = method.begin(ctx, np.arange(num_queries))
    out = []
    while state.pending:
        out.append(method.phase(ctx, state))
    return out


@dataclass
class PhaseRecord:
    """What one phase generated and trained on.

    siblings: the sibling trajectories (G−1 per boundary, row-major); learner_logp: the learner's
    log-probs of every sibling turn at generation time (θ_{>k} before the update), aligned with the
    siblings' recorded rollout log-probs; batches: every minibatch the learner was given.
    """

    siblings: list[Trajectory]
    learner_logp: list[list[np.ndarray]]
    batches: list[TurnBatch] = field(default_factory=list)
    weights_before: np.ndarray | None = None


def trajectory_rows(t: Trajectory) -> TurnBatch:
    """Every turn of a trajectory as one row, in the context recorded at rollout (built directly, so a
    mutant of turn_rows cannot change what the spy measures)."""
    n = t.num_turns
    return TurnBatch(
        contexts=t.contexts,
        tokens=t.tokens,
        old_logp=t.logp,
        advantages=Ragged(np.zeros(t.tokens.values.size), t.tokens.offsets),
        seq_id=np.arange(n),
        weight=np.ones(n),
        turn=t.start_turn + np.arange(n),
    )


@contextmanager
def spy_phases(ctx: RunContext) -> Iterator[list[PhaseRecord]]:
    """Record every sibling rollout and every PPO batch of RTPO phases run inside the block."""
    records: list[PhaseRecord] = []
    orig_rollout = base_mod.rollout  # what Method.rollout calls
    orig_update = base_mod.ppo_update  # what Method.ppo (ReverseTurn's update) calls

    def rollout(env, sampler, episodes, query_ids, rng, n=1, record_boundaries=False):
        res = orig_rollout(env, sampler, episodes, query_ids, rng, n=n, record_boundaries=record_boundaries)
        if not record_boundaries:  # sibling rollouts (trunks record boundaries)
            # one batched call: every turn of every sibling, in its recorded context
            lp = ctx.learner.logprobs(TurnBatch.concat([trajectory_rows(t) for t in res.trajectories]))
            logps, row = [], 0
            for t in res.trajectories:
                logps.append([lp[row + i] for i in range(t.num_turns)])
                row += t.num_turns
            records.append(PhaseRecord(list(res.trajectories), logps, weights_before=ctx.learner.weights()))
        return res

    def ppo_update(learner, batch, loss, epochs, minibatch_size, rng):
        if records:
            records[-1].batches.append(batch)
        return orig_update(learner, batch, loss, epochs, minibatch_size, rng)

    base_mod.rollout = rollout
    base_mod.ppo_update = ppo_update
    try:
        yield records
    finally:
        base_mod.rollout = orig_rollout
        base_mod.ppo_update = orig_update


def greedy(params_table: np.ndarray) -> np.ndarray:
    """(K, C) argmax action of a (K, C, A) probability table."""
    return np.argmax(params_table, axis=-1)
