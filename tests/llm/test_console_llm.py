"""The console of `rtpo run scenarios/llm/tiny-cpu-learn.yaml` holds rtpo's lines only, while it runs:
the run folder, one line per phase, the result.  vLLM's log lines (its per-weight-sync "Failed to load
weights" among them), tqdm bars of weight loading and torch's C++ warnings are in RUN/logs/."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from llm_test_constants import vllm_missing

ROOT = Path(__file__).resolve().parents[2]
RTPO_LINE = re.compile(
    r"^(run folder: \S+"
    r"|it \d+/\d+ phase \d+ \(turn \d+\)( value \S+)?( return \S+)? rollouts \d+ elapsed \S+s( eta \d+s)?"
    r"|final value \S+; \d+ rollouts, \S+ s)$"
)


@pytest.mark.slow  # real vLLM and the FSDP2 learner in a child process: ~60 s on 2 cores
@pytest.mark.skipif(vllm_missing, reason="vllm is not installed")
def test_tiny_cpu_learn_console_holds_rtpo_lines_only(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    env.pop("VLLM_CONFIGURE_LOGGING", None)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "rtpo",
            "run",
            str(ROOT / "scenarios/llm/tiny-cpu-learn.yaml"),
            "budget.iterations=1",
            "logging.progress=true",
            "--out",
            str(tmp_path / "out"),  # (runs/.models under cwd holds the tiny model)
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr == ""
    lines = r.stdout.splitlines()
    assert [line for line in lines if not RTPO_LINE.match(line)] == []
    assert sum(line.startswith("it 1/1 phase ") for line in lines) == 2  # K = 2 phases, one line each
    (run_dir,) = (tmp_path / "out").iterdir()
    logs = run_dir / "logs"
    assert "Failed to load weights" in (logs / "vllm.log").read_text()  # vLLM's lines are kept, in the folder
    assert "Loading safetensors checkpoint shards" in (logs / "stderr.log").read_text()
