"""`rtpo eval`: evaluate a scenario's initial policy, a run's checkpoint or a HF model folder.

    rtpo eval TARGET [key=value ...] [--iter N] [--samples N] [--k 1,4,8] [--queries Q|all]
                     [--split eval|train] [--seed S] [--threshold T] [--out FILE]

The metrics are rtpo.core.sampled_eval's (the library; re-exported here); this module is the command: its
arguments (main, command), resolving the target, building its backend, loading the checkpoint's policy, the
table and the report.  `rtpo eval ...` and `python -m rtpo.commands.eval ...` are the same command.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rtpo.commands.common import OneLineParser, add_plugin_option, fail, write_json
from rtpo.core.protocols import Closeable
from rtpo.core.sampled_eval import (  # noqa: F401 - re-exported: the metrics library's names under rtpo.commands.eval too
    IN_RUN_SEED_OFFSET,
    EvalSamples,
    EvalSplit,
    SampledEval,
    in_run_metrics,
    mean_pass_at_k,
    pass_at_k,
    sample_and_score,
)


@dataclass
class EvalTarget:
    """A resolved TARGET: the scenario to build and, for a run, the checkpoint whose policy to load."""

    cfg: Any
    kind: str  # "scenario" | "run" | "model"
    path: Path
    run_dir: Path | None = None
    checkpoint: Path | None = None


def parse_ks(text: str) -> list[int]:
    """'1,4,8' -> [1, 4, 8] (sorted, unique); anything else is a ValueError naming the input."""
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or any(not p.isdigit() or int(p) < 1 for p in parts):
        raise ValueError(f"--k: must be a comma-separated list of positive integers, got {text!r}")
    return sorted({int(p) for p in parts})


def resolve_target(
    target: str, overrides: Sequence[str] = (), scenario: str | None = None, iteration: int | None = None
) -> EvalTarget:
    """TARGET = a scenario file (its initial policy), a run folder of `rtpo run` (its latest checkpoint,
    or with `iteration` the one after that many iterations) or a checkpoint file in it (the checkpoint's
    policy; the run's config.yaml plus overrides), or a HF model folder (one written by save_pretrained
    or `rtpo export`) together with `scenario` (which gets backend.model=<folder>)."""
    from rtpo.rundir.checkpoint import CKPT_DIR, CONFIG, STATE, iteration_path, latest_path
    from rtpo.scenario.load import ConfigError, load_scenario

    p = Path(target)
    if not p.exists():
        raise ConfigError(f"{target}: no such scenario file, run folder or checkpoint")
    if iteration is not None and not (p.is_dir() and (p / CONFIG).is_file()):
        raise ConfigError(f"--iter {iteration}: goes with a run folder target, not with {target}")
    if p.is_dir() and (p / STATE).is_file() and p.parent.name == CKPT_DIR:
        p = p / STATE  # a checkpoint folder RUN/ckpt/iter_N
    if p.is_file() and (p.suffix == ".pkl" or p.name == STATE):
        run_dir = p.parent if p.suffix == ".pkl" else p.parent.parent.parent
        if not (run_dir / CONFIG).is_file():
            raise ConfigError(f"{target}: a checkpoint outside a run folder (no {CONFIG} where it belongs)")
        return EvalTarget(load_scenario(run_dir / CONFIG, list(overrides)), "run", p, run_dir, p)
    if p.is_file():
        if scenario is not None:
            raise ConfigError(f"--scenario goes with a HF model folder target, not with the scenario file {target}")
        return EvalTarget(load_scenario(p, list(overrides)), "scenario", p)
    if (p / CONFIG).is_file():
        ckpt = iteration_path(p, iteration) if iteration is not None else latest_path(p)
        if ckpt is None or not ckpt.is_file():
            raise ConfigError(f"{target}: run folder without a checkpoint (no {CKPT_DIR}/; the run wrote no phase)")
        return EvalTarget(load_scenario(p / CONFIG, list(overrides)), "run", p, p, ckpt)
    if (p / "config.json").is_file():
        if scenario is None:
            raise ConfigError(f"{target}: a HF model folder needs --scenario FILE (it is evaluated as backend.model)")
        return EvalTarget(load_scenario(scenario, [f"backend.model={p}", *overrides]), "model", p)
    raise ConfigError(f"{target}: neither a run folder ({CONFIG}) nor a HF model folder (config.json)")


def load_checkpoint_policy(checkpoint: Path, learner: Any, state: dict | None = None) -> dict[str, Any]:
    """Load the learner state of a run checkpoint (as `rtpo run --resume` does; `state`: the checkpoint
    read and verified already); returns where the run was (iteration, global phase).  Only the policy is
    needed: the sampler, rng and budget are not."""
    from rtpo.rundir.checkpoint import read_checkpoint

    state = read_checkpoint(Path(checkpoint)) if state is None else state
    learner.load_state_dict(state["learner"])
    prog = state.get("progress", {})
    return {
        "path": str(checkpoint),
        "iteration": prog.get("iteration"),
        "global_phase": prog.get("global_phase"),
        "stopped_by": prog.get("stopped_by"),
    }


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return None if math.isnan(v) else float(v)
    return v


def evaluate_target(
    target: EvalTarget,
    ks: Sequence[int] = (1,),
    samples: int | None = None,
    queries: int | str | None = None,
    split: str = "eval",
    seed: int | None = None,
    threshold: float | None = None,
    chunk_problems: int | None = None,
    verbose: bool = False,
) -> dict[str, Any]:
    """Build the target's backend, load its policy, sample and score; returns the report (plain data).

    A run folder's checkpoint is read and verified (digests, rtpo.rundir.checkpoint) before anything is
    built.  The libraries' log lines (vLLM, transformers, Ray, warnings) go to the run's RUN/logs/, not
    the console (other targets: dropped unless the evaluation fails); `verbose` shows them.

    samples defaults to max(ks); queries to the whole split (or the backend's default count when the
    split has no fixed problem set), "all" = the whole split; seed to the scenario seed + 7919 (the
    seed of the in-run evaluation)."""
    from rtpo.rundir.checkpoint import read_checkpoint
    from rtpo.rundir.logs import library_logs
    from rtpo.scenario.backends import build_backend
    from rtpo.scenario.load import ConfigError

    cfg = target.cfg
    ks = sorted({int(k) for k in ks})
    samples = max(ks) if samples is None else int(samples)
    if samples < 1:
        raise ConfigError(f"--samples: must be >= 1, got {samples}")
    if ks[-1] > samples:
        raise ConfigError(f"--k: k={ks[-1]} > --samples {samples} (pass@k needs at least k samples per problem)")
    t0 = time.perf_counter()
    state = read_checkpoint(Path(target.checkpoint)) if target.checkpoint else None  # refused before building
    with library_logs(verbose) as libs:
        if target.run_dir is not None:
            libs.attach(target.run_dir)
        return _evaluate_built(
            target, build_backend(cfg), state, ks, samples, queries, split, seed, threshold, chunk_problems, t0
        )


def _evaluate_built(target, built, state, ks, samples, queries, split, seed, threshold, chunk_problems, t0) -> dict:
    from rtpo.scenario.load import ConfigError

    cfg = target.cfg
    try:
        spec = built.sampled_eval
        if spec is None:
            raise ConfigError(f"backend.kind: backend {cfg.backend.kind!r} provides no sampled evaluation")
        if split not in spec.splits:
            raise ConfigError(f"--split: {split!r} is not a split of this backend (valid: {', '.join(spec.splits)})")
        size = spec.splits[split].num_problems
        if queries is None or queries == "all":
            count = size if size is not None else spec.default_problems
        else:
            count = int(queries)
            if count < 1:
                raise ConfigError(f"--queries: must be >= 1 or 'all', got {queries}")
            if size is not None and count > size:
                raise ConfigError(f"--queries: {count} > the {size} problems of the {split} split")
        ckpt = load_checkpoint_policy(target.checkpoint, built.ctx.learner, state) if target.checkpoint else None
        seed = cfg.seed + IN_RUN_SEED_OFFSET if seed is None else int(seed)
        res = sample_and_score(spec, np.arange(count, dtype=np.int64), samples, seed, split, threshold, chunk_problems)
        exact = spec.exact() if spec.exact is not None else None
    finally:
        if isinstance(built.ctx, Closeable):
            built.ctx.shutdown()
    return _jsonable(
        {
            "target": {
                "kind": target.kind,
                "path": str(target.path),
                "run_dir": str(target.run_dir) if target.run_dir else None,
                "checkpoint": ckpt,
            },
            "scenario": cfg.name,
            "backend": cfg.backend.kind,
            "method": cfg.method.name,
            "split": split,
            "seed": seed,
            "k": ks,
            "success_threshold": res.threshold,
            "sampling": dict(spec.settings),
            **res.summary(ks),
            "exact": exact,
            "env_counters": res.counters,
            "per_problem": {"query_id": res.query_ids.tolist(), "successes": res.successes.tolist()},
            "wall_s": time.perf_counter() - t0,
        }
    )


def default_out(target: EvalTarget, split: str) -> Path:
    """<run folder>/eval.json for a run's latest checkpoint (eval-train.json for the train split;
    eval-iter_N.json for checkpoint ckpt/iter_N), else ./eval-<name>.json."""
    suffix = "" if split == "eval" else f"-{split}"
    if target.run_dir is not None:
        from rtpo.rundir.checkpoint import latest_path

        ckpt = target.checkpoint
        if ckpt is not None and ckpt != latest_path(target.run_dir) and ckpt.parent.name.startswith("iter_"):
            return target.run_dir / f"eval-{ckpt.parent.name}{suffix}.json"
        return target.run_dir / f"eval{suffix}.json"
    return Path(f"eval-{target.cfg.name}{suffix}.json")


def format_table(report: dict[str, Any]) -> str:
    """The compact table `rtpo eval` prints."""

    def fmt(v: Any) -> str:
        if v is None:
            return "-"
        return f"{v:.4f}" if isinstance(v, float) else str(v)

    t = report["target"]
    where = t["path"]
    if t["checkpoint"]:
        where += f" (checkpoint: iteration {t['checkpoint']['iteration']}, phase {t['checkpoint']['global_phase']})"
    settings = " ".join(f"{k}={v}" for k, v in report["sampling"].items())
    rows = [(f"pass@{k}", report[f"pass@{k}"]) for k in sorted({1, *report["k"]})]
    rows += [
        ("mean reward", report["reward_mean"]),
        ("tokens / episode", report["tokens_mean"]),
        ("turns / episode", report["turns_mean"]),
        ("tool calls / episode", report["tool_calls_mean"]),
        ("tool success rate", report["tool_ok_rate"]),
        ("truncation rate", report["truncation_rate"]),
        ("malformed rate", report["malformed_rate"]),
        ("context overflow rate", report["context_overflow_rate"]),
    ]
    if report.get("exact"):
        rows += [(f"exact {k}", v) for k, v in report["exact"].items()]
    width = max(len(name) for name, _ in rows)
    lines = [
        f"{report['scenario']} / {report['backend']} / {report['method']}: {where}",
        f"{report['split']} split: {report['num_problems']} problems x {report['samples_per_problem']} samples, "
        f"seed {report['seed']}, success = return > {report['success_threshold']:g}; {settings}",
        *(f"  {name:<{width}}  {fmt(v)}" for name, v in rows),
    ]
    return "\n".join(lines)


# -- the command ------------------------------------------------------------------------------------------
PROG = "rtpo eval"


def _parser() -> OneLineParser:
    p = OneLineParser(
        prog=PROG,
        description="Sample N episodes per problem from a policy and report Pass@k (unbiased "
        "estimator), mean reward, tokens, turns, tool calls, tool success, "
        "truncation and malformed rates; prints a table and writes JSON.",
    )
    p.add_argument(
        "target",
        metavar="TARGET",
        help="a scenario file (its initial policy), a run folder of `rtpo run` (its latest checkpoint's "
        "policy, or with --iter N the one after iteration N) or a checkpoint file in it, or a HF model "
        "folder with --scenario",
    )
    p.add_argument("--iter", type=int, metavar="N", help="with a run folder: the checkpoint after iteration N")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="scenario overrides as `rtpo run` takes them, e.g. backend.engine=hf task.eval_path=FILE",
    )
    p.add_argument("--samples", type=int, metavar="N", help="samples per problem (default: the largest k)")
    p.add_argument("--k", default="1", metavar="K1,K2,...", help="k values of pass@k (default: 1)")
    p.add_argument(
        "--queries",
        metavar="Q",
        help="problems to evaluate: a count or 'all' (default: the whole split; tabular: 1024 start-state draws)",
    )
    p.add_argument("--split", default="eval", choices=("eval", "train"), help="held-out or training problems")
    p.add_argument(
        "--seed",
        type=int,
        metavar="S",
        help="sampling seed (default: scenario seed + 7919, the seed of the in-run evaluation)",
    )
    p.add_argument("--threshold", type=float, metavar="T", help="success = return > T (default: 0)")
    p.add_argument("--chunk", type=int, metavar="P", help="problems per rollout call (default: all at once)")
    p.add_argument("--scenario", metavar="FILE", help="with a HF model folder TARGET: the scenario to evaluate it in")
    p.add_argument("--out", metavar="FILE", help="JSON report (default: RUN/eval.json, or ./eval-<name>.json)")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="show vLLM/Ray/transformers log lines and warnings on the console (default: a run's RUN/logs/)",
    )
    add_plugin_option(p)
    return p


def _fail(message: object) -> int:
    return fail("rtpo", message)  # the one-line errors of `rtpo eval` read `rtpo: error: ...`


def main(argv: list[str]) -> int:
    """`rtpo eval ARGV`: print the table and write the JSON report; 2 (one line on stderr) on bad input,
    with nothing written."""
    parser = _parser()
    # overrides may follow options (TARGET --samples 4 backend.engine=hf): argparse hands back the
    # positionals it meets after an option as unknown, so they are collected here
    ns, extra = parser.parse_known_args(argv)
    bad = [a for a in extra if a.startswith("-") or "=" not in a]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)}")
    ns.overrides = [*ns.overrides, *extra]
    return command(ns)


def command(ns: argparse.Namespace) -> int:
    """The command on parsed arguments: validate, resolve the target, evaluate, print, write."""
    from rtpo.scenario.load import ConfigError

    target, overrides = ns.target, ns.overrides
    if "=" in target and not Path(target).exists():
        return _fail(f"eval needs a TARGET (scenario file, run folder or checkpoint) before overrides, got {target!r}")
    try:
        ks = parse_ks(ns.k)
        if ns.samples is not None and ns.samples < 1:
            return _fail(f"--samples: must be >= 1, got {ns.samples}")
        if ns.samples is not None and ks[-1] > ns.samples:
            return _fail(f"--k: k={ks[-1]} > --samples {ns.samples} (pass@k needs at least k samples per problem)")
        queries = ns.queries
        if queries is not None and queries != "all":
            if not queries.isdigit() or int(queries) < 1:
                return _fail(f"--queries: must be a positive integer or 'all', got {queries!r}")
            queries = int(queries)
        if ns.chunk is not None and ns.chunk < 1:
            return _fail(f"--chunk: must be >= 1, got {ns.chunk}")
        from rtpo.scenario import plugins

        plugins.load(getattr(ns, "plugin", None), "--plugin")  # a run folder's recorded ones load with its config
        tgt = resolve_target(target, overrides, ns.scenario, ns.iter)
        out = Path(ns.out) if ns.out else default_out(tgt, ns.split)
        report = evaluate_target(tgt, ks, ns.samples, queries, ns.split, ns.seed, ns.threshold, ns.chunk, ns.verbose)
    except (ConfigError, ValueError) as e:
        return _fail(str(e))
    print(format_table(report))
    try:
        write_json(out, report)
    except OSError as e:
        return _fail(f"--out {out}: cannot write the report ({e})")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
