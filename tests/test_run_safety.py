"""Attack class "a real run never loses or corrupts what exists": a second writer, non-finite training
and a full disk.

- A run folder is written by one process at a time: RUN/.lock is an flock(2) the kernel drops with its
  holder, so a second `rtpo run --resume RUN` is refused in one line before it reads or touches anything,
  and a holder killed with SIGKILL leaves nothing that blocks.
- The first non-finite loss, gradient or value stops the run in one line naming it and the phase, exit
  1, with the last finite checkpoint kept as `latest` (resuming from it is exact).
- A full file system while writing a checkpoint or metrics is one line naming the file, exit 1; the
  previous checkpoint stays loadable and the resumed run equals one that never stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rtpo.commands.cli import main
from rtpo.core.estimators import ESTIMATORS, sibling_advantage
from rtpo.rundir.checkpoint import latest_name, latest_path, read_checkpoint, read_metrics
from rtpo.rundir.runner import RunWriteError, TrainingDiverged, run_scenario
from rtpo.scenario.load import load_scenario

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["budget.iterations=2", "budget.queries_per_iteration=4", "logging.plot=false"]


def _files(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def _steady(metrics: list[dict]) -> list[dict]:
    """The metric lines without wall-clock figures (what an exact resume must reproduce)."""
    return [{k: v for k, v in m.items() if not k.startswith("time/")} for m in metrics]


# -- one writer at a time ----------------------------------------------------------------------------
HOLD = "import sys, time\nfrom rtpo.rundir.checkpoint import lock_run\nlock_run(sys.argv[1])\nprint('held', flush=True)\ntime.sleep(600)\n"


def test_a_second_writer_is_refused_before_touching_anything_and_a_killed_one_never_blocks(tmp_path, capsys):
    """A live holder of RUN/.lock (another process, as a concurrent `rtpo run --resume` would be) makes
    `rtpo run --resume RUN` exit 2 with one line naming its pid, every file byte-identical; once the
    holder is SIGKILLed the same resume runs.  Mutant: drop the lock_run call in rtpo.run and the second
    writer goes ahead (before: one crashed with a traceback, or metrics.jsonl lost lines)."""
    run = run_scenario(load_scenario(None, SMALL), out_root=tmp_path, progress=False).run_dir
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        assert holder.stdout.readline().strip() == "held", "the lock-holding child did not start"
        before = _files(run)
        for extra in ([], ["budget.iterations=4"]):
            assert main(["run", "--resume", str(run), "--no-progress", *extra]) == 2
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1, err
            assert f"another rtpo process (pid {holder.pid}) is writing this run folder" in err, err
            assert _files(run) == before, "a refused second writer changed the run folder"
        # a fork (--iter N) writes a new folder and only reads this one: not refused
        assert main(["run", "--resume", str(run), "--iter", "1", "--out", str(tmp_path / "fork"), "--no-progress"]) == 0
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    capsys.readouterr()
    assert main(["run", "--resume", str(run), "budget.iterations=3", "--no-progress"]) == 0, capsys.readouterr().err
    assert len(read_metrics(run)) == 3 * 4 and latest_name(run) == "iter_3"


def test_two_writers_in_one_process_are_refused_too(tmp_path):
    """flock is per open file: a second lock of the same folder in the same process is refused as well
    (two threads of a notebook), and releasing the first lets the next one in."""
    from rtpo.rundir.checkpoint import RunLocked, lock_run

    first = lock_run(tmp_path)
    with pytest.raises(RunLocked, match=f"pid {os.getpid()}"):
        lock_run(tmp_path)
    first.release()
    with lock_run(tmp_path):
        pass


# -- non-finite training --------------------------------------------------------------------------------
def test_train_lr_1e308_stops_with_one_line_and_exit_1(tmp_path):
    """`train.lr=1e308` used to end with 'final value nan' and exit 0.  Now the first phase's NaN loss
    stops it: exit 1, one line naming the quantity and the phase, no metrics line and no checkpoint of
    the non-finite state.  Mutant: drop rtpo.run._check_finite and this exits 0."""
    r = subprocess.run(
        [sys.executable, "-m", "rtpo", "run", "train.lr=1e308", *SMALL, "--out", str(tmp_path), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "non-finite training: loss/" in r.stderr and "in phase 1 (iteration 0, phase 0 of it)" in r.stderr, r.stderr
    (run,) = tmp_path.iterdir()
    assert read_metrics(run) == [] and latest_name(run) is None


class _NanFrom:
    """sibling_mean until the n-th call, NaN advantages from then on (a reward that turned NaN)."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def __call__(self, returns):
        self.calls += 1
        adv = sibling_advantage(returns)
        return adv * np.nan if self.calls >= self.n else adv


def test_divergence_mid_run_keeps_the_last_finite_checkpoint_and_resumes_exactly(tmp_path):
    """NaN from the 7th phase on (default scenario, K = 4 phases an iteration): the run stops naming a
    loss key and phase 7; `latest` is the checkpoint after phase 6 with finite weights, metrics.jsonl
    holds exactly those 6 lines; resuming with the estimator healthy again gives, line for line, the run
    that never diverged."""
    overrides = [*SMALL, "budget.iterations=3", "method.estimator=s27_nan_from"]
    with ESTIMATORS.temporary():
        est = _NanFrom(7)
        ESTIMATORS.register("s27_nan_from")(est)
        cfg = load_scenario(None, overrides)
        with pytest.raises(TrainingDiverged) as e:
            run_scenario(cfg, out_root=tmp_path / "a", progress=False)
        msg = str(e.value)
        assert "\n" not in msg and "non-finite training: loss/" in msg and "in phase 7 " in msg, msg
        (run,) = (tmp_path / "a").iterdir()
        assert "ckpt/iter_1_phase_2 is the last finite state" in msg, msg
        assert latest_name(run) == "iter_1_phase_2" and len(read_metrics(run)) == 6
        state = read_checkpoint(latest_path(run), cfg)
        assert state["progress"]["global_phase"] == 6
        params = state["learner"]["params"]
        params = params.values() if isinstance(params, dict) else [params]
        assert all(np.isfinite(np.asarray(p, dtype=float)).all() for p in params), "non-finite weights kept"

        est.n = 10**9  # healthy from here on
        resumed = run_scenario(None, resume=run, progress=False)
        clean = run_scenario(cfg, out_root=tmp_path / "b", progress=False)
    assert _steady(resumed.metrics) == _steady(clean.metrics)


# -- disk full ------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _small_tmpfs(where: Path, size: str):
    """A real tmpfs of `size` mounted at `where` (root only); skips the test where mounting is refused."""
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode(errors='replace').strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_full_disk_is_one_line_and_the_run_resumes_exactly(tmp_path):
    """A run on a 96 kB tmpfs keeping every checkpoint fills it: `rtpo run` exits 1 with one line naming
    the file it could not write (before: 31 lines of traceback), the checkpoint `latest` names loads,
    and after the file system grows the resumed run's metrics equal a run that had room throughout.
    Mutant: drop the OSError clause around _run_loop and the traceback is back."""
    long = [*SMALL, "budget.iterations=40", "logging.keep_last=null"]
    reference = run_scenario(load_scenario(None, long), out_root=tmp_path / "ref", progress=False)
    with _small_tmpfs(tmp_path / "fs", "96k") as fs:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        cmd = [sys.executable, "-m", "rtpo", "run", *long, "--out", str(fs), "--no-progress"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
        assert r.returncode == 1, (r.returncode, r.stderr[-3000:])
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "No space left on device" in lines[0] and "the run stopped" in lines[0], lines
        (run,) = [p for p in fs.iterdir() if p.is_dir()]
        assert f"cannot write {run}/" in lines[0], lines[0]
        cfg = load_scenario(run / "config.yaml")
        state = read_checkpoint(latest_path(run), cfg)  # loadable
        assert 0 < state["progress"]["global_phase"] < 40 * 4, "the disk filled outside the run"
        subprocess.run(["mount", "-o", "remount,size=8m", str(fs)], check=True)
        r2 = subprocess.run(
            [sys.executable, "-m", "rtpo", "run", "--resume", str(run), "--no-progress"],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
        assert r2.returncode == 0, r2.stderr[-3000:]
        resumed = read_metrics(run)
    assert _steady(resumed) == _steady(reference.metrics), "the resumed run differs from one that had room"


def test_a_full_disk_while_appending_metrics_names_metrics_jsonl(tmp_path, monkeypatch):
    """The same on the metrics file itself, injected: the fsync after a metrics line fails with ENOSPC
    (as on a file system that allocates late); one RunWriteError line naming metrics.jsonl, and the
    checkpoint before it resumes exactly."""
    import errno

    import rtpo.rundir.runner as run_mod

    real_fsync, calls = os.fsync, {"n": 0}

    class _Metrics:
        def __init__(self, f):
            self.f = f

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return self.f.__exit__(*a)

        def flush(self):
            calls["n"] += 1
            if calls["n"] == 5:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self.f.flush()

    real_open = open

    def fake_open(path, mode="r", *a, **k):
        f = real_open(path, mode, *a, **k)
        return _Metrics(f) if str(path).endswith("metrics.jsonl") and mode == "a" else f

    monkeypatch.setattr(run_mod, "open", fake_open, raising=False)
    cfg = load_scenario(None, SMALL)
    with pytest.raises(RunWriteError) as e:
        run_scenario(cfg, out_root=tmp_path / "a", progress=False)
    (run,) = (tmp_path / "a").iterdir()
    assert str(e.value).startswith(f"{run}: cannot write {run / 'metrics.jsonl'} (No space left on device)")
    assert latest_name(run) == "iter_1"
    monkeypatch.undo()
    assert os.fsync is real_fsync
    resumed = run_scenario(None, resume=run, progress=False)
    clean = run_scenario(cfg, out_root=tmp_path / "b", progress=False)
    assert _steady(resumed.metrics) == _steady(clean.metrics)
    assert json.loads((run / "summary.json").read_text())["phases_done"] == 8
