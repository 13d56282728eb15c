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

from rtpo.rundir.checkpoint import read_metrics

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


def test_library_log_lines_go_to_the_run_folder_not_the_console(tmp_path, capfd, caplog):
    import logging
    import warnings

    from rtpo.rundir.logs import library_logs

    vllm = logging.getLogger("vllm")
    console = logging.StreamHandler(sys.stdout)
    vllm.addHandler(console)  # as vLLM's own logging config does
    try:
        with library_logs() as libs:
            logging.getLogger("vllm.model_executor").warning("Failed to load weights")  # before the folder exists
            libs.attach(tmp_path)
            logging.getLogger("vllm.engine").info("engine started")
            logging.getLogger("ray.worker").warning("ray says hi")
            logging.getLogger("transformers.modeling_utils").warning("transformers says hi")
            warnings.warn("a library warning", UserWarning, stacklevel=1)
        assert vllm.handlers == [console] and vllm.propagate  # put back as they were
    finally:
        vllm.removeHandler(console)
    out, err = capfd.readouterr()
    assert out == err == "" and caplog.records == []  # nothing reached the console or the root logger
    logs = tmp_path / "logs"
    vllm_log = (logs / "vllm.log").read_text().splitlines()
    assert [line.split(": ", 1)[1] for line in vllm_log] == ["Failed to load weights", "engine started"]
    assert " WARNING vllm.model_executor: " in vllm_log[0] and " INFO vllm.engine: " in vllm_log[1]
    assert "ray says hi" in (logs / "ray.log").read_text()
    assert "transformers says hi" in (logs / "transformers.log").read_text()
    assert "UserWarning: a library warning" in (logs / "warnings.log").read_text()


def test_verbose_leaves_the_libraries_on_the_console(caplog):
    import logging

    from rtpo.rundir.logs import library_logs

    with library_logs(verbose=True) as libs:
        assert libs.attach(Path("/nonexistent")) is None
        logging.getLogger("ray").warning("ray on the console")
    assert [r.getMessage() for r in caplog.records] == ["ray on the console"]  # reached the root handlers


def test_a_failed_build_shows_the_libraries_warnings(caplog):
    """No run folder was made (the backend could not be built): the libraries' own warnings about it
    are not hidden in a folder that does not exist."""
    import logging

    import pytest

    from rtpo.rundir.logs import library_logs

    with pytest.raises(RuntimeError, match="no engine"):
        with library_logs():
            logging.getLogger("vllm").info("an info line")
            logging.getLogger("vllm").warning("why the engine failed")
            raise RuntimeError("no engine")
    assert [r.getMessage() for r in caplog.records] == ["why the engine failed"]


def test_rtpo_own_warnings_stay_on_the_console(tmp_path, monkeypatch):
    """A safety notice rtpo raises as a warning (e.g. a sandbox without kernel isolation) is not hidden:
    it reaches the console's warning display, a library's goes to RUN/logs/warnings.log."""
    import warnings

    from rtpo.rundir.logs import library_logs

    shown = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, *a, **k: shown.append(str(message)))
    code = compile("import warnings; warnings.warn('RTPO NOTICE', UserWarning)", str(ROOT / "rtpo" / "x.py"), "exec")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        with library_logs() as libs:
            libs.attach(tmp_path)
            exec(code, {})
            warnings.warn("LIBRARY NOTICE", UserWarning, stacklevel=1)
    assert shown == ["RTPO NOTICE"]
    assert "LIBRARY NOTICE" in (tmp_path / "logs" / "warnings.log").read_text()


def test_what_libraries_write_to_stderr_themselves_goes_to_the_run_folder(tmp_path, capfd):
    """tqdm bars and C++ warnings write to fd 2 directly, also from child processes."""
    from rtpo.rundir.logs import console_stderr, library_logs

    with library_logs() as libs:
        print("before the folder", file=sys.stderr)
        libs.attach(tmp_path)
        print("Loading weights: 100%", file=sys.stderr)
        subprocess.run([sys.executable, "-c", "import os; os.write(2, b'[W utils.cpp] NUMA binding\\n')"], check=True)
        print("interrupt: rtpo's own notice", file=console_stderr(), flush=True)
    print("after the run", file=sys.stderr)
    err = capfd.readouterr().err
    assert err.splitlines() == ["interrupt: rtpo's own notice", "after the run"]
    assert (tmp_path / "logs" / "stderr.log").read_text().splitlines() == [
        "before the folder",
        "Loading weights: 100%",
        "[W utils.cpp] NUMA binding",
    ]


def test_a_failed_build_shows_what_the_libraries_wrote_to_stderr(capfd):
    import pytest

    from rtpo.rundir.logs import library_logs

    with pytest.raises(RuntimeError, match="no engine"):
        with library_logs():
            subprocess.run([sys.executable, "-c", "import os; os.write(2, b'engine: out of memory\\n')"], check=True)
            raise RuntimeError("no engine")
    assert "engine: out of memory" in capfd.readouterr().err
