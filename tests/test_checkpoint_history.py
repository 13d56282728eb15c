"""Checkpoint history (RUN/ckpt/iter_N, keep_last, the `latest` pointer), SIGKILL at every step of a
checkpoint write, `--iter N` for eval and resume, and resuming with a larger budget.

The kills are real SIGKILLs: a child process runs `rtpo run` with one function wrapped so that its n-th
call (matching a filter) kills the process — mid-phase, after a metric line but before its checkpoint,
inside the state file's atomic write, between the state file and the pointer, between the pointer and
pruning, and during pruning.  Each time `latest` must name a loadable checkpoint, and `--resume` must end
with the metrics, checkpoint folders and final policy of a run that was never killed: no metric line lost
or duplicated.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from rtpo.commands.cli import main
from rtpo.core.metrics import reproducible
from rtpo.rundir import checkpoint
from rtpo.rundir.checkpoint import CKPT_DIR, iterations_saved, latest_name, latest_path, read_checkpoint, read_metrics
from rtpo.rundir.runner import run_scenario
from rtpo.scenario.load import load_scenario

ROOT = Path(__file__).resolve().parents[1]
K = 4  # phases per RTPO iteration of the default scenario (task.num_turns)
SMALL = ["budget.iterations=3", "budget.queries_per_iteration=4", "logging.plot=false", "logging.keep_last=1"]


def _untimed(metrics: list[dict]) -> list[dict]:
    return [reproducible(m) for m in metrics]  # rtpo.core.metrics: the wall-clock keys left out


def _ckpt_names(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / CKPT_DIR).iterdir())


def _params(run_dir: Path) -> np.ndarray:
    return read_checkpoint(latest_path(run_dir))["learner"]["params"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Uninterrupted runs of the scenario the kill tests use, per checkpoint_every."""
    out = {}
    for every in (1, 3):
        cfg = load_scenario(None, [*SMALL, f"logging.checkpoint_every={every}"])
        out[every] = run_scenario(cfg, out_root=tmp_path_factory.mktemp(f"ref{every}"), progress=False)
    return out


def test_history_keeps_the_last_iterations_and_the_latest_pointer(tmp_path):
    cfg = load_scenario(None, [*SMALL, "budget.iterations=5", "logging.keep_last=2"])
    run_dir = run_scenario(cfg, out_root=tmp_path / "a", progress=False).run_dir
    assert _ckpt_names(run_dir) == ["iter_4", "iter_5", "latest"]  # mid-iteration ones pruned
    assert latest_name(run_dir) == "iter_5" and iterations_saved(run_dir) == [4, 5]
    metrics = read_metrics(run_dir)
    for n in (4, 5):
        prog = read_checkpoint(run_dir / CKPT_DIR / f"iter_{n}" / "state.ckpt", cfg)["progress"]
        assert (prog["iteration"], prog["it_state"], prog["metric_lines"]) == (n, None, n * K)
        assert metrics[prog["metric_lines"] - 1]["iteration"] == n - 1  # its last line ends iteration n
    everything = run_scenario(cfg.model_copy(update={"logging": cfg.logging.model_copy(update={"keep_last": None})}),
                              out_root=tmp_path / "b", progress=False).run_dir  # fmt: skip
    assert iterations_saved(everything) == [1, 2, 3, 4, 5]


_KILLER = textwrap.dedent(
    """
    import os, signal, sys
    import shutil
    from rtpo.rundir import checkpoint
    from rtpo.scenario.load import load_scenario

    where, attr, n, needle = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    owner = {"checkpoint": checkpoint, "os": os, "shutil": shutil, "method": type(load_scenario(None).method.build())}[where]
    real = getattr(owner, attr)
    calls = [0]

    def wrapped(*args, **kwargs):
        if needle in repr(args):
            calls[0] += 1
            if calls[0] == n:
                os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)

    setattr(owner, attr, wrapped)
    from rtpo.commands.cli import main

    sys.exit(main(sys.argv[5:]))
    """
)

# (owner, function, n-th matching call, filter on repr(args)): where the SIGKILL lands
KILL_POINTS = {
    "mid-phase": ("method", "phase", 7, ""),
    "metric line written, checkpoint not": ("checkpoint", "write_checkpoint", 6, ""),
    "inside the state file's write": ("os", "replace", 6, "state.ckpt"),
    "state written, pointer not moved": ("checkpoint", "atomic_write_text", 6, "latest"),
    "pointer moved, not pruned": ("checkpoint", "_prune", 6, ""),
    "during pruning": ("shutil", "rmtree", 5, "ckpt"),
}


@pytest.mark.slow  # 9 subprocess runs killed mid-checkpoint: 45 s together
@pytest.mark.parametrize(
    "point,every,n",
    [
        *((p, 1, KILL_POINTS[p][2]) for p in KILL_POINTS),
        ("metric line written, checkpoint not", 3, 3),  # phases 7-9 on disk, the checkpoint covers 6
        ("pointer moved, not pruned", 3, 3),
    ],
)
def test_sigkill_at_any_step_of_checkpointing_resumes_exactly(point, every, n, reference, tmp_path):
    where, attr, _, needle = KILL_POINTS[point]
    out = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    args = ["run", *SMALL, f"logging.checkpoint_every={every}", "--out", str(out), "--no-progress"]
    proc = subprocess.run(
        [sys.executable, "-c", _KILLER, where, attr, str(n), needle, *args],
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    (run_dir,) = out.iterdir()
    ref = reference[every]
    cfg = load_scenario(run_dir / "config.yaml")
    state = read_checkpoint(latest_path(run_dir), cfg)  # the pointer names a loadable checkpoint
    done = state["progress"]["metric_lines"]
    assert 0 < done < 3 * K
    before = read_metrics(run_dir)
    assert len(before) >= done  # what the checkpoint covers is on disk
    assert main(["run", "--resume", str(run_dir), "--no-progress"]) == 0
    after = read_metrics(run_dir)
    assert [m["global_phase"] for m in after] == list(range(1, 3 * K + 1))  # nothing lost, nothing twice
    assert after[:done] == before[:done]  # completed phases untouched
    assert _untimed(after) == _untimed(ref.metrics)
    assert _ckpt_names(run_dir) == _ckpt_names(ref.run_dir)  # no torn or stale folder left
    assert not list((run_dir / CKPT_DIR).rglob("*.tmp"))
    np.testing.assert_array_equal(_params(run_dir), _params(ref.run_dir))


def test_tensorboard_shows_each_phase_once_after_a_resume(tmp_path, monkeypatch):
    """The crashed process logged phases 5-6 past its checkpoint (after phase 4) to TensorBoard too; the
    resumed run logs them again.  Readers see each step once, with the resumed values (purge_step)."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = load_scenario(None, [*SMALL, "logging.checkpoint_every=4", "logging.trackers=[jsonl, tensorboard]"])
    method = type(cfg.method.build())
    real, calls = method.phase, {"n": 0}

    def crashing(self, ctx, st):
        calls["n"] += 1
        if calls["n"] == 7:
            raise RuntimeError("simulated crash")
        return real(self, ctx, st)

    monkeypatch.setattr(method, "phase", crashing)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_scenario(cfg, out_root=tmp_path, progress=False)
    monkeypatch.setattr(method, "phase", real)
    (run_dir,) = tmp_path.iterdir()
    assert read_checkpoint(latest_path(run_dir))["progress"]["metric_lines"] == 4
    run_scenario(None, resume=run_dir, progress=False)
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    lines = read_metrics(run_dir)
    for key in ("budget/rollouts", "adv/zero_rate", "global_phase"):
        steps = [(e.step, e.value) for e in acc.Scalars(key)]
        assert steps == [(m["global_phase"], pytest.approx(m[key], rel=1e-6)) for m in lines]


def test_eval_and_resume_from_a_given_iteration(tmp_path, capsys):
    cfg = load_scenario(None, [*SMALL, "budget.iterations=4", "logging.keep_last=null"])
    run_dir = run_scenario(cfg, out_root=tmp_path / "runs", progress=False).run_dir
    metrics = read_metrics(run_dir)
    files = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    # eval --iter 2: the policy after iteration 2, whose exact value the run logged after phase 2K
    assert main(["eval", str(run_dir), "--iter", "2", "--samples", "2", "--queries", "8"]) == 0
    report = json.loads((run_dir / "eval-iter_2.json").read_text())
    assert report["target"]["checkpoint"]["iteration"] == 2
    assert report["exact"]["eval/value"] == pytest.approx(metrics[2 * K - 1]["eval/value"], abs=1e-12)
    assert report["exact"]["eval/value"] != pytest.approx(metrics[-1]["eval/value"], abs=1e-6)
    # resume --iter 1 forks a new run folder; the original is untouched byte for byte
    capsys.readouterr()
    assert main(["run", "--resume", str(run_dir), "--iter", "1", "--out", str(tmp_path / "fork"), "--no-progress"]) == 0
    (fork,) = (tmp_path / "fork").iterdir()
    assert fork.name == f"{run_dir.name}-from-iter_1"
    assert _untimed(read_metrics(fork)) == _untimed(metrics)  # it goes on exactly as the original went on
    np.testing.assert_array_equal(_params(fork), _params(run_dir))
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != "eval-iter_2.json"} == {
        p: b for p, b in files.items()
    }
    # a missing iteration is one line naming the ones that are there
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--iter", "9"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "saved iterations: 1, 2, 3, 4" in err, err


def test_resume_with_a_larger_budget_equals_one_longer_run(tmp_path):
    short = run_scenario(load_scenario(None, [*SMALL, "budget.iterations=2"]), out_root=tmp_path / "s", progress=False)
    assert short.summary["stopped_by"] == "iterations"
    assert main(["run", "--resume", str(short.run_dir), "budget.iterations=4", "--no-progress"]) == 0
    long = run_scenario(load_scenario(None, [*SMALL, "budget.iterations=4"]), out_root=tmp_path / "l", progress=False)
    extended = read_metrics(short.run_dir)
    assert [m["global_phase"] for m in extended] == list(range(1, 4 * K + 1))
    assert _untimed(extended) == _untimed(long.metrics)
    np.testing.assert_array_equal(_params(short.run_dir), _params(long.run_dir))
    assert load_scenario(short.run_dir / "config.yaml").budget.iterations == 4  # the run records its budget
    assert json.loads((short.run_dir / "summary.json").read_text())["iterations_done"] == 4


def test_resume_with_a_larger_rollout_cap_equals_one_longer_run(tmp_path):
    base = [*SMALL, "budget.iterations=5"]
    full = run_scenario(load_scenario(None, base), out_root=tmp_path / "f", progress=False)
    cap = full.metrics[2 * K - 1]["budget/rollouts"]  # spent by the end of iteration 2 (checked at boundaries)
    capped = run_scenario(
        load_scenario(None, [*base, f"budget.max_rollouts={cap}"]), out_root=tmp_path / "c", progress=False
    )
    assert capped.summary["stopped_by"] == "max_rollouts" and len(capped.metrics) == 2 * K
    assert main(["run", "--resume", str(capped.run_dir), "budget.max_rollouts=null", "--no-progress"]) == 0
    assert _untimed(read_metrics(capped.run_dir)) == _untimed(full.metrics)
    np.testing.assert_array_equal(_params(capped.run_dir), _params(full.run_dir))


@pytest.mark.parametrize(
    "extra,match",
    [
        (["method.G=3"], "only budget.* and logging.* settings may change on resume"),
        (["seed=4"], "only budget.* and logging.* settings may change on resume"),
        (["budget.iterations=0"], "budget.iterations"),
        (["--iter", "7"], "saved iterations: 3;"),
    ],
)
def test_resume_overrides_that_would_make_another_run_are_one_line(tmp_path, capsys, extra, match):
    run_dir = run_scenario(load_scenario(None, SMALL), out_root=tmp_path, progress=False).run_dir
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(["run", "--resume", str(run_dir), *extra, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err, err
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


def test_a_corrupt_latest_pointer_is_refused_and_a_pre_history_run_still_resumes(tmp_path, capsys):
    cfg = load_scenario(None, SMALL)
    run_dir = run_scenario(cfg, out_root=tmp_path, progress=False).run_dir
    (run_dir / CKPT_DIR / "latest").write_text("../../etc\n")
    capsys.readouterr()
    assert main(["run", "--resume", str(run_dir), "--no-progress"]) == 2
    assert "corrupt checkpoint pointer" in capsys.readouterr().err
    # a run folder of the old layout: one checkpoint.pkl beside config.yaml
    (run_dir / CKPT_DIR / "latest").write_text("iter_3\n")
    old = run_dir / checkpoint.CHECKPOINT
    (run_dir / CKPT_DIR / "iter_3" / "state.ckpt").replace(old)
    for p in sorted((run_dir / CKPT_DIR).rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    (run_dir / CKPT_DIR).rmdir()
    assert latest_path(run_dir) == old
    assert main(["run", "--resume", str(run_dir), "budget.iterations=4", "--no-progress"]) == 0
    assert latest_name(run_dir) == "iter_4" and len(read_metrics(run_dir)) == 4 * K
