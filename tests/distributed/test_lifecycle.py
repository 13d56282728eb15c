"""A Ray backend started by wrap_with_ray leaves no process behind after shutdown, and bad resources fail early."""

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the distributed extra (ray) is not installed")

from rtpo.distributed import wrap_with_ray  # noqa: E402
from rtpo.distributed.examples import TabularToolChain  # noqa: E402
from tests.distributed.conftest import ray_processes, wait_until_gone  # noqa: E402


def test_wrap_with_ray_owns_its_cluster_and_leaves_nothing_behind():
    assert not ray.is_initialized()
    ctx = wrap_with_ray(TabularToolChain(), {"rollout_workers": 1, "trainer_workers": 0, "cpus_per_worker": 1.0},
                        num_cpus=2)
    try:
        session = ray._private.worker._global_node.get_session_dir_path()
        running = ray_processes(session)
        # the check below can see this session's raylet and its actor process
        assert any("raylet" in p for p in running) and len(running) >= 3
        q = np.arange(3)
        res = ctx.sampler.run_rollout(ctx.env, ctx.env.reset(q, ctx.rng), q, ctx.rng)
        assert len(res.trajectories) == 3
    finally:
        ctx.shutdown()
    assert not ray.is_initialized()
    assert wait_until_gone(session) == []


def test_a_resources_section_the_cluster_cannot_hold_is_a_clear_error():
    with pytest.raises(RuntimeError, match="cannot place the resources section"):
        wrap_with_ray(TabularToolChain(), {"rollout_workers": 1, "gpus_per_rollout_worker": 1.0}, num_cpus=1,
                      placement_timeout_s=3.0)
    assert not ray.is_initialized()
