"""The issue-29 trainer options on the Ray path: a run with a warm-up + cosine LR schedule, a non-default
loss aggregation, the low_var_kl estimator under the adaptive KL controller and an entropy bonus, on a
real local Ray cluster (a rollout actor and a trainer actor), logs exactly the metrics of the in-process
run with the same per-boundary streams (`backend.distributed: sharded`, the reference every Ray run must
equal, tests/distributed/test_ray_backend.py).

The schedule lives in the trainer actor's learner (built there from `train.*`), the loss options travel in
each train step's LossConfig, the adaptive β lives in the driver's method: a run where any of them does
not reach the trainer trains other weights and logs another `train/lr`, `loss/kl_ref`, `loss/entropy` or
`loss/kl_coef`.

Mutant: RayLearner.train_step sending `dataclasses.replace(loss, entropy_coef=0.0)` (or dropping
kl_estimator / aggregation the same way), or the trainer factory building its learner without
`lr_schedule`, turns test_issue29_options_on_ray_equal_the_in_process_run red.
"""

import dataclasses

import pytest

ray = pytest.importorskip("ray", reason="the distributed extra (ray) is not installed")

import rtpo.rundir.runner  # noqa: E402
from rtpo.distributed import distribute  # noqa: E402
from rtpo.scenario.backends import get_backend  # noqa: E402
from rtpo.scenario.load import load_scenario  # noqa: E402

pytestmark = pytest.mark.slow  # a Ray cluster and two 2-iteration runs: ~45 s on 2 cores under load

RESOURCES = {"rollout_workers": 1, "trainer_workers": 1, "cpus_per_worker": 0.5}
OPTIONS = [
    "train.lr_schedule=cosine",
    "train.warmup_steps=2",
    "train.decay_steps=6",
    "train.min_lr_ratio=0.1",
    "method.loss_aggregation=seq-mean-token-sum",
    "method.kl_coef=0.05",
    "method.kl_estimator=low_var_kl",
    "method.kl_target=0.001",
    "method.kl_horizon=50",
    "method.entropy_coef=0.01",
]


def _cfg():
    return load_scenario(
        None,
        [
            "budget.iterations=2",
            "budget.queries_per_iteration=6",
            "method.G=4",
            "logging.plot=false",
            "logging.progress=false",
            *OPTIONS,
        ],
    )


def _use(monkeypatch, mode, made):
    spec = get_backend("tabular")

    def build(cfg):
        built = distribute(spec.build(cfg), cfg, mode, RESOURCES)
        made.append(built.ctx)
        return built

    monkeypatch.setattr(rtpo.rundir.runner, "get_backend", lambda kind: dataclasses.replace(spec, build=build))
    monkeypatch.setattr(rtpo.rundir.runner, "build_backend", build)


def test_issue29_options_on_ray_equal_the_in_process_run(ray_cluster, monkeypatch, tmp_path):
    made: list = []
    _use(monkeypatch, "sharded", made)
    want = rtpo.rundir.runner.run_scenario(_cfg(), out_root=tmp_path / "local", progress=False)
    _use(monkeypatch, "ray", made)
    try:
        got = rtpo.rundir.runner.run_scenario(_cfg(), out_root=tmp_path / "ray", progress=False)
    finally:
        getattr(made[-1], "shutdown", lambda: None)()
    assert hasattr(made[-1], "pool"), "the second run did not run on Ray"

    # the options were in force (else the comparison below would not test their transmission)
    lrs = [m["train/lr"] for m in want.metrics if "train/lr" in m]
    assert len(set(lrs)) > 2 and max(lrs) <= _cfg().train.lr, f"no warm-up/decay in train/lr: {lrs}"
    assert any(m.get("loss/kl_ref", 0) > 0 for m in want.metrics), "no KL term was computed"
    assert any(m.get("loss/entropy", 0) > 0 for m in want.metrics), "no entropy bonus was computed"
    betas = [m["loss/kl_coef"] for m in want.metrics if "loss/kl_coef" in m]
    assert betas and betas[-1] != 0.05, f"the adaptive controller never moved β: {betas}"

    assert len(got.metrics) == len(want.metrics) > 0
    keys = ("train/lr", "loss/", "return/", "eval/value", "train/grad_norm")
    for i, (a, b) in enumerate(zip(want.metrics, got.metrics)):
        mine = {k for k in a if k.startswith(keys)}
        assert mine == {k for k in b if k.startswith(keys)}, f"phase {i}: other metric keys on Ray"
        for k in sorted(mine):
            assert b[k] == pytest.approx(a[k], rel=0, abs=1e-12), f"phase {i}: {k} {b[k]} on Ray, {a[k]} in process"
    assert got.summary["final_value"] == pytest.approx(want.summary["final_value"], rel=0, abs=1e-12)
