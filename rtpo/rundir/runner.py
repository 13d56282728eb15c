"""The runner: one scenario -> a run folder with config, per-phase metrics, checkpoints, plot and summary.

    runs/<scenario>-<method>-<seed>-<time>/
        config.yaml      the resolved scenario (what `--resume` reloads)
        metrics.jsonl    one line per phase: counters, method metrics, evaluation, budget, wall time
        ckpt/            checkpoints (rtpo.rundir.checkpoint): iter_N/ per saved iteration (the last
                         logging.keep_last), the newest mid-iteration one, and `latest`
        learning_curve.png, summary.md, summary.json   written when the run ends

The loop is backend-agnostic: the backend comes from rtpo.scenario.backends by `backend.kind`, the method from
the method registry, and the runner only calls `begin`/`phase` and checkpoints between phases.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rtpo.core.budget import Budget
from rtpo.core.protocols import Closeable, ReportsMetrics
from rtpo.rundir import checkpoint, provenance
from rtpo.rundir.checkpoint import (
    CONFIG,
    CURVE,
    METRICS,
    SUMMARY,
    SUMMARY_JSON,
    atomic_write_text,
    read_metrics,
    truncate_metrics,
)
from rtpo.rundir.logs import console_stderr, library_logs
from rtpo.rundir.trackers import open_trackers
from rtpo.scenario.backends import BuiltBackend, build_backend, get_backend
from rtpo.scenario.load import ConfigError, ScenarioConfig, load_scenario


@dataclass
class RunResult:
    """run_dir: the run folder (None for an in-memory run); metrics: every metrics.jsonl line; summary:
    what summary.md shows."""

    run_dir: Path | None
    metrics: list[dict]
    summary: dict
    learner: Any = None  # the trained learner (rtpo.train returns it)


@dataclass
class _Progress:
    """The runner's own counters (checkpointed with everything else)."""

    iteration: int = 0  # current (or next) iteration index
    phase_in_iter: int = 0  # phases of the current iteration already done
    global_phase: int = 0  # phases done in the whole run
    metric_lines: int = 0  # lines of metrics.jsonl that belong to completed phases
    elapsed_s: float = 0.0  # wall time spent in earlier processes of this run
    it_state: Any = None  # the method's IterationState, None between iterations
    method_state: Any = None  # what the method carries across iterations (Method.state_dict)
    phases_in_iter: int = 0  # phases the current iteration started with (progress bar only)
    stopped_by: str | None = None
    # the env's counters not yet logged (BuiltBackend.counters): evaluate() logs them, and a checkpoint
    # between two evaluations would otherwise lose what the phases before it counted
    env_counters: dict | None = None


def _check_out_root(out_root: Path) -> None:
    if out_root.exists() and not out_root.is_dir():
        raise ConfigError(f"--out {out_root}: exists and is not a folder")


def _new_run_dir(out_root: Path, cfg: ScenarioConfig, stem: str | None = None) -> Path:
    _check_out_root(out_root)
    try:
        out_root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--out {out_root}: cannot create the folder ({e.strerror or e})") from None
    stem = stem or f"{cfg.name}-{cfg.method.name}-{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    for i in range(1, 1000):
        path = out_root / (stem if i == 1 else f"{stem}-{i}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"cannot create a run folder for {stem} in {out_root}")


def _jsonable(v: Any) -> Any:
    if isinstance(v, (np.floating, float)):
        return float(v)
    if isinstance(v, (np.integer, int)) and not isinstance(v, bool):
        return int(v)
    if isinstance(v, (np.bool_, bool)):
        return bool(v)
    return v


def _save_checkpoint(run_dir: Path, cfg: ScenarioConfig, built: BuiltBackend, prog: _Progress) -> None:
    ctx = built.ctx
    between = prog.it_state is None and built.sampler_state_at_boundary is not None
    # a learner that writes its own shards (the llm's FSDP learner: torch.distributed.checkpoint, each rank
    # its shard) does so into the checkpoint folder; any other one is pickled with the rest
    save = getattr(ctx.learner, "save_sharded", None)
    state = {
        "learner": checkpoint.ShardedLearner(save) if callable(save) else ctx.learner.state_dict(),
        "sampler": built.sampler_state_at_boundary() if between else built.sampler_state(),
        "rng": ctx.rng.bit_generator.state,
        "budget": dataclasses.asdict(ctx.budget),
        "progress": {f.name: getattr(prog, f.name) for f in dataclasses.fields(prog)},
    }
    if built.counters is not None:
        state["progress"]["env_counters"] = built.counters.state()
    # at an iteration boundary the checkpoint joins the history (iter_N); inside one it is transient
    name = checkpoint.checkpoint_name(prog.iteration, None if prog.it_state is None else prog.phase_in_iter)
    checkpoint.write_checkpoint(run_dir, cfg, state, name, cfg.logging.keep_last)


def _restore(state: dict, built: BuiltBackend) -> _Progress:
    ctx = built.ctx
    ctx.learner.load_state_dict(state["learner"])
    built.load_sampler_state(state["sampler"])
    ctx.rng.bit_generator.state = state["rng"]
    ctx.budget = Budget(**state["budget"])
    prog = _Progress(**state["progress"])
    if built.counters is not None:  # a checkpoint of an older version has none: nothing was pending then
        built.counters.load(prog.env_counters or {})
    prog.env_counters = None
    # Ctrl-C stopped it at a phase boundary: carry on from there; a finished run re-checks its budget,
    # which a resume may have raised (budget.iterations / budget.max_rollouts)
    if prog.stopped_by in ("interrupted", "iterations", "max_rollouts"):
        prog.stopped_by = None
    return prog


def _query_ids(iteration: int, count: int, num_queries: int | None) -> np.ndarray:
    """Iteration i takes the next `count` query ids, cycling through the query set (no rng used)."""
    ids = iteration * count + np.arange(count, dtype=np.int64)
    return ids % num_queries if num_queries else ids


class _Console:
    """What a run prints while it runs: the run folder first, then on a terminal a bar (phase, key metric,
    elapsed, ETA), elsewhere (a file, nohup, SLURM) one plain line per phase, flushed as it is written.
    Disabled (`progress=False`, `--no-progress`): nothing."""

    def __init__(self, enabled: bool, cfg: ScenarioConfig, run_dir: Path, done: float) -> None:
        import sys

        self.cfg, self.total, self.start_done = cfg, cfg.budget.iterations, done
        self.t0 = time.perf_counter()
        self.bar = self.task = None
        self.mode = "off"
        if not enabled:
            return
        if run_dir is not None:
            print(f"run folder: {run_dir}", flush=True)
        self.mode = "tty" if sys.stdout.isatty() else "lines"
        if self.mode == "tty":
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.completed:.1f}/{task.total} it"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(),
                transient=False,
            )
            self.bar.start()
            self.task = self.bar.add_task(f"{cfg.name} {cfg.method.name}", total=self.total, completed=done)

    def eta_s(self, done: float) -> float | None:
        rate = (done - self.start_done) / max(time.perf_counter() - self.t0, 1e-9)
        return (self.total - done) / rate if rate > 0 else None

    def phase(self, record: dict, done: float, ratio: float | None, value: float | None = None) -> None:
        """One phase done: `ratio` is the latest value/optimum (tabular), `value` the latest value (any)."""
        if self.mode == "off":
            return
        head = f"it {record['iteration'] + 1}/{self.total} phase {record['phase']}"
        head += f" (turn {int(record['phase/turn'])})" if "phase/turn" in record else ""
        if ratio is not None:
            value = f" value/opt {ratio:.4f}"
        else:
            value = f" value {value:.4g}" if value is not None else ""
        if isinstance(record.get("return/mean"), (int, float)):
            value += f" return {record['return/mean']:.4g}"
        if self.mode == "tty":
            self.bar.update(
                self.task, completed=done, description=f"{self.cfg.name} {self.cfg.method.name} {head}{value}"
            )
            return
        eta = self.eta_s(done)
        elapsed = record.get("time/elapsed_s", 0.0)
        rollouts = record.get("budget/rollouts")
        print(
            f"{head}{value}"
            + (f" rollouts {rollouts}" if rollouts is not None else "")
            + f" elapsed {elapsed:.1f}s"
            + (f" eta {eta:.0f}s" if eta is not None else ""),
            flush=True,
        )

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()


class _SafeInterrupt:
    """Ctrl-C stops the run at the next phase boundary (after its metrics line and a checkpoint) instead of
    mid-update; a second Ctrl-C interrupts at once.  Only in the main thread (signals go nowhere else)."""

    def __init__(self) -> None:
        self.requested = False
        self._old = None

    def __enter__(self) -> _SafeInterrupt:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

        print("\ninterrupt: stopping after this phase (Ctrl-C again to stop now)", file=console_stderr(), flush=True)

    def __exit__(self, *exc) -> None:
        if self._old is not None:
            import signal

            signal.signal(signal.SIGINT, self._old)


RESUMABLE = ("budget.", "logging.")  # what a resume may change: how far a run goes and how it reports


def run_scenario(
    cfg: ScenarioConfig | None,
    out_root: Path = Path("runs"),
    resume: str | Path | None = None,
    progress: bool = True,
    overrides: Sequence[str] = (),
    iteration: int | None = None,
    verbose: bool = False,
) -> RunResult:
    """Run (or, with resume=RUN_DIR, continue) a scenario; returns the folder, all metrics and the summary.

    The libraries' log lines (vLLM, Ray, transformers, warnings) go to RUN/logs/ (rtpo.rundir.logs) unless
    `verbose`.

    On resume the run's own config.yaml is authoritative; a `cfg` that differs from it is an error.
    `overrides` (budget.* and logging.* keys only) change it for the rest of the run, e.g. a larger
    `budget.iterations` continues a finished run exactly as one longer run would have gone on; the run's
    config.yaml records the change.  `iteration=N` resumes from checkpoint `ckpt/iter_N` into a new run
    folder under `out_root` (the original keeps all of its metrics and checkpoints).
    """
    locks: list[checkpoint.RunLock] = []  # the run folder this process writes, locked until it returns
    try:
        return _run_scenario(cfg, out_root, resume, progress, overrides, iteration, verbose, locks)
    finally:
        for lock in locks:
            lock.release()


def _run_scenario(cfg, out_root, resume, progress, overrides, iteration, verbose, locks) -> RunResult:
    state = None
    if resume is not None:
        run_dir = Path(resume)
        if not (run_dir / CONFIG).is_file():
            raise ConfigError(f"--resume {run_dir}: not a run folder (no {CONFIG})")
        if iteration is None:  # a second writer is refused here, before anything is read or touched
            locks.append(checkpoint.lock_run(run_dir))
        saved = load_scenario(run_dir / CONFIG)
        if cfg is not None and cfg.to_dict() != saved.to_dict():
            raise ConfigError(f"--resume {run_dir}: the given scenario differs from the run's {CONFIG}")
        for item in overrides:
            key = str(item).split("=", 1)[0].strip()
            if "=" not in str(item) or not key.startswith(RESUMABLE):
                raise ConfigError(
                    f"--resume {run_dir}: {item!r}: only budget.* and logging.* settings may change on resume "
                    f"(any other setting makes another run)"
                )
        new_cfg = load_scenario(run_dir / CONFIG, list(overrides)) if overrides else saved
        _check_export(new_cfg)
        state = checkpoint.resume_state(run_dir, saved, iteration)  # verified before anything is touched
        config_changed = new_cfg.to_dict() != saved.to_dict()
        cfg = new_cfg
    else:
        if cfg is None:
            raise ConfigError("run_scenario needs a scenario config or resume=RUN_DIR")
        _check_export(cfg)
        if iteration is not None or overrides:
            raise ConfigError("iteration and overrides go with resume=RUN_DIR")
        _check_out_root(Path(out_root))

    # build first (load the task and its data, the model, the engines), then make or change folders:
    # a task that fails to load leaves no run folder behind, and a resumed run's config.yaml unchanged
    if cfg.backend.kind == "llm" and resume is None:  # refuse what will not fit before anything starts
        from rtpo.plan import check_fits

        check_fits(cfg)
    with library_logs(verbose) as libs:  # vLLM/Ray/transformers lines go to RUN/logs/, not the console
        spec = get_backend(cfg.backend.kind)
        inputs = spec.inputs(cfg) if spec.inputs is not None else {}  # content digests, e.g. backend.init's
        if resume is not None:  # the weights it started from must be the ones it resumes from
            try:
                provenance.check_inputs(run_dir, inputs)
            except ValueError as e:
                raise ConfigError(str(e)) from None
        built = build_backend(cfg)
        if cfg.backend.distributed != "none":
            from rtpo.distributed import distribute  # Ray is imported only by runs that ask for it

            built = distribute(built, cfg, cfg.backend.distributed, cfg.resources, cfg.backend.address)
        try:
            source = run_dir if resume is not None else None
            if resume is None:
                run_dir = _new_run_dir(Path(out_root), cfg)
                locks.append(checkpoint.lock_run(run_dir))
                atomic_write_text(run_dir / CONFIG, cfg.to_yaml())
            elif iteration is not None:
                run_dir = _fork(run_dir, cfg, state, iteration, Path(out_root), locks)
            elif config_changed:
                atomic_write_text(run_dir / CONFIG, cfg.to_yaml())
            libs.attach(run_dir)
            provenance.record(run_dir, resumed=resume is not None, source=source, inputs=inputs)
            try:
                return _run_loop(cfg, built, run_dir, state, progress)
            except OSError as e:
                if e.errno not in _NO_ROOM:
                    raise
                raise _write_error(run_dir, e) from None
        finally:
            if isinstance(built.ctx, Closeable):
                built.ctx.shutdown()


_NO_ROOM = checkpoint.NO_ROOM


def _write_error(run_dir: Path, e: OSError) -> RunWriteError:
    where = e.filename or "the run folder"
    latest = checkpoint.latest_name(run_dir)
    after = (
        f"ckpt/{latest} is intact: make room and continue with rtpo run --resume {run_dir}"
        if latest
        else "no checkpoint was written yet"
    )
    return RunWriteError(f"{run_dir}: cannot write {where} ({e.strerror or e}); the run stopped, {after}")


def _check_export(cfg: ScenarioConfig) -> None:
    if cfg.logging.hf_export_every is not None and get_backend(cfg.backend.kind).export is None:
        raise ConfigError(
            f"logging.hf_export_every: a {cfg.backend.kind} run has no model to export (llm runs only; set it to null)"
        )


def _export_hf(run_dir: Path, cfg: ScenarioConfig, built: BuiltBackend, prog: _Progress) -> None:
    """RUN/hf/iter_N from the learner's current weights (logging.hf_export_every).  A resumed run that
    redoes an iteration writes the same folder again (resume is exact), so an existing one is replaced."""
    out = checkpoint.hf_export_path(run_dir, prog.iteration)
    if out.exists():
        shutil.rmtree(out)
    manifest = {
        "run": str(Path(run_dir).resolve()),
        "checkpoint": None,
        "fingerprint": checkpoint.fingerprint(cfg),
        "iterations_done": prog.iteration,
        "global_phase": prog.global_phase,
        "scenario": cfg.name,
        "method": cfg.method.name,
        "seed": cfg.seed,
    }
    get_backend(cfg.backend.kind).export(cfg, built.ctx.learner.weights(), out, manifest)


def _write_generations(run_dir: Path, iteration: int, episodes: list[dict]) -> None:
    """RUN/generations/iter_<iteration>.jsonl, atomically (a resume from the iteration's start rewrites
    the same lines)."""
    path = checkpoint.generations_path(run_dir, iteration)
    path.parent.mkdir(exist_ok=True)
    lines = (json.dumps({"iteration": iteration, **e}, default=_jsonable) + "\n" for e in episodes)
    atomic_write_text(path, "".join(lines))


def run_in_memory(cfg: ScenarioConfig, built: BuiltBackend | None = None, progress: bool = False) -> RunResult:
    """Run a scenario with nothing written: no run folder, metrics file, checkpoint, export, plot or tracker
    output (rtpo.train's default).  The phases, metrics and summary are those of `run_scenario`.
    `built` is a backend built already (rtpo.train on your own TurnMDP); None builds the scenario's."""
    if built is None:
        built = build_backend(cfg)
        if cfg.backend.distributed != "none":
            from rtpo.distributed import distribute

            built = distribute(built, cfg, cfg.backend.distributed, cfg.resources, cfg.backend.address)
    try:
        return _run_loop(cfg, built, None, None, progress)
    finally:
        if isinstance(built.ctx, Closeable):
            built.ctx.shutdown()


def _fork(src: Path, cfg: ScenarioConfig, state: dict, iteration: int, out_root: Path, locks: list) -> Path:
    """A new run folder that starts as run `src` stood after `iteration` iterations: its config (with
    the resume's overrides), the metric lines up to there, its fingerprint and that checkpoint."""
    lines = state["progress"]["metric_lines"]
    kept = read_metrics(src, lines)
    if len(kept) < lines:
        raise ConfigError(f"--iter {iteration}: {src / METRICS} has {len(kept)} lines, the checkpoint expects {lines}")
    run_dir = _new_run_dir(out_root, cfg, f"{src.name}-from-iter_{iteration}")
    locks.append(checkpoint.lock_run(run_dir))
    atomic_write_text(run_dir / CONFIG, cfg.to_yaml())
    atomic_write_text(run_dir / METRICS, "".join(json.dumps(m) + "\n" for m in kept))
    if (src / checkpoint.CHECKPOINT_ID).is_file():
        shutil.copy2(src / checkpoint.CHECKPOINT_ID, run_dir / checkpoint.CHECKPOINT_ID)
    body = {k: v for k, v in state.items() if k != "version"}
    checkpoint.write_checkpoint(run_dir, cfg, body, checkpoint.checkpoint_name(iteration), cfg.logging.keep_last)
    return run_dir


class _IterationProfiler:
    """logging.profile_iteration: a torch profiler around that one iteration (begin to its last phase),
    its Chrome trace written to RUN/profile/iter_N.trace.json.  Nothing for in-memory runs or other
    iterations; a run stopped inside the iteration leaves no trace."""

    def __init__(self, iteration: int | None, run_dir: Path | None) -> None:
        self.iteration = iteration if run_dir is not None else None
        self.run_dir = run_dir
        self.prof = None

    def start(self, iteration: int) -> None:
        if iteration != self.iteration or self.prof is not None:
            return
        import torch

        acts = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        self.prof = torch.profiler.profile(activities=acts, record_shapes=False)
        self.prof.__enter__()

    def stop(self, iteration: int) -> None:
        if self.prof is None or iteration != self.iteration:
            return
        prof, self.prof = self.prof, None
        prof.__exit__(None, None, None)
        out = self.run_dir / "profile" / f"iter_{iteration}.trace.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(out))

    def close(self) -> None:
        if self.prof is not None:
            prof, self.prof = self.prof, None
            prof.__exit__(None, None, None)


def _run_loop(
    cfg: ScenarioConfig, built: BuiltBackend, run_dir: Path | None, state: dict | None, progress: bool
) -> RunResult:
    """Run phases until the budget is spent; checkpoint between phases.

    run_dir=None is the in-memory run of `rtpo.train`: the same phases, metrics and summary, and nothing
    written (no metrics file, trackers, checkpoints, exports, plot or summary files).

    Budget rule: `budget.max_rollouts` (and `budget.max_tokens`) is checked only at iteration boundaries,
    before `begin`;
    an iteration once begun runs all its phases.  So every rollout a run generates is trained on (or, for
    RTPO's trunks, used for the boundaries it trains) and appears in a metrics line, and the spend a run
    reports (its last metrics line, summary.json, `rtpo compare`) is its checkpoint's budget counter.

    Why this and not "stop at the first phase that reaches the cap": a flat method (GRPO, SeeUPO, GSPO,
    Tree-GRPO, ARPO) generates all of an iteration's rollouts in `begin` and trains on them in its one
    phase, so a cap checked before that phase threw the whole last iteration away after paying for it --
    reported as neither spent nor trained (GRPO at a budget of exactly 3 iterations reported 2 iterations'
    rollouts; below one iteration it reported 0 rollouts and the initial policy's value).  And "never
    generate what will not be trained" needs the iteration's cost in advance, which RTPO with early
    episode ends and ARPO's branching do not have.  The price: a run may spend up to one iteration past
    `max_rollouts`; `rtpo compare` avoids that by giving each method the whole iterations that fit its
    budget, and it reports the real spend (at least one iteration runs, even when it costs more).
    """
    method = cfg.method.build()
    ctx = built.ctx
    if state is not None:
        prog = _restore(state, built)
        method.load_checkpoint_state(prog.method_state)
        checkpoint.discard_uncommitted(run_dir)
        truncate_metrics(run_dir, prog.metric_lines)
    else:
        prog = _Progress()
        if run_dir is not None:
            atomic_write_text(run_dir / METRICS, "")
    in_memory: list[dict] = []  # the metric lines of an in-memory run (run_dir None)

    budget_cfg = cfg.budget

    def spent() -> str | None:
        """The cap that is spent (max_rollouts or max_tokens), checked at iteration boundaries only (the
        budget rule in _run_loop's docstring)."""
        if budget_cfg.max_rollouts is not None and ctx.budget.rollouts >= budget_cfg.max_rollouts:
            return "max_rollouts"
        if budget_cfg.max_tokens is not None and ctx.budget.tokens >= budget_cfg.max_tokens:
            return "max_tokens"
        return None

    start = time.perf_counter()
    done0 = prog.iteration + (prog.phase_in_iter / prog.phases_in_iter if prog.phases_in_iter else 0.0)
    console = _Console(progress and cfg.logging.progress, cfg, run_dir, done0)
    interrupt = _SafeInterrupt()
    last_eval: dict[str, float] = {}
    # a resumed run's trackers start after the checkpoint: what they got from phases past it is replaced
    extra_trackers = [t for t in cfg.logging.trackers if t != "jsonl"] if run_dir is not None else []
    trackers = open_trackers(
        extra_trackers,
        run_dir,
        cfg.to_dict(),
        first_step=prog.global_phase + 1,
        history=lambda: read_metrics(run_dir, prog.metric_lines),  # for a tracker added on resume or a fork
    )
    profiler = _IterationProfiler(cfg.logging.profile_iteration, run_dir)
    try:
        sink = open(run_dir / METRICS, "a") if run_dir is not None else contextlib.nullcontext()
        with interrupt, sink as metrics_file:
            while prog.stopped_by is None:
                if prog.it_state is None:
                    if prog.iteration >= budget_cfg.iterations:
                        prog.stopped_by = "iterations"
                        break
                    if spent():
                        prog.stopped_by = spent()
                        break
                    ids = _query_ids(prog.iteration, budget_cfg.queries_per_iteration, built.num_queries)
                    keep = cfg.logging.generations_per_iteration if built.sample_log and run_dir is not None else 0
                    if keep:
                        built.sample_log(keep)
                    profiler.start(prog.iteration)
                    prog.it_state = method.begin(ctx, ids)
                    if keep:  # written before the iteration's first checkpoint: a resume never redoes begin
                        _write_generations(run_dir, prog.iteration, built.sample_log(0))
                    prog.phase_in_iter = 0
                    prog.phases_in_iter = len(prog.it_state.pending)
                if not prog.it_state.pending:
                    prog.it_state, prog.iteration = None, prog.iteration + 1
                    continue
                t0 = time.perf_counter()
                phase_metrics = method.phase(ctx, prog.it_state)
                if isinstance(ctx, ReportsMetrics):  # distributed backends' timings
                    phase_metrics.update(ctx.pop_metrics())
                for part in (ctx.sampler, ctx.learner):  # generation and training time, tokens/s (llm)
                    if part is not ctx and isinstance(part, ReportsMetrics):
                        phase_metrics.update(part.pop_metrics())
                phase_s = time.perf_counter() - t0
                prog.phase_in_iter += 1
                prog.global_phase += 1
                iter_done = not prog.it_state.pending
                if iter_done:
                    profiler.stop(prog.iteration)
                last = iter_done and (prog.iteration + 1 >= budget_cfg.iterations or spent() is not None)
                if last or prog.global_phase % cfg.eval.every == 0:
                    t_eval = time.perf_counter()
                    last_eval = built.evaluate()
                    eval_metrics = {**last_eval, "time/eval_s": time.perf_counter() - t_eval}
                else:
                    eval_metrics = {}
                record = {
                    "iteration": prog.iteration,
                    "phase": prog.phase_in_iter - 1,
                    "global_phase": prog.global_phase,
                    **phase_metrics,
                    **eval_metrics,
                    **ctx.budget.as_metrics(),
                    "time/phase_s": phase_s,
                    "time/elapsed_s": prog.elapsed_s + time.perf_counter() - start,
                }
                line = {k: _jsonable(v) for k, v in record.items()}
                _check_finite(line, built.value_key, prog, run_dir)  # before the line or a checkpoint
                if metrics_file is None:
                    in_memory.append(line)
                else:
                    try:
                        metrics_file.write(json.dumps(line) + "\n")
                        metrics_file.flush()
                        os.fsync(metrics_file.fileno())
                    except OSError as e:  # name the file (a write on an open file says none)
                        raise OSError(e.errno, e.strerror, str(run_dir / METRICS)) from None
                prog.metric_lines += 1
                for t in trackers:  # the same record, the same keys
                    t.log(line, prog.global_phase)
                if iter_done:
                    prog.it_state, prog.iteration = None, prog.iteration + 1
                    every = cfg.logging.hf_export_every
                    if every is not None and run_dir is not None and (last or prog.iteration % every == 0):
                        _export_hf(run_dir, cfg, built, prog)
                # the elapsed time so far belongs to the checkpoint, so a resumed run's clock continues
                checkpoint_due = last or interrupt.requested or prog.global_phase % cfg.logging.checkpoint_every == 0
                if checkpoint_due and run_dir is not None:
                    saved_elapsed = prog.elapsed_s
                    prog.elapsed_s = saved_elapsed + time.perf_counter() - start
                    prog.method_state = method.checkpoint_state()
                    _save_checkpoint(run_dir, cfg, built, prog)
                    prog.elapsed_s = saved_elapsed
                    for t in trackers:  # what a resume will not run again may now go out
                        t.commit(prog.global_phase)
                done = prog.iteration + (
                    prog.phase_in_iter / prog.phases_in_iter
                    if prog.it_state is not None and prog.phases_in_iter
                    else 0.0
                )
                latest = eval_metrics or last_eval
                console.phase(record, done, _ratio(latest, built), latest.get(built.value_key))
                if interrupt.requested and not last:
                    prog.stopped_by = "interrupted"
    finally:
        profiler.close()
        console.stop()
        for t in trackers:
            t.close()
    prog.elapsed_s += time.perf_counter() - start
    prog.method_state = method.checkpoint_state()
    if run_dir is None:
        metrics = in_memory
    else:
        _save_checkpoint(run_dir, cfg, built, prog)
        metrics = read_metrics(run_dir)
    summary = _finish(run_dir, cfg, built, metrics, prog)
    return RunResult(run_dir=run_dir, metrics=metrics, summary=summary, learner=ctx.learner)


class TrainingDiverged(RuntimeError):
    """The first non-finite loss, gradient or value of a run (str: one line naming it and the phase)."""


class RunWriteError(RuntimeError):
    """A run folder that could not be written (disk full, quota, read-only): one line naming the file;
    the checkpoint `latest` names is intact and the run resumes exactly from it."""


# what must stay finite: the loss terms and the learner's own figures (gradient norm, lr), and the value
_MUST_BE_FINITE = ("loss/", "train/")


def _check_finite(line: dict, value_key: str, prog: _Progress, run_dir: Path | None) -> None:
    """Stop the run at the first non-finite loss, gradient or value (train.lr=1e308 used to run to the
    end and report 'final value nan', exit 0).  Nothing of the phase is written: no metrics line, no
    checkpoint, so `latest` stays the last finite state."""
    for key, v in line.items():
        if (key.startswith(_MUST_BE_FINITE) or key == value_key) and isinstance(v, float) and not math.isfinite(v):
            latest = checkpoint.latest_name(run_dir) if run_dir is not None else None
            kept = f"the latest checkpoint ckpt/{latest} is the last finite state" if latest else "no checkpoint"
            raise TrainingDiverged(
                f"non-finite training: {key} = {v} in phase {prog.global_phase} (iteration {prog.iteration}, "
                f"phase {prog.phase_in_iter - 1} of it); stopped with {kept} (lower train.lr, or check the rewards)"
            )


def _ratio(ev: dict, built: BuiltBackend) -> float | None:
    if built.optimum_key is None or built.value_key not in ev or built.optimum_key not in ev:
        return None
    opt = ev[built.optimum_key]
    return ev[built.value_key] / opt if opt else None


def _finish(
    run_dir: Path | None, cfg: ScenarioConfig, built: BuiltBackend, metrics: list[dict], prog: _Progress
) -> dict:
    evals = [m for m in metrics if built.value_key in m]
    final = evals[-1] if evals else built.evaluate()
    value = final.get(built.value_key)
    optimum = final.get(built.optimum_key) if built.optimum_key else None
    ratio = value / optimum if (value is not None and optimum) else None
    summary = {
        "scenario": cfg.name,
        "method": cfg.method.name,
        "seed": cfg.seed,
        "run_dir": None if run_dir is None else str(run_dir),
        "iterations_done": prog.iteration,
        "phases_done": prog.global_phase,
        "stopped_by": prog.stopped_by,
        "final_value": value,
        "optimum": optimum,
        "value_over_optimum": ratio,
        "target": cfg.eval.target,
        "reached_target": None if ratio is None else bool(ratio >= cfg.eval.target),
        # the run's own counter (what its checkpoint holds), not a metrics line: the two agree by the
        # budget rule of _run_loop, and the counter is the spend even if a line were missing
        "rollouts": built.ctx.budget.rollouts,
        "tokens": built.ctx.budget.tokens,
        "wall_s": prog.elapsed_s,
        "rollout_train_ratio_mean": _mean(metrics, "consistency/rollout_train_ratio"),
        "zero_advantage_rate_mean": _mean(metrics, "adv/zero_rate"),
        # the share of sibling rollouts in tied groups (RTPO family; equals the rate when groups are equal)
        "zero_advantage_rollout_share_mean": _mean(metrics, "adv/zero_rollout_share"),
    }
    refs = {
        k: final[k] for k in ((built.optimum_key,) if built.optimum_key else ()) + built.reference_keys if k in final
    }
    plot = None
    if run_dir is None:
        summary["plot"] = None
        return summary  # in memory: nothing written
    if cfg.logging.plot:
        from rtpo.rundir.plots import learning_curve

        plot = learning_curve(
            metrics,
            run_dir / CURVE,
            built.value_key,
            refs,
            f"{cfg.name} / {cfg.method.name} / seed {cfg.seed}",
        )
    summary["plot"] = plot.name if plot else None
    atomic_write_text(run_dir / SUMMARY_JSON, json.dumps(summary, indent=2) + "\n")
    atomic_write_text(run_dir / SUMMARY, _summary_md(summary, refs))
    return summary


def _mean(metrics: list[dict], key: str) -> float | None:
    vals = [m[key] for m in metrics if key in m and m[key] is not None and not math.isnan(m[key])]
    return float(np.mean(vals)) if vals else None


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _summary_md(s: dict, refs: dict[str, float]) -> str:
    lines = [
        f"# {s['scenario']} / {s['method']} / seed {s['seed']}",
        "",
        "| quantity | value |",
        "|---|---|",
        f"| final policy value | {_fmt(s['final_value'])} |",
        f"| exact optimum | {_fmt(s['optimum'])} |",
        *(f"| {k} | {_fmt(v)} |" for k, v in list(refs.items())[1:]),
        f"| value / optimum | {_fmt(s['value_over_optimum'])} |",
        f"| target (value >= target * optimum) | {_fmt(s['target'])}: "
        f"{'reached' if s['reached_target'] else 'not reached' if s['reached_target'] is not None else '-'} |",
        f"| iterations / phases done | {s['iterations_done']} / {s['phases_done']} |",
        f"| stopped by | {_fmt(s['stopped_by'])} |",
        f"| rollouts / tokens spent | {s['rollouts']} / {s['tokens']} |",
        f"| mean rollout/train ratio | {_fmt(s['rollout_train_ratio_mean'])} |",
        f"| mean zero-advantage rate | {_fmt(s['zero_advantage_rate_mean'])} |",
        f"| wall time (s) | {s['wall_s']:.1f} |",
        "",
    ]
    if s.get("plot"):
        lines += [f"![learning curve]({s['plot']})", ""]
    return "\n".join(lines)
