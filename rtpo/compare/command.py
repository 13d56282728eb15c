"""The `rtpo compare` command (rtpo.compare): arguments, the jobs, the runs, and the outputs rewritten
after every finished run so that nothing computed is lost."""

from __future__ import annotations

import time
from pathlib import Path

from rtpo.cliutil import OneLineParser, add_plugin_option, fail, write_json
from rtpo.compare.jobs import build_jobs
from rtpo.compare.plots import write_plots
from rtpo.compare.runner import Outcome, _init_worker, run_all
from rtpo.compare.tables import aggregate, settings_lines, table_markdown

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
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--out", default="runs", help="folder that receives the comparison folder (default runs)")
    add_plugin_option(p)
    return p


def main(argv: list[str]) -> int:
    """`rtpo compare ARGV`: 0 when every run finished, 1 when one failed (it is in the table), 2 on bad input."""
    from rtpo.config import ConfigError

    _init_worker()  # single-threaded torch here too (and before any fork)
    ns = _parser().parse_intermixed_args(argv)
    args = list(ns.args)
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
        jobs, meta = build_jobs(scenario, specs, ns.seeds, args, sweep, out, plugins=ns.plugin)
    except ConfigError as e:
        return fail(PROG, str(e))
    out.mkdir(parents=True, exist_ok=True)
    meta.update(
        {
            "command": "rtpo compare " + " ".join(argv),
            "seeds": ns.seeds,
            "sweep_key": sweep[0] if sweep else None,
            "order": list(dict.fromkeys((j.sweep, j.label) for j in jobs)),
        }
    )
    print(
        f"rtpo compare: {len(jobs)} runs ({len(specs)} methods × {ns.seeds} seeds"
        + (f" × {len(sweep[1])} values of {sweep[0]}" if sweep else "")
        + f") -> {out}",
        flush=True,
    )
    seen: dict[str, dict] = {}
    for j in jobs:
        seen.setdefault(j.label, j.settings)
    for line in settings_lines([{"method": m, "settings": st} for m, st in seen.items()]):
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
