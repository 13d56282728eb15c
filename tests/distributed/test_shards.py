"""The sharded rollout without Ray: chunk streams, merging, and equality in law with the plain driver."""

import numpy as np
import pytest

from rtpo.core import methods, rollout
from rtpo.core.methods.base import RunContext
from rtpo.distributed import DeferredEpisodes, Resources, ShardedEnv, chunk_rng, local_sharded
from rtpo.distributed.examples import TabularToolChain
from rtpo.distributed.shards import make_chunks


def _trunks(ctx, q):
    return rollout(ctx.env, ctx.sampler, ctx.env.reset(q, ctx.rng), q, ctx.rng, record_boundaries=True)


def test_each_boundary_is_its_own_stream_whatever_the_chunking_of_the_call():
    """Chunk i of a call equals a lone rollout from boundary i with stream (key, i): results depend on
    (key, boundary index, weights) only, and the merged boundaries point at the right trunks."""
    base = TabularToolChain()()
    env, sampler = local_sharded(base.env, base.sampler, chunk_size=1)
    q = np.arange(7)
    trunks = rollout(
        env, sampler, env.reset(q, np.random.default_rng(5)), q, np.random.default_rng(5), record_boundaries=True
    )
    for e, row in enumerate(trunks.boundaries):
        for j, b in enumerate(row):
            assert b.trunk == e and np.array_equal(trunks.trajectories[b.trunk].contexts[j], b.context)
    bounds = [row[0] for row in trunks.boundaries]
    snaps = [b.snapshot for b in bounds]
    rng = np.random.default_rng(11)
    res = rollout(env, sampler, env.restore(snaps), q, rng, n=3)
    key = int(np.random.default_rng(11).integers(2**63))
    for i in range(len(q)):
        lone = rollout(base.env, base.sampler, base.env.restore([snaps[i]]), q[i : i + 1], chunk_rng(key, i), n=3)
        for a, b in zip(res.trajectories[3 * i : 3 * i + 3], lone.trajectories):
            assert np.array_equal(a.tokens.values, b.tokens.values) and np.array_equal(a.rewards, b.rewards)
    assert res.turns == sum(t.num_turns for t in res.trajectories)


def test_chunks_cover_every_episode_once_in_order():
    ep = DeferredEpisodes(snapshots=tuple(range(10)))
    chunks = make_chunks(ep, np.arange(10) * 2, key=3, n=2, record_boundaries=False, chunk_size=4)
    assert [len(c.query_ids) for c in chunks] == [4, 4, 2]
    assert [s for c in chunks for s in c.snapshots] == list(range(10))
    assert np.array_equal(np.concatenate([c.query_ids for c in chunks]), np.arange(10) * 2)
    with pytest.raises(ValueError, match="query ids"):
        make_chunks(ep, np.arange(3), 0, 1, False, 1)


def test_sharded_siblings_have_the_law_of_the_plain_driver():
    """Mean sibling return from the same boundaries, plain driver (one shared rng) vs per-boundary streams.

    Returns lie in [0, 1] (tool_chain: one Bernoulli reward), so D = mean(X − Y) over n paired boundaries
    has P(|D| ≥ t) ≤ 2 exp(−n t² / 2) (Hoeffding, range 2); t is set for a false-failure rate of 1e-6.
    """
    base = TabularToolChain(num_turns=4, num_actions=3)()
    q = np.zeros(3000, np.int64)
    trunks = _trunks(base, q)
    snaps = [row[1].snapshot for row in trunks.boundaries if len(row) > 1]
    q = q[: len(snaps)]
    plain = rollout(base.env, base.sampler, base.env.restore(snaps), q, np.random.default_rng(1), n=1)
    env, sampler = local_sharded(base.env, base.sampler, chunk_size=64)  # 47 streams, not one
    sharded = rollout(env, sampler, env.restore(snaps), q, np.random.default_rng(2), n=1)
    x = np.array([t.ret for t in plain.trajectories])
    y = np.array([t.ret for t in sharded.trajectories])
    n = len(snaps)
    tol = np.sqrt(2 * np.log(2 / 1e-6) / n)
    assert n > 1000 and abs(x.mean() - y.mean()) < tol
    assert 0.05 < x.mean() < 0.95  # not a degenerate law where any two samplers agree


def test_rtpo_runs_unchanged_on_the_sharded_backend():
    base = TabularToolChain()()
    env, sampler = local_sharded(base.env, base.sampler)
    ctx = RunContext(env, sampler, base.learner, base.rng)
    cls = methods.get("rtpo")
    m = cls(cls.Config(G=3))
    state = m.begin(ctx, np.arange(4))
    turns = []
    while state.pending:
        met = m.phase(ctx, state)
        turns.append(met["phase/turn"])
        assert met["consistency/rollout_train_ratio"] == 1.0
    assert turns == [3.0, 2.0, 1.0, 0.0]
    assert not np.array_equal(base.learner.weights(), TabularToolChain()().learner.weights())


def test_driver_side_env_refuses_per_step_calls_with_a_clear_error():
    base = TabularToolChain()()
    env, _ = local_sharded(base.env, base.sampler)
    assert isinstance(env, ShardedEnv) and env.num_turns == 4
    with pytest.raises(TypeError, match="live on the workers"):
        env.contexts(env.reset(np.arange(2), np.random.default_rng(0)))
    with pytest.raises(TypeError, match="paired ShardedEnv"):
        local_sharded(base.env, base.sampler)[1].run_rollout(
            base.env, base.env.reset(np.arange(2), base.rng), np.arange(2), base.rng
        )


def test_resources_section_is_validated_key_by_key():
    r = Resources.from_dict(
        {"rollout_workers": 16, "gpus_per_rollout_worker": 1, "trainer_workers": 16, "gpus_per_trainer_worker": 1}
    )
    assert len(r.bundles()) == 32 and r.bundles()[0] == {"CPU": 1.0, "GPU": 1.0}
    assert r.trainer_backend == "nccl" and Resources().trainer_backend == "gloo"
    assert r.bundle_index("trainer", 3) == 19
    with pytest.raises(ValueError, match=r"resources\.rollout_wrokers: unknown key"):
        Resources.from_dict({"rollout_wrokers": 2})
    with pytest.raises(ValueError, match=r"resources\.trainer_workers: expected int"):
        Resources.from_dict({"trainer_workers": "2"})
    with pytest.raises(ValueError, match="placement_strategy"):
        Resources.from_dict({"placement_strategy": "pack"})
