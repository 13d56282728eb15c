"""The console of `rtpo run`: the run folder first, one line per phase when stdout is not a terminal
(seen while the run goes on, not at its end), and Ctrl-C stopping at a phase boundary with the exact
resume command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rtpo.checkpoint import read_metrics

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def test_redirected_stdout_gets_one_line_per_phase_while_the_run_goes_on(tmp_path):
    log = tmp_path / "out.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rtpo",
                "run",
                "budget.iterations=40",
                "logging.plot=false",
                "--out",
                str(tmp_path / "r"),
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=ENV,
        )
        try:
            deadline = time.monotonic() + 180
            lines = []
            while time.monotonic() < deadline and proc.poll() is None:
                lines = log.read_text().splitlines()
                if len(lines) >= 3:
                    break
                time.sleep(0.05)
            assert proc.poll() is None, "the run ended before its lines could be seen"  # lines came mid-run
        finally:
            proc.kill()
            proc.wait()
    assert lines[0].startswith("run folder: ")
    assert lines[1].startswith("it 1/40 phase 0 (turn 3) value/opt ") and " eta " in lines[1]


@pytest.mark.slow  # a subprocess training interrupted by SIGINT: 48-100 s
def test_ctrl_c_stops_at_a_phase_boundary_and_prints_the_resume_command(tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rtpo",
            "run",
            "budget.iterations=200",
            "logging.plot=false",
            "--out",
            str(tmp_path / "r"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
        text=True,
    )
    try:
        first = proc.stdout.readline()
        assert first.startswith("run folder: ")
        run_dir = Path(first.split(": ", 1)[1].strip())
        proc.stdout.readline()  # a phase has run
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err
    assert f"resume with: rtpo run --resume {run_dir}" in err
    done = read_metrics(run_dir)
    assert 0 < len(done) < 200 * 4
    # the checkpoint holds exactly the phases in metrics.jsonl: resuming continues where it stopped
    r = subprocess.run(
        [sys.executable, "-m", "rtpo", "run", "--resume", str(run_dir), "--no-progress"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    after = read_metrics(run_dir)
    assert [m["global_phase"] for m in after] == list(range(1, 200 * 4 + 1)) and after[: len(done)] == done
