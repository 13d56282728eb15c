"""Trackers get the record metrics.jsonl gets: TensorBoard's event files, read back, hold the same
scalars under the same keys at the same steps, and the resolved scenario once."""

from __future__ import annotations

import json
import math
import sys

import pytest

from rtpo.rundir.checkpoint import read_metrics
from rtpo.rundir.runner import run_scenario
from rtpo.scenario.load import ConfigError, load_scenario


def test_tensorboard_holds_exactly_the_metrics_jsonl_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = load_scenario(None, ["budget.iterations=2", "logging.plot=false", "logging.trackers=[jsonl, tensorboard]"])
    res = run_scenario(cfg, out_root=tmp_path, progress=False)
    acc = EventAccumulator(str(res.run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    lines = read_metrics(res.run_dir)
    keys = {k for line in lines for k, v in line.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert set(acc.Tags()["scalars"]) == {k for k in keys if all(math.isfinite(line.get(k, 0.0)) for line in lines)}
    for key in ("eval/value", "consistency/rollout_train_ratio", "budget/rollouts", "loss/clipfrac"):
        events = acc.Scalars(key)
        expected = [(line["global_phase"], line[key]) for line in lines if key in line]
        assert [(e.step, pytest.approx(e.value, rel=1e-6)) for e in events] == expected
    assert "config" in acc.Tags()["tensors"] or acc.Tags().get("tensors")  # the scenario, once, as text


def test_unknown_tracker_is_one_line_with_a_suggestion():
    with pytest.raises(
        ConfigError, match=r"^logging\.trackers: unknown tracker 'tensorbord' \(did you mean 'tensorboard'\?\)"
    ):
        load_scenario(None, ["logging.trackers=tensorbord"])


def _scalars(line: dict) -> dict:
    return {
        k: v for k, v in line.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


SMALL = ["budget.iterations=3", "budget.queries_per_iteration=4", "logging.plot=false", "logging.keep_last=1"]


def test_wandb_offline_run_holds_the_metrics_jsonl_record_and_the_scenario_once(tmp_path):
    pytest.importorskip("wandb")
    from tests._wandb_offline import segments

    cfg = load_scenario(None, [*SMALL, "budget.iterations=2", "logging.trackers=[jsonl, wandb]"])
    res = run_scenario(cfg, out_root=tmp_path, progress=False)
    (seg,) = segments(res.run_dir)
    assert seg["run_id"] == res.run_dir.name
    lines = read_metrics(res.run_dir)
    assert sorted(seg["history"]) == [m["global_phase"] for m in lines]
    for m in lines:
        row = seg["history"][m["global_phase"]]
        got = {k: v for k, v in row.items() if not k.startswith("_")}  # W&B adds _step, _runtime, _timestamp
        assert got.keys() == _scalars(m).keys()  # the same names, no second set
        assert got == pytest.approx(_scalars(m), rel=1e-12)
    assert seg["config"] == json.loads(json.dumps(cfg.to_dict()))  # hyperparameters: the resolved scenario, once


def _crash_at_phase(monkeypatch, cfg, n: int):
    method = type(cfg.method.build())
    real, calls = method.phase, {"n": 0}

    def crashing(self, ctx, st):
        calls["n"] += 1
        if calls["n"] == n:
            raise RuntimeError("simulated crash")
        return real(self, ctx, st)

    monkeypatch.setattr(method, "phase", crashing)
    return lambda: monkeypatch.setattr(method, "phase", real)


def test_wandb_shows_each_phase_once_after_a_resume(tmp_path, monkeypatch):
    """The crashed process ran phases 5-6 past its checkpoint (after phase 4); W&B cannot take a logged step
    back, so those were never written to it.  The resumed segment continues the same run id from phase 5,
    without the config again, and the two segments hold each phase once, as metrics.jsonl holds them."""
    pytest.importorskip("wandb")
    from tests._wandb_offline import segments

    cfg = load_scenario(None, [*SMALL, "logging.checkpoint_every=4", "logging.trackers=[jsonl, wandb]"])
    restore = _crash_at_phase(monkeypatch, cfg, 7)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_scenario(cfg, out_root=tmp_path, progress=False)
    restore()
    (run_dir,) = tmp_path.iterdir()
    (first,) = segments(run_dir)
    assert sorted(first["history"]) == [1, 2, 3, 4]
    run_scenario(None, resume=run_dir, progress=False)
    first, second = segments(run_dir)
    assert first["run_id"] == second["run_id"] == run_dir.name
    assert second["config"] == {}  # hyperparameters once, by the first segment
    lines = read_metrics(run_dir)
    assert sorted(first["history"]) + sorted(second["history"]) == [m["global_phase"] for m in lines]
    merged = {**first["history"], **second["history"]}
    for m in lines:
        assert merged[m["global_phase"]]["budget/rollouts"] == m["budget/rollouts"]
        assert merged[m["global_phase"]]["eval/value"] == pytest.approx(m["eval/value"], rel=1e-12)


TRACKIO_CHILD = """
import json, sys
from pathlib import Path
from rtpo.rundir.checkpoint import read_metrics
from rtpo.scenario.load import load_scenario
from rtpo.rundir.runner import run_scenario
from trackio.sqlite_storage import SQLiteStorage

out = Path(sys.argv[1])
cfg = load_scenario(None, sys.argv[2:])
method = type(cfg.method.build())
real, calls = method.phase, {"n": 0}
def crashing(self, ctx, st):
    calls["n"] += 1
    if calls["n"] == 7:
        raise RuntimeError("simulated crash")
    return real(self, ctx, st)
method.phase = crashing
try:
    run_scenario(cfg, out_root=out, progress=False)
except RuntimeError:
    pass
method.phase = real
(run_dir,) = out.iterdir()
before = sorted(r["step"] for r in SQLiteStorage.get_logs("rtpo", run_dir.name))
run_scenario(None, resume=run_dir, progress=False)
logs = SQLiteStorage.get_logs("rtpo", run_dir.name)
print(json.dumps({
    "before": before,
    "logs": [{k: v for k, v in r.items() if k != "timestamp"} for r in logs],
    "config": SQLiteStorage.get_run_config("rtpo", run_dir.name),
    "metrics": read_metrics(run_dir),
    "scenario": cfg.to_dict(),
    "run": run_dir.name,
}))
"""


def test_trackio_local_store_holds_the_record_each_phase_once_after_a_resume(tmp_path):
    """In a child process, so that trackio's store (TRACKIO_DIR, read when trackio is imported) is this
    test's folder: a run crashes at phase 7 (checkpoint after phase 4) and is resumed; trackio's own
    reader then gives each phase once with the metrics.jsonl values, and the scenario as the run's config."""
    pytest.importorskip("trackio")
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACKIO_")}
    env.update(TRACKIO_DIR=str(tmp_path / "store"), PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    argv = [*SMALL, "logging.checkpoint_every=4", "logging.trackers=[jsonl, trackio]"]
    proc = subprocess.run(
        [sys.executable, "-c", TRACKIO_CHILD, str(tmp_path / "runs"), *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["before"] == [1, 2, 3, 4]  # the crashed process wrote only what its checkpoint covers
    lines = got["metrics"]
    assert [r["step"] for r in got["logs"]] == [m["global_phase"] for m in lines]
    for row, m in zip(got["logs"], lines):
        values = {k: v for k, v in row.items() if k != "step"}
        assert values == pytest.approx(_scalars(m), rel=1e-12)
    config = {k: v for k, v in (got["config"] or {}).items() if not k.startswith("_")}
    assert config == got["scenario"]  # the child sent it as JSON
    assert (tmp_path / "runs" / got["run"] / "logs" / "trackio.log").is_file()  # trackio's prints, not the console
    assert "Trackio" not in proc.stdout


def _flat_config(prefix: str, data, out: dict) -> dict:
    if isinstance(data, dict) and data:
        for k, v in data.items():
            _flat_config(f"{prefix}.{k}" if prefix else k, v, out)
    else:
        out[prefix] = data if isinstance(data, str) else json.dumps(data)
    return out


def test_mlflow_sqlite_store_holds_the_record_each_phase_once_and_the_scenario_once(tmp_path, monkeypatch):
    """A run crashes at phase 7 (checkpoint after phase 4) and is resumed; MLflow's own client, reading
    RUN/mlflow/mlflow.db, then has one run whose history of every metric is each phase once with the
    metrics.jsonl value, and the resolved scenario as its params (logged once, by the first process)."""
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    from mlflow.tracking import MlflowClient

    from rtpo.rundir.trackers import mlflow_key

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # ignored: the store is the run folder's
    cfg = load_scenario(None, [*SMALL, "logging.checkpoint_every=4", "logging.trackers=[jsonl, mlflow]"])
    restore = _crash_at_phase(monkeypatch, cfg, 7)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_scenario(cfg, out_root=tmp_path, progress=False)
    restore()
    (run_dir,) = tmp_path.iterdir()
    uri = f"sqlite:///{run_dir / 'mlflow' / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    exp = client.get_experiment_by_name("rtpo")
    (run,) = client.search_runs([exp.experiment_id])
    before = [m.step for m in client.get_metric_history(run.info.run_id, "budget/rollouts")]
    assert before == [1, 2, 3, 4]  # the crashed process wrote only what its checkpoint covers
    run_scenario(None, resume=run_dir, progress=False)
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_name == run_dir.name and run.data.tags["rtpo.run"] == run_dir.name
    assert run.info.status == "FINISHED"
    lines = read_metrics(run_dir)
    keys = {k for m in lines for k in _scalars(m)}
    assert set(run.data.metrics) == {mlflow_key(k) for k in keys}  # the same names
    for key in keys:
        history = client.get_metric_history(run.info.run_id, mlflow_key(key))
        expected = [(m["global_phase"], _scalars(m)[key]) for m in lines if key in _scalars(m)]
        assert sorted((h.step, h.value) for h in history) == [(s, pytest.approx(v, rel=1e-12)) for s, v in expected]
    assert run.data.params == _flat_config("", json.loads(json.dumps(cfg.to_dict())), {})


def test_mlflow_key_renames_only_what_mlflow_refuses():
    from rtpo.rundir.trackers import mlflow_key

    assert mlflow_key("eval/pass@1") == "eval/pass_at_1"
    for key in ("eval/value", "loss/clipfrac", "samples/turn_2", "time/phase_s", "gen/tokens_per_s", "a.b-c d:e"):
        assert mlflow_key(key) == key


@pytest.mark.parametrize(
    "tracker, module",
    [("wandb", "wandb"), ("trackio", "trackio"), ("tensorboard", "torch.utils.tensorboard"), ("mlflow", "mlflow")],
)
def test_a_missing_tracker_library_is_one_line_naming_the_extra(tmp_path, monkeypatch, capsys, tracker, module):
    from rtpo.commands.cli import main

    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    rc = main(
        [
            "run",
            "budget.iterations=1",
            "logging.plot=false",
            f"logging.trackers=[jsonl, {tracker}]",
            "--out",
            str(tmp_path),
            "--no-progress",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.count("\n") == 0
    assert f"pip install 'rtpo[{tracker}]'" in err


def test_trackio_refuses_to_upload(tmp_path, monkeypatch):
    pytest.importorskip("trackio")
    from rtpo.rundir.trackers import TrackerError

    monkeypatch.setenv("TRACKIO_SPACE_ID", "someone/space")
    cfg = load_scenario(None, ["budget.iterations=1", "logging.plot=false", "logging.trackers=[jsonl, trackio]"])
    with pytest.raises(TrackerError, match=r"trackio writes locally only; TRACKIO_SPACE_ID"):
        run_scenario(cfg, out_root=tmp_path, progress=False)


def test_a_tracker_added_on_resume_gets_the_whole_run(tmp_path):
    """`rtpo run --resume RUN budget.iterations=3 logging.trackers=[jsonl, tensorboard, wandb]` on a run that had
    none: each tracker first gets the earlier metrics.jsonl lines, then the new phases, each once."""
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests._wandb_offline import segments

    cfg = load_scenario(None, [*SMALL, "budget.iterations=2"])
    run_dir = run_scenario(cfg, out_root=tmp_path, progress=False).run_dir
    assert not (run_dir / "tensorboard").exists()
    run_scenario(
        None,
        resume=run_dir,
        progress=False,
        overrides=["budget.iterations=3", "logging.trackers=[jsonl, tensorboard, wandb]"],
    )
    lines = read_metrics(run_dir)
    steps = [m["global_phase"] for m in lines]
    assert steps == list(range(1, 13))
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [(e.step, pytest.approx(e.value, rel=1e-6)) for e in acc.Scalars("budget/rollouts")] == [
        (m["global_phase"], m["budget/rollouts"]) for m in lines
    ]
    (seg,) = segments(run_dir)
    assert sorted(seg["history"]) == steps
    assert seg["config"]["budget"]["iterations"] == 3  # the scenario as it now runs, once


_AUDIT = """
import json, os, socket, sys
log = open(os.environ["S27_CONNECT_LOG"], "a")
def local(addr):
    return isinstance(addr, (str, bytes)) or (isinstance(addr, tuple) and str(addr[0]) in ("127.0.0.1", "::1", "localhost"))
def hook(event, args):
    if event == "socket.connect" and not local(args[1]):
        log.write(json.dumps({"pid": os.getpid(), "addr": repr(args[1])}) + "\\n"); log.flush()
        raise OSError("s27: outbound connection refused by the test")
    if event == "socket.getaddrinfo" and str(args[0]) not in ("localhost", "127.0.0.1", "::1", "None"):
        log.write(json.dumps({"pid": os.getpid(), "lookup": repr(args[0])}) + "\\n"); log.flush()
sys.addaudithook(hook)
from rtpo.commands.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


def test_no_tracker_makes_any_outbound_connection_attempt(tmp_path):
    """'Every tracker writes locally only': a run with all five trackers, an HTTP(S) proxy in the
    environment (which every HTTP client, Python's or W&B's Go core, would use for a connection it makes)
    and an audit hook on socket.connect/getaddrinfo in the run's process.  The proxy is a listening socket
    of this test: any connection to it, and any non-local connect or name lookup the hook sees, fails the
    test naming it.  Before the fix W&B (offline) and MLflow reached for telemetry hosts."""
    import os
    import socket
    import subprocess
    import sys
    import threading

    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    pytest.importorskip("trackio")
    proxy = socket.socket()
    proxy.bind(("127.0.0.1", 0))
    proxy.listen(16)
    proxy.settimeout(0.2)
    hits: list[bytes] = []
    done = threading.Event()

    def serve():
        while not done.is_set():
            try:
                conn, _ = proxy.accept()
            except OSError:
                continue
            conn.settimeout(2)
            try:
                hits.append(conn.recv(200))
            except OSError:
                hits.append(b"(connected)")
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    url = f"http://127.0.0.1:{proxy.getsockname()[1]}"
    log = tmp_path / "connects.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_", "TRACKIO_", "HF_"))}
    env.update(
        {
            "HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url, "ALL_PROXY": url,
            "NO_PROXY": "", "no_proxy": "", "S27_CONNECT_LOG": str(log), "HOME": str(tmp_path / "home"),
            "TRACKIO_DIR": str(tmp_path / "trackio"), "PYTHONPATH": str(__import__("pathlib").Path(__file__).resolve().parents[1]),
        }
    )  # fmt: skip
    argv = [*SMALL, "budget.iterations=2", "logging.trackers=[jsonl, tensorboard, wandb, trackio, mlflow]"]
    try:
        r = subprocess.run(
            [sys.executable, "-c", _AUDIT, "run", *argv, "--out", str(tmp_path / "runs"), "--no-progress"],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
    finally:
        done.set()
        t.join(timeout=5)
        proxy.close()
    assert r.returncode == 0, r.stderr[-3000:]
    attempts = log.read_text().splitlines() if log.exists() else []
    assert attempts == [], f"outbound connection attempts from the run's process: {attempts[:5]}"
    assert hits == [], f"connections through the proxy (telemetry or update checks): {hits[:5]}"


@pytest.mark.parametrize("tracker", ["tensorboard", "mlflow", "wandb"])
def test_a_tracker_folder_that_cannot_be_made_is_exit_2_one_line(tracker, tmp_path, capsys):
    """A file where the tracker's folder goes (as a read-only or full disk would): exit 2 and one line
    naming the tracker and the path, instead of the library's traceback.  Fails before."""
    pytest.importorskip({"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}[tracker])
    from rtpo.commands.cli import main

    run = run_scenario(load_scenario(None, [*SMALL, "budget.iterations=1"]), out_root=tmp_path, progress=False).run_dir
    (run / tracker).write_text("in the way\n")
    rc = main(
        ["run", "--resume", str(run), "budget.iterations=2", f"logging.trackers=[jsonl, {tracker}]", "--no-progress"]
    )
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert f"logging.trackers: {tracker} cannot write its folder {run / tracker}" in err, err
