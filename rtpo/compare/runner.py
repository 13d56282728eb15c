"""Running a comparison's jobs (rtpo.compare): one run per job, in worker processes when several are
queued; a failed run comes back as a one-line error, never as an exception."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_all_start_methods, get_context
from pathlib import Path

from rtpo.compare.jobs import Job
from rtpo.core.threads import torch_threads

CURVE_KEYS = (
    "budget/rollouts",
    "budget/tokens",
    "eval/value",
    "eval/v_star",
    "eval/v_star_psi",
    "eval/v_uniform",
    "eval/first_action_wrong",
    "consistency/rollout_train_ratio",
    "adv/zero_rate",
)


@dataclass
class Outcome:
    """What one job gave: its summary and metric curve, or the one-line error of its failure."""

    job: Job
    summary: dict | None = None
    curve: list = field(default_factory=list)
    error: str | None = None


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)


def run_job(job: Job) -> Outcome:
    """Run one job (in a worker process); a failure is returned as a one-line error, never raised."""
    try:
        import rtpo.tabular.history_build  # noqa: F401
    except ImportError:
        pass
    from rtpo.rundir.runner import run_scenario
    from rtpo.scenario.load import parse_scenario

    try:
        cfg = parse_scenario(job.data)
        res = run_scenario(cfg, out_root=Path(job.out_root), progress=False)
    except Exception as e:  # one bad run must not lose the others
        return Outcome(job, error=f"{type(e).__name__}: {' '.join(str(e).split())}")
    curve = [{k: m[k] for k in m if k in CURVE_KEYS or k.startswith("samples/turn_")} for m in res.metrics]
    summary = {k: v for k, v in res.summary.items() if not isinstance(v, (list, dict))}
    return Outcome(job, summary=summary, curve=curve)


def run_all(jobs: list[Job], workers: int, on_done) -> list[Outcome]:
    """Run the jobs (in this process when workers <= 1, else in a process pool), each with one torch
    thread; this process's thread count is put back afterwards (a library caller, a test session)."""
    with torch_threads(1):
        return _run_all(jobs, workers, on_done)


def _run_all(jobs: list[Job], workers: int, on_done) -> list[Outcome]:
    outcomes: list[Outcome] = []
    if workers <= 1 or len(jobs) <= 1:
        _init_worker()
        for job in jobs:
            outcomes.append(run_job(job))
            on_done(outcomes)
        return outcomes
    # Workers come from a fork server, never from a fork of this process: once torch's OpenMP team has run
    # here (any earlier tensor op with more than one thread: a test session, a notebook, rtpo.commands.api), a
    # forked child blocks forever at its first parallel op (libgomp is not fork-safe). The server is a
    # fresh interpreter that imports rtpo's runner once and runs no torch op, so forking it is safe and
    # each worker still starts with rtpo and torch imported; it is started once per process and reused.
    # Spawn where there is no fork server.
    method = "forkserver" if "forkserver" in get_all_start_methods() else "spawn"
    ctx = get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["rtpo.compare.runner", "rtpo.rundir.runner", "rtpo.scenario.load", "torch"])
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=ctx, initializer=_init_worker) as pool:
        futures = [pool.submit(run_job, j) for j in jobs]
        for fut in as_completed(futures):
            outcomes.append(fut.result())
            on_done(outcomes)
    return outcomes
