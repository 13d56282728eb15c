"""Experiment trackers: every sink is fed the one metrics record that feeds metrics.jsonl.

`logging.trackers: [jsonl, tensorboard, wandb, trackio, mlflow]` names registered trackers.  `jsonl` is the run
folder's own metrics.jsonl (always written: resume and `rtpo eval` read it); every other tracker receives
exactly the same record per phase, under the same keys (grouped by prefix: `eval/value`, `loss/clipfrac`,
...), and the resolved scenario once as hyperparameters.  A tracker is a class with
`open(run_dir, config, first_step)`, `log(record, step)`, `commit(step)` and `close()`, registered by name;
its package is an optional extra imported lazily, and a missing one is a one-line error naming the extra.
Every tracker writes locally only (nothing reaches the network):

- `tensorboard`: event files under RUN/tensorboard/ (the `tensorboard` extra).
- `wandb`: a W&B run in offline mode under RUN/wandb/ (the `wandb` extra); `wandb sync RUN/wandb/offline-run-*`
  uploads it later, the segments of a resumed run under one run id.
- `trackio`: trackio's local SQLite store (its own `TRACKIO_DIR`, by default HF_HOME/trackio; the `trackio`
  extra), project `rtpo`, one trackio run per run folder; `trackio show --project rtpo` opens it.
  A `TRACKIO_SPACE_ID` or `TRACKIO_SERVER_URL` in the environment is refused (it would upload).
- `mlflow`: an MLflow run in a local SQLite store, RUN/mlflow/mlflow.db (MLflow's recommended backend since
  3.7; artifacts under RUN/mlflow/artifacts; the `mlflow` extra: mlflow-skinny plus SQLAlchemy and alembic),
  experiment `rtpo`, one MLflow run per run folder (tag `rtpo.run`); `mlflow ui --backend-store-uri
  sqlite:///RUN/mlflow/mlflow.db` opens it.  `MLFLOW_TRACKING_URI` is ignored: it writes locally only.
  MLflow refuses some characters in metric names (`@`): `eval/pass@1` is `eval/pass_at_1` there
  (`mlflow_key`), the only renaming.

No phase twice after a resume.  A resumed run opens its trackers with `first_step` = the first phase after
its checkpoint; what the killed process gave a tracker for that step and later ones is replaced.
TensorBoard does it with `purge_step`.  The others cannot take back what they logged, so they are
written only up to the latest checkpoint: `log` keeps the record, `commit(step)` (called after each
checkpoint) writes the kept records up to `step`, and `close` drops the rest (the resumed run logs those
phases again).  A resumed run does not log the hyperparameters again.  A tracker that holds nothing of
the run yet (added on resume with `logging.trackers=...`, or in a `--resume --iter N` fork) first gets the
metrics.jsonl lines before `first_step`, so it shows the whole run.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rtpo.core.registry import Registry


class Tracker:
    """Base of a tracker: override what it needs.  `fresh` (set by `open`): the tracker holds nothing of
    this run yet, so a run that starts it after phase 1 (a resume that adds it, a `--resume --iter N` fork)
    gives it the earlier metrics.jsonl lines first."""

    fresh = False

    def open(self, run_dir: Path, config: dict[str, Any], first_step: int = 1) -> None:  # noqa: B027
        pass

    def log(self, record: dict[str, Any], step: int) -> None:  # noqa: B027 - optional hook
        pass

    def commit(self, step: int) -> None:  # noqa: B027 - optional hook
        """Phases up to `step` are covered by a checkpoint (a resume will not run them again)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


TRACKERS: Registry[type[Tracker]] = Registry("tracker")


@TRACKERS.register("jsonl")
class JsonlTracker(Tracker):
    """metrics.jsonl itself: written by the runner for every run (it is what resume reads)."""


def _flat(prefix: str, data: Any, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(data, dict):
        for k, v in data.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = data if isinstance(data, (int, float, str, bool)) else json.dumps(data, default=str)
    return out


@TRACKERS.register("tensorboard")
class TensorBoardTracker(Tracker):
    """Scalars per phase (step = global phase) and the resolved scenario once (text + hparams)."""

    def open(self, run_dir: Path, config: dict[str, Any], first_step: int = 1) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise _missing("tensorboard", "tensorboard") from e
        import yaml

        # purge_step: readers discard events at steps >= first_step written before this point (a killed
        # process logged phases its checkpoint does not cover; the resumed run logs them again)
        self.fresh = not (Path(run_dir) / "tensorboard").exists()
        resumed = first_step > 1 and not self.fresh
        self.writer = SummaryWriter(
            log_dir=str(Path(run_dir) / "tensorboard"), purge_step=first_step if resumed else None
        )
        if resumed:
            return  # the scenario went in once, when the run started
        self.writer.add_text("config", "```yaml\n" + yaml.safe_dump(config, sort_keys=False) + "```", 0)
        hparams = {k: v for k, v in _flat("", config, {}).items() if isinstance(v, (int, float, str, bool))}
        self.writer.add_hparams(hparams, {}, run_name=".")

    def log(self, record: dict[str, Any], step: int) -> None:
        for key, value in _scalars(record).items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class TrackerError(RuntimeError):
    """A tracker that cannot be set up (missing package, a setting that would upload): the run refuses
    before its first phase (`rtpo run` prints it in one line, exit 2)."""


def _missing(tracker: str, module: str) -> TrackerError:
    return TrackerError(
        f"logging.trackers: {tracker} needs the {tracker} extra (pip install 'rtpo[{tracker}]'); "
        f"{module} is not installed"
    )


def _scalars(record: dict[str, Any]) -> dict[str, float | int]:
    """The record's finite numbers (what a scalar tracker shows), keys unchanged."""
    return {
        k: v for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


class CommittedTracker(Tracker):
    """A sink that cannot take back what it was given: it is written only up to the latest checkpoint."""

    def open(self, run_dir: Path, config: dict[str, Any], first_step: int = 1) -> None:
        self._pending: list[tuple[int, dict[str, Any]]] = []

    def log(self, record: dict[str, Any], step: int) -> None:
        self._pending.append((step, record))

    def commit(self, step: int) -> None:
        ready = [(s, r) for s, r in self._pending if s <= step]
        self._pending = [(s, r) for s, r in self._pending if s > step]
        for s, r in ready:
            self._write(r, s)

    def _write(self, record: dict[str, Any], step: int) -> None:
        raise NotImplementedError


def _run_id(run_dir: Path) -> str:
    """A tracker run id from the run folder's name: the same for every process of the run."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", Path(run_dir).name)
    if len(name) > 64:
        name = name[:55] + "-" + hashlib.sha1(name.encode()).hexdigest()[:8]
    return name


@TRACKERS.register("wandb")
class WandbTracker(CommittedTracker):
    """A W&B run in offline mode under RUN/wandb/ (step = global phase); the scenario once as its config.

    Each process of a run writes one offline segment (RUN/wandb/offline-run-*-<id>), all under the run
    id taken from the run folder's name; a resumed segment continues the run (`resume="allow"`) and
    carries no config.  `WANDB_MODE` and a login are ignored: the mode is always offline."""

    def open(self, run_dir: Path, config: dict[str, Any], first_step: int = 1) -> None:
        super().open(run_dir, config, first_step)
        try:
            import wandb
        except ImportError as e:
            raise _missing("wandb", "wandb") from e
        root = Path(run_dir)
        run_id = _run_id(root)
        resumed = first_step > 1 and any((root / "wandb").glob(f"offline-run-*-{run_id}"))
        self.fresh = not resumed
        self.run = wandb.init(
            mode="offline",
            dir=str(root),
            project=os.environ.get("WANDB_PROJECT") or "rtpo",
            id=run_id,
            name=root.name,
            group=str(config.get("name", "")) or None,
            job_type=str(config.get("method", {}).get("name", "")) or None,
            config=None if resumed else config,
            resume="allow",
            reinit="create_new",
            settings=wandb.Settings(
                silent=True,
                console="off",
                x_disable_stats=True,
                x_disable_viewer=True,  # no query of who is logged in
            ),
        )

    def _write(self, record: dict[str, Any], step: int) -> None:
        self.run.log(_scalars(record), step=step)

    def close(self) -> None:
        import wandb

        self.run.finish()
        wandb.teardown()  # the next run of this process (rtpo compare, tests) gets a fresh W&B service


@TRACKERS.register("trackio")
class TrackioTracker(CommittedTracker):
    """A trackio run in trackio's local store (project `rtpo`, run = the run folder's name); the scenario
    as its config (trackio keeps one config row per run, which a resumed process replaces by the same one).
    trackio's own console lines go to RUN/logs/trackio.log."""

    def open(self, run_dir: Path, config: dict[str, Any], first_step: int = 1) -> None:
        super().open(run_dir, config, first_step)
        remote = [k for k in ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL") if os.environ.get(k)]
        if remote:
            raise TrackerError(
                f"logging.trackers: trackio writes locally only; {' and '.join(remote)} in the environment "
                "would send the metrics away (unset it)"
            )
        try:
            import trackio
        except ImportError as e:
            raise _missing("trackio", "trackio") from e
        from trackio.sqlite_storage import SQLiteStorage

        self.fresh = SQLiteStorage.get_last_step("rtpo", _run_id(Path(run_dir))) is None
        self._log_path = Path(run_dir) / "logs" / "trackio.log"
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        with self._quiet():
            self.run = trackio.init(
                project="rtpo",
                name=_run_id(Path(run_dir)),
                group=str(config.get("name", "")) or None,
                config=config,  # one row per run in trackio's store: a resume replaces it with the same
                resume="allow",
                embed=False,
                auto_log_cpu=False,
                auto_log_gpu=False,
            )

    def _quiet(self):
        import contextlib

        stack = contextlib.ExitStack()
        f = stack.enter_context(open(self._log_path, "a"))
        stack.enter_context(contextlib.redirect_stdout(f))
        return stack

    def _write(self, record: dict[str, Any], step: int) -> None:
        self.run.log(_scalars(record), step=step)

    def close(self) -> None:
        from trackio import context_vars

        with self._quiet():
            self.run.finish()
        if context_vars.current_run.get() is self.run:  # else trackio finishes it again at exit (and prints)
            context_vars.current_run.set(None)


def mlflow_key(key: str) -> str:
    """A metric name as MLflow accepts it (alphanumerics, `_ - . / : ` and space): `@` becomes `_at_`
    (`eval/pass@1` -> `eval/pass_at_1`), any other refused character `_`; every other key is unchanged."""
    return re.sub(r"[^/\w.\- :]", "_", key.replace("@", "_at_"))


@TRACKERS.register("mlflow")
class MlflowTracker(CommittedTracker):
    """An MLflow run in RUN/mlflow/mlflow.db (SQLite), experiment `rtpo`, run name = the run folder's name;
    metrics per phase (step = global phase, names through `mlflow_key`), the resolved scenario once as
    params (flattened dotted keys; lists and dicts as JSON).  A resumed process finds its run by the tag
    `rtpo.run`, sets it running again and logs no params."""

    EXPERIMENT = "rtpo"

    def open(self, run_dir: Path, config: dict[str, Any], first_step: int = 1) -> None:
        super().open(run_dir, config, first_step)
        try:
            import mlflow  # noqa: F401 - the package first (its submodules may be loaded already)
            from mlflow.entities import Param, RunTag
            from mlflow.tracking import MlflowClient
        except ImportError as e:
            raise _missing("mlflow", "mlflow") from e
        try:
            import alembic  # noqa: F401 - the SQL store's migrations
            import sqlalchemy  # noqa: F401
        except ImportError as e:
            raise _missing("mlflow", e.name or "sqlalchemy") from e
        root = Path(run_dir) / "mlflow"
        root.mkdir(parents=True, exist_ok=True)
        # an explicit client: MLFLOW_TRACKING_URI / a registry URI in the environment cannot send it away
        uri = f"sqlite:///{root.resolve() / 'mlflow.db'}"
        self.client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        exp = self.client.get_experiment_by_name(self.EXPERIMENT)
        exp_id = (
            exp.experiment_id
            if exp is not None
            else self.client.create_experiment(
                self.EXPERIMENT, artifact_location=(root / "artifacts").resolve().as_uri()
            )
        )
        name = _run_id(Path(run_dir))
        found = self.client.search_runs([exp_id], filter_string=f"tags.`rtpo.run` = '{name}'", max_results=1)
        self.fresh = not found
        if found:
            self.run_id = found[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            return  # the params went in once, when the run started
        tags = {"rtpo.run": name, "rtpo.scenario": str(config.get("name", ""))}
        method = str(config.get("method", {}).get("name", ""))
        if method:
            tags["rtpo.method"] = method
        self.run_id = self.client.create_run(exp_id, run_name=name, tags=tags).info.run_id
        params = [Param(k, _param_value(v)) for k, v in _flat("", config, {}).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per request
            self.client.log_batch(self.run_id, params=params[i : i + 100])
        self.client.log_batch(self.run_id, tags=[RunTag("mlflow.note.content", _CONFIG_NOTE)])

    def _write(self, record: dict[str, Any], step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(mlflow_key(k), float(v), now, step) for k, v in _scalars(record).items()]
        for i in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics per request
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id, status="FINISHED")


_CONFIG_NOTE = "rtpo run: the params are the resolved scenario (RUN/config.yaml), flattened to dotted keys."


def _param_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 6000 else text[:5980] + "...[truncated]"  # MLflow's limit per param value


# Every telemetry channel of the tracker libraries, off: W&B's error reporting (an OpenTelemetry proxy that
# POSTs to api.forge.coreweave.com even in offline mode), MLflow's usage telemetry, Hugging Face Hub's and
# Gradio's analytics (trackio imports both).  Set before a tracker library is imported, in this process
# and so in its children (W&B's core).  tests/test_trackers.py fails on any outbound connection attempt.
TELEMETRY_OFF = {
    "WANDB_ERROR_REPORTING": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "GRADIO_ANALYTICS_ENABLED": "False",
    "DO_NOT_TRACK": "1",
}


def telemetry_off() -> None:
    """Turn every tracker library's telemetry off (TELEMETRY_OFF) for this process and its children."""
    os.environ.update(TELEMETRY_OFF)


def open_trackers(
    names: tuple[str, ...] | list[str],
    run_dir: Path,
    config: dict[str, Any],
    first_step: int = 1,
    history: Callable[[], list[dict[str, Any]]] | None = None,
) -> list[Tracker]:
    """Open the named trackers; one that is fresh in a run past phase 1 first gets `history()` (the
    metrics.jsonl lines before `first_step`), so every tracker shows the whole run."""
    out: list[Tracker] = []
    lines = None
    if any(n != "jsonl" for n in names):
        telemetry_off()
    try:
        for name in names:
            tracker = TRACKERS.get(name)()
            try:
                tracker.open(run_dir, config, first_step)
            except OSError as e:  # its folder cannot be made (a file in the way, no permission, disk full)
                where = e.filename or run_dir
                raise TrackerError(
                    f"logging.trackers: {name} cannot write its folder {where} ({e.strerror or e})"
                ) from None
            out.append(tracker)
            if first_step > 1 and tracker.fresh and history is not None:
                lines = history() if lines is None else lines
                for line in lines:
                    if line["global_phase"] < first_step:
                        tracker.log(line, line["global_phase"])
                tracker.commit(first_step - 1)
    except BaseException:
        for t in out:  # the ones already open are closed before the refusal
            t.close()
        raise
    return out
