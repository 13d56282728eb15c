"""The `rtpo compare` command (rtpo.compare): arguments, the jobs, the runs, and the outputs rewritten
after every finished run so that nothing computed is lost."""

from __future__ import annotations

import time
from pathlib import Path

from rtpo.commands.common import OneLineParser, add_plugin_option, fail, write_json
from rtpo.compare.jobs import build_jobs
from rtpo.compare.plots import write_plots
from rtpo.compare.runner import Outcome, _init_worker, run_all
from rtpo.compare.tables import aggregate, settings_lines, table_markdown
from rtpo.compare.tuning import DEFAULT_TUNE_SEEDS, Selection, Tune, reported_jobs_with, select, tuning_lines

PROG = "rtpo compare"
DEFAULT_METHODS = "rtpo,grpo,seeupo"


def write_outputs(outcomes: list[Outcome], meta: dict, out: Path, plots: bool) -> list[dict]:
    """comparison.json and comparison.md (and with `plots` the figures) of the outcomes so far."""
    rows = aggregate(outcomes)
    order = {(p, lab): i for i, (p, lab) in enumerate(meta["order"])}
    rows.sort(key=lambda r: order.get((r["sweep"], r["method"]), 0))
    if plots:
        write_plots(outcomes, rows, meta, out)
    payload = {**{k: v for k, v in meta.items() if k != "order"}, "rows": rows}
    write_json(out / "comparison.json", payload, default=float)
    (out / "comparison.md").write_text(table_markdown(rows, meta))
    return rows


def _parser() -> OneLineParser:
    p = OneLineParser(prog=PROG, description="equal-budget comparison of methods over seeds")
    p.add_argument("args", nargs="*", metavar="[SCENARIO] [key=value ...]")
    p.add_argument(
        "--methods", default=DEFAULT_METHODS, help=f"comma-separated method specs (default {DEFAULT_METHODS})"
    )
    p.add_argument("--seeds", type=int, default=3, help="seeds per method (default 3)")
    p.add_argument("--sweep", metavar="KEY=V1,V2,...", help="repeat the comparison for each value of KEY")
    p.add_argument(
        "--tune",
        metavar="KEY=V1,V2,...",
        help="tune KEY per method on separate tuning seeds, then report each method at its best value",
    )
    p.add_argument(
        "--tune-seeds",
        type=int,
        default=DEFAULT_TUNE_SEEDS,
        help=f"tuning seeds per candidate, after the reported ones (default {DEFAULT_TUNE_SEEDS}: "
        "bench/tune_stability.json)",
    )
    p.add_argument(
        "--runs",
        nargs="+",
        metavar="RUN",
        help="compare existing run folders (same scenario; seeds of a method are its runs) instead of running",
    )
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--out", default="runs", help="folder that receives the comparison folder (default runs)")
    add_plugin_option(p)
    return p


def main(argv: list[str]) -> int:
    """`rtpo compare ARGV`: 0 when every run finished, 1 when one failed (it is in the table), 2 on bad input."""
    from rtpo.scenario.load import ConfigError

    _init_worker()  # single-threaded torch here too (and before any fork)
    ns = _parser().parse_intermixed_args(argv)
    args = list(ns.args)
    if ns.runs:
        return _from_runs(ns, args, argv)
    scenario = args.pop(0) if args and "=" not in args[0] else None
    if ns.seeds < 1:
        return fail(PROG, "--seeds must be >= 1")
    if ns.workers < 1:
        return fail(PROG, "--workers must be >= 1")
    sweep = None
    if ns.sweep:
        key, eq, vals = ns.sweep.partition("=")
        values = [v.strip() for v in vals.split(",") if v.strip()]
        if not eq or not key.strip() or not values:
            return fail(PROG, f"--sweep {ns.sweep!r}: must look like key=v1,v2,...")
        sweep = (key.strip(), values)
    specs = [s for s in ns.methods.split(",") if s.strip()]
    if not specs:
        return fail(PROG, "--methods: no method given")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    try:
        raw_stem = Path(scenario).stem if scenario else "default"
        out = Path(ns.out) / f"compare-{raw_stem}-{stamp}"
        tune = Tune.parse(ns.tune, ns.tune_seeds) if ns.tune else None
        if tune is None:
            jobs, meta = build_jobs(scenario, specs, ns.seeds, args, sweep, out, plugins=ns.plugin)
        else:
            jobs, meta = _tune(scenario, specs, ns, args, sweep, out, tune)
    except ConfigError as e:
        return fail(PROG, str(e))
    out.mkdir(parents=True, exist_ok=True)
    meta.update(
        {
            "command": "rtpo compare " + " ".join(argv),
            "seeds": ns.seeds,
            "sweep_key": sweep[0] if sweep else None,
            "order": meta.get("order") or list(dict.fromkeys((j.sweep, j.label) for j in jobs)),
        }
    )
    print(
        f"rtpo compare: {len(jobs)} runs ({len(specs)} methods × {ns.seeds} seeds"
        + (f" × {len(sweep[1])} values of {sweep[0]}" if sweep else "")
        + f") -> {out}",
        flush=True,
    )
    for line in settings_lines([{"method": j.label, "settings": j.settings, "sweep": j.sweep} for j in jobs]):
        print("  " + line.removeprefix("- "), flush=True)
    t0 = time.perf_counter()

    def on_done(outcomes: list[Outcome]) -> None:
        o = outcomes[-1]
        tag = f"{o.job.label} seed {o.job.seed}" + ("" if o.job.sweep is None else f" {sweep[0]}={o.job.sweep}")
        if o.error:
            print(f"  [{len(outcomes)}/{len(jobs)}] {tag}: FAILED {o.error}", flush=True)
        else:
            v = o.summary.get("value_over_optimum")
            vs = f"value/V* {v:.3f}" if v is not None else f"value {o.summary.get('final_value')}"
            print(
                f"  [{len(outcomes)}/{len(jobs)}] {tag}: {vs}, {o.summary.get('rollouts')} rollouts, "
                f"{o.summary.get('wall_s', 0):.1f} s",
                flush=True,
            )
        write_outputs(outcomes, meta, out, plots=False)  # the table so far, so nothing is lost

    outcomes = run_all(jobs, ns.workers, on_done)
    write_outputs(outcomes, meta, out, plots=True)
    print((out / "comparison.md").read_text())
    print(f"rtpo compare: done in {time.perf_counter() - t0:.0f} s; {out}")
    return 1 if any(o.error for o in outcomes) else 0


def _from_runs(ns, args: list[str], argv: list[str]) -> int:
    """--runs RUN...: the tables and figures of existing run folders (rtpo.compare.existing); runs nothing."""
    from rtpo.compare.existing import from_runs
    from rtpo.scenario.load import ConfigError

    overrides = [r for r in ns.runs if "=" in r and not Path(r).exists()]  # --runs A B key=v takes them in
    given = [*args, *overrides] + [f"--{k} {getattr(ns, k)}" for k in ("sweep", "tune") if getattr(ns, k)]
    if given:
        return fail(PROG, f"--runs compares existing folders; it takes no scenario, override or option ({given[0]})")
    try:
        outcomes, meta = from_runs(ns.runs)
    except ConfigError as e:
        return fail(PROG, str(e))
    out = Path(ns.out) / f"compare-runs-{meta['scenario']}-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    meta["command"] = "rtpo compare " + " ".join(argv)
    write_outputs(outcomes, meta, out, plots=True)
    print((out / "comparison.md").read_text())
    print(f"rtpo compare --runs: {len(outcomes)} run folders; {out}")
    return 0


def _tune(scenario, specs: list[str], ns, args: list[str], sweep, out: Path, tune: Tune) -> tuple[list, dict]:
    """--tune (rtpo.compare.tuning): run every candidate of the tuned specs on the tuning seeds, pick
    each (sweep value, spec)'s best, and return the reported jobs (chosen values; untuned specs as
    given) with the selection in meta."""
    from rtpo.scenario.load import ConfigError

    tuned = [s for s in specs if tune.applies_to(s)]
    if not tuned:
        raise ConfigError(f"--tune {tune.key}: applies to none of the compared methods")
    untuned = [s for s in specs if s not in tuned]
    opts = {"plugins": ns.plugin}
    tuning: dict[str, list] = {}
    reported: dict[str, list] = {}
    meta: dict = {}
    for v in tune.values:
        ov = [*args, f"{tune.key}={v}"]
        tuning[v], _ = build_jobs(
            scenario, tuned, tune.seeds, ov, sweep, out / "tuning" / f"{tune.key}={v}", seed_offset=ns.seeds, **opts
        )
        reported[v], m = build_jobs(scenario, tuned, ns.seeds, ov, sweep, out, **opts)
        meta = meta or m
    fixed, m = build_jobs(scenario, untuned, ns.seeds, args, sweep, out, **opts) if untuned else ([], meta)
    meta = {**m, **meta} if untuned else meta
    all_tuning = [j for v in tune.values for j in tuning[v]]
    print(
        f"rtpo compare --tune {tune.key}: {len(all_tuning)} tuning runs ({len(tuned)} methods × "
        f"{len(tune.values)} values × {tune.seeds} tuning seeds"
        + (f" × {len(sweep[1])} values of {sweep[0]}" if sweep else "")
        + ")",
        flush=True,
    )
    done = run_all(all_tuning, ns.workers, lambda outs: None)
    root_of = {j.out_root: v for v in tune.values for j in tuning[v]}  # each candidate has its own folder
    by_value: dict[str, list] = {v: [] for v in tune.values}
    for o in done:
        by_value[root_of[o.job.out_root]].append(o)
    selections = select(tune, by_value)
    points = [None] if sweep is None else list(sweep[1])
    order = [(p, s.strip()) for p in points for s in specs]
    sels_all = [selections.get(k) or Selection(k[0], k[1]) for k in order]
    reported_seeds = [int(j.seed) for j in (reported[tune.values[0]] or fixed)]
    lines = tuning_lines(tune, sels_all, sorted(set(reported_seeds)), sweep[0] if sweep else None)
    for line in lines:
        print("  " + line, flush=True)
    jobs = reported_jobs_with(reported, fixed, selections)
    rank = {k: i for i, k in enumerate(order)}
    jobs.sort(key=lambda j: (rank[(j.sweep, j.label)], j.seed))
    meta["order"] = order
    meta["tuning"] = {
        "key": tune.key,
        "values": list(tune.values),
        "seeds": tune.seeds,
        "selections": [s.as_dict() for s in sels_all],
    }
    meta["tuning_lines"] = lines
    return jobs, meta
