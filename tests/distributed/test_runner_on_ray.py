"""`rtpo run` on Ray through the runner: a killed trainer is resumed from the runner's per-phase checkpoint
and the run ends exactly where the in-process run with the same per-boundary streams ends."""

import dataclasses

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the distributed extra (ray) is not installed")

import rtpo.rundir.runner  # noqa: E402
from rtpo.distributed import TrainerFailure, distribute  # noqa: E402
from rtpo.scenario.backends import get_backend  # noqa: E402
from rtpo.scenario.load import load_scenario  # noqa: E402

RESOURCES = {"rollout_workers": 1, "trainer_workers": 1, "cpus_per_worker": 0.5}


def _cfg():
    return load_scenario(
        None,
        [
            "budget.iterations=2",
            "budget.queries_per_iteration=6",
            "method.G=4",
            "logging.plot=false",
            "logging.progress=false",
        ],
    )


def _use(monkeypatch, mode, kill_at_sync=None, made=None):
    """Route the runner's backend through distribute(); optionally kill the trainer at the n-th sync."""
    spec = get_backend("tabular")

    def build(cfg):
        built = distribute(spec.build(cfg), cfg, mode, RESOURCES)
        if made is not None:
            made.append(built.ctx)
        if kill_at_sync is not None:
            ctx, sync, count = built.ctx, built.ctx.sync, [0]

            def killing_sync():
                count[0] += 1
                if count[0] == kill_at_sync:
                    ray.kill(ctx.learner.workers[0])
                sync()

            ctx.sync = killing_sync
        return built

    monkeypatch.setattr(rtpo.rundir.runner, "get_backend", lambda kind: dataclasses.replace(spec, build=build))
    monkeypatch.setattr(rtpo.rundir.runner, "build_backend", build)  # what the runner builds a run with


def test_run_with_a_killed_trainer_resumes_and_matches_the_unbroken_run(ray_cluster, monkeypatch, tmp_path):
    _use(monkeypatch, "sharded")
    want = rtpo.rundir.runner.run_scenario(_cfg(), out_root=tmp_path / "local", progress=False)

    made = []
    _use(monkeypatch, "ray", kill_at_sync=4, made=made)  # sync 4 = iteration 0, before phase 2
    with pytest.raises(TrainerFailure, match="resume the run"):
        rtpo.rundir.runner.run_scenario(_cfg(), out_root=tmp_path / "ray", progress=False)
    made[0].shutdown()
    (run_dir,) = (tmp_path / "ray").iterdir()
    assert len(rtpo.rundir.runner.read_metrics(run_dir)) == 2  # phases 0 and 1 were done and checkpointed

    _use(monkeypatch, "ray", made=made)
    got = rtpo.rundir.runner.run_scenario(None, resume=run_dir, progress=False)
    made[1].shutdown()

    assert got.summary["phases_done"] == want.summary["phases_done"] == 8
    assert got.summary["final_value"] == pytest.approx(want.summary["final_value"], rel=0, abs=1e-12)
    assert got.summary["rollouts"] == want.summary["rollouts"]
    for a, b in zip(want.metrics, got.metrics):
        assert a["return/mean"] == b["return/mean"] and a["eval/value"] == pytest.approx(b["eval/value"], abs=1e-12)
    assert np.isfinite(got.summary["final_value"])
