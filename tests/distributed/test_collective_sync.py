"""Weight sync over a collective (resources.weight_sync: collective): trainer rank 0 broadcasts to the
rollout workers over a gloo weight group (NCCL on GPUs, the same code).  The weights arrive bit-exact,
an RTPO iteration equals the single-process backend, and a worker dying before or during a sync
changes nothing (catch-up and fallback through the object store, the group re-formed)."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray", reason="the distributed extra (ray) is not installed")

from rtpo.distributed.collective import WeightGroupMember, buckets, spec_of  # noqa: E402
from rtpo.distributed.resources import Resources  # noqa: E402

from .test_ray_backend import _restart, iterate_like_reference, recorded_ray_ctx  # noqa: E402


def _weights():
    g = torch.Generator().manual_seed(0)
    return {
        "embed": torch.randn(37, 5, generator=g),
        "norm": torch.randn(5, generator=g).to(torch.bfloat16),
        "big": torch.randn(300, generator=g),  # larger than one bucket: a bucket of its own
        "steps": torch.arange(7, dtype=torch.int64),
        "table": np.random.default_rng(1).normal(size=(3, 4)),  # numpy leaves come back as numpy
    }


def test_buckets_cover_every_leaf_once_grouped_by_dtype():
    spec = spec_of(_weights())
    got = buckets(spec, bucket_bytes=256)
    flat = sorted(i for _, idx in got for i in idx)
    assert flat == list(range(len(spec.leaves)))
    for dtype, idx in got:
        assert {spec.leaves[i].dtype for i in idx} == {dtype}
    assert [idx for _, idx in got if 2 in idx] == [[2]]  # "big" (1200 bytes) alone
    with pytest.raises(TypeError, match="mapping of arrays or one array"):
        spec_of([1, 2])


def test_a_gloo_weight_group_delivers_bit_exact_weights():
    """Three members (threads here; actors in a run) of one gloo weight group, several buckets per dtype."""
    import datetime
    from concurrent.futures import ThreadPoolExecutor

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, 4, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
    w = _weights()

    def member(rank):
        m = WeightGroupMember()  # every rank a client of this store (in a run, rank 0 serves it)
        m.join("127.0.0.1", port, rank, 3, 0, "gloo", 30.0)
        try:
            return m.send(w, 256) if rank == 0 else m.receive(spec_of(w), 256)
        finally:
            m.leave()

    with ThreadPoolExecutor(3) as pool:
        sent, *received = pool.map(member, range(3))
    del store
    assert sent > 0
    for got in received:
        assert list(got) == list(w)
        for k, v in w.items():
            assert type(got[k]) is type(v)
            assert (
                np.array_equal(got[k], v)
                if isinstance(v, np.ndarray)
                else torch.equal(got[k], v) and got[k].dtype == v.dtype
            )


def test_collective_needs_a_trainer_group():
    with pytest.raises(ValueError, match="collective needs trainer_workers >= 1"):
        Resources(trainer_workers=0, weight_sync="collective")
    with pytest.raises(ValueError, match="weight_sync must be object_store or collective"):
        Resources(weight_sync="nccl")
    assert Resources(weight_sync="collective").weight_sync_backend == "gloo"
    assert Resources(gpus_per_trainer_worker=1, gpus_per_rollout_worker=1).weight_sync_backend == "nccl"


@pytest.fixture(scope="module")
def coll_ctx(ray_cluster):
    ctx = recorded_ray_ctx(max_restarts=2, weight_sync="collective", weight_bucket_mb=0.001)
    yield ctx
    ctx.shutdown()


def test_collective_sync_iteration_equals_the_single_process_backend(coll_ctx):
    _restart(coll_ctx)
    met = iterate_like_reference(coll_ctx)
    assert met["ray/weight_syncs"] == 5 and met["ray/weight_broadcast_s"] > 0
    assert "ray/weight_sync_fallbacks" not in met and met["ray/worker_failures"] == 0
    coll_ctx.sync()  # what the catch-up path would give a revived worker is exactly the learner's weights
    assert np.array_equal(coll_ctx.pool.current_weights(), coll_ctx.learner.weights())


def test_a_worker_dying_mid_phase_catches_up_and_the_group_reforms(coll_ctx):
    """Worker 0 exits at its 3rd chunk; its restart holds the factory's weights, catches up from the
    object store (rank 0's copy of the current version), and the next sync re-forms the group."""
    _restart(coll_ctx)
    forms0 = coll_ctx.weight_sync.epoch
    coll_ctx.pool.arm_fault(0, after_tasks=2)
    met = iterate_like_reference(coll_ctx)
    assert met["ray/worker_failures"] == 1 and coll_ctx.weight_sync.epoch == forms0 + 1
    assert "ray/weight_sync_fallbacks" not in met


def test_a_worker_dying_during_a_sync_falls_back_to_the_object_store(coll_ctx):
    """Kill worker 1 right before the 3rd sync: the broadcast fails, that version goes through the object
    store (the pool revives the worker), the group re-forms at the next sync, the results are unchanged."""
    _restart(coll_ctx)
    sync, count = coll_ctx.weight_sync.sync, [0]

    def killing_sync():
        count[0] += 1
        if count[0] == 3:
            w, old_pid = coll_ctx.pool.workers[1], coll_ctx.pool.pids[1]
            ray.kill(w, no_restart=False)
            # ray.kill is asynchronous: wait until Ray has restarted the actor in a new process, so the
            # broadcast below deterministically meets a member outside the group (not a race with the kill)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if ray.get(w.ping.remote(), timeout=5) != old_pid:
                        break
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                    pass
                time.sleep(0.05)
            else:
                raise AssertionError("the killed rollout worker did not restart within 60 s")
        sync()

    coll_ctx.weight_sync.sync = killing_sync
    try:
        met = iterate_like_reference(coll_ctx)
    finally:
        coll_ctx.weight_sync.sync = sync
    assert met["ray/weight_sync_fallbacks"] == 1
