"""The `rtpo` command: run a scenario, solve it exactly, and dispatch to `eval`, `verify` and `compare`.

    rtpo run [SCENARIO] [key=value ...] [--out DIR] [--no-progress] [--verbose]
    rtpo run --resume RUN_DIR [budget.KEY=value | logging.KEY=value ...] [--iter N [--out DIR]]
    rtpo solve SCENARIO [key=value ...]
    rtpo plan SCENARIO [key=value ...] [--hardware NAME|FILE] [--assume KEY=VALUE ...] [--json]
    rtpo eval TARGET [key=value ...] [--samples N] [--k 1,4,8] [--queries Q|all] [--split eval|train]
              [--seed S] [--threshold T] [--out FILE]      (rtpo.commands.eval.main)
    rtpo export RUN [--iter N] OUT                           (rtpo.commands.export)
    rtpo report RUN [RUN ...] [--out FILE.html]              (rtpo.rundir.report)
    rtpo verify ...      (rtpo.verify.cli.main)
    rtpo compare ...     (rtpo.compare.main)

Bad input is one line on stderr and exit status 2 (rtpo.commands.common, which every command uses).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from rtpo.commands.common import USAGE_ERROR, OneLineParser, add_plugin_option, fail, one_line


def _fail(message: str) -> int:
    return fail("rtpo", message)


def _split_scenario(args: list[str]) -> tuple[str | None, list[str]]:
    """The first positional is the scenario file unless it is already a key=value override."""
    if args and "=" not in args[0]:
        return args[0], args[1:]
    return None, args


def _overrides_only(args: list[str]) -> bool:
    return all("=" in a and not a.startswith("-") for a in args)


def _parser() -> argparse.ArgumentParser:
    from rtpo import __version__

    p = OneLineParser(prog="rtpo", description="Reverse-Turn Policy Optimization testbed")
    p.add_argument("--version", action="version", version=f"rtpo {__version__}")
    sub = p.add_subparsers(
        dest="command",
        metavar="{run,solve,plan,eval,export,verify,compare,config,scenarios,plot,report}",
        parser_class=OneLineParser,
    )
    run = sub.add_parser("run", help="train on a scenario (default: the embedded default scenario)")
    run.add_argument(
        "args",
        nargs="*",
        metavar="[SCENARIO] [key=value ...]",
        help="a scenario file or a shipped scenario's name (rtpo scenarios), then overrides such as method.G=6",
    )
    run.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue a run from its latest checkpoint; budget.*/logging.* overrides extend or change it "
        "(e.g. budget.iterations=40 continues a finished run)",
    )
    run.add_argument(
        "--iter",
        type=int,
        metavar="N",
        help="with --resume: start from the checkpoint after iteration N, in a new run folder under --out",
    )
    run.add_argument("--out", metavar="DIR", default="runs", help="folder that receives the run folder (default: runs)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument(
        "--verbose",
        action="store_true",
        help="show vLLM/Ray/transformers log lines and warnings on the console (default: RUN/logs/)",
    )
    add_plugin_option(run)
    solve = sub.add_parser("solve", help="exact optimum and recursively optimal policy of a scenario")
    solve.add_argument("args", nargs="+", metavar="SCENARIO [key=value ...]")
    add_plugin_option(solve)
    plan = sub.add_parser(
        "plan",
        help="what an llm scenario costs before it starts: counts, tokens, memory per worker, time",
        description="Per phase and per iteration: trunks, boundaries, siblings, tokens generated and trained, "
        "each worker's memory and a time estimate on an accelerator (docs/plan.md).  Exit 3 when it does not fit.",
    )
    plan.add_argument("args", nargs="+", metavar="SCENARIO [key=value ...]")
    plan.add_argument(
        "--hardware",
        metavar="NAME|FILE",
        default=None,
        help="accelerator: H100-80GB, H200, A100-80GB, A100-40GB, L40S, cpu, or a YAML file with your own "
        "(default: backend.hardware, else this machine)",
    )
    plan.add_argument(
        "--assume",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="episode shape: reach (next-turn probability), fill (share of max_tokens), prompt_tokens, "
        "tool_tokens, think_share (default: the upper bounds reach=1 fill=1)",
    )
    plan.add_argument("--json", action="store_true", help="the plan as JSON")
    add_plugin_option(plan)
    sub.add_parser(
        "eval",
        help="Pass@k, reward, tokens, turns, tool calls, truncation of a policy (rtpo.commands.eval)",
        add_help=False,
    )
    exp = sub.add_parser(
        "export",
        help="write an llm run's policy as a Hugging Face model folder (transformers, vLLM)",
        description="Write the policy of a run's checkpoint as a Hugging Face folder: safetensors, config, "
        "tokenizer, generation config, and rtpo_export.json naming the checkpoint.",
    )
    exp.add_argument("run", metavar="RUN", help="a run folder written by `rtpo run`")
    exp.add_argument("out", metavar="OUT", help="the model folder to write (new, or an empty folder)")
    exp.add_argument("--iter", type=int, metavar="N", help="the checkpoint after iteration N (default: the latest)")
    cfg = sub.add_parser("config", help="show a resolved scenario with every key's meaning, or the JSON Schema")
    cfg_sub = cfg.add_subparsers(dest="config_command", metavar="{show,schema}", parser_class=OneLineParser)
    show = cfg_sub.add_parser("show", help="the fully resolved scenario, every key commented (a valid scenario file)")
    show.add_argument("args", nargs="*", metavar="[SCENARIO] [key=value ...]")
    add_plugin_option(show)
    schema = cfg_sub.add_parser("schema", help="JSON Schema of scenario files (every method, backend and task kind)")
    add_plugin_option(schema)
    sub.add_parser("scenarios", help="the shipped scenarios: name, file, what it is (rtpo run NAME runs one)")
    plot = sub.add_parser("plot", help="learning curves of existing run folders (mean and band over seeds)")
    plot.add_argument(
        "runs", nargs="+", metavar="RUN", help="run folders written by `rtpo run` (seeds of one method group)"
    )
    plot.add_argument("--metric", default=None, help="metric key (default: the backend's value, eval/value)")
    plot.add_argument("--x", default="budget/rollouts", help="x axis key (default: budget/rollouts)")
    plot.add_argument("--out", default="curves.png", help="output file; .svg or .pdf for vector output")
    report = sub.add_parser(
        "report", help="one self-contained HTML page of run folders: curves, per-turn statistics, config, samples"
    )
    report.add_argument("runs", nargs="+", metavar="RUN", help="run folders written by `rtpo run` (several: compared)")
    report.add_argument("--out", default=None, help="the page to write (default RUN/report.html; needed for several)")
    sub.add_parser("verify", help="property tests of the paper's claims (rtpo.verify)", add_help=False)
    sub.add_parser("compare", help="equal-budget method comparison (rtpo.compare)", add_help=False)
    return p


def _dispatch(module: str, argv: list[str]) -> int:
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and (module == e.name or module.startswith(e.name + ".")):
            return _fail(f"{module} is not available in this installation ({e.name} is missing)")
        raise
    rc = mod.main(argv)
    return int(rc or 0)


def _cmd_run(ns: argparse.Namespace) -> int:
    from rtpo.rundir.runner import RunWriteError, TrainingDiverged, run_scenario
    from rtpo.rundir.trackers import TrackerError
    from rtpo.scenario.load import ConfigError, load_scenario

    scenario, overrides = _split_scenario(ns.args)
    try:
        if ns.resume is not None:
            if scenario is not None:
                return _fail(
                    f"--resume continues a run with its own config.yaml; give no scenario ({scenario!r}), "
                    "only budget.* or logging.* overrides"
                )
            if ns.plugin:
                return _fail(
                    "--plugin goes with a new run: --resume loads the plugins recorded in the run's config.yaml"
                )
            result = run_scenario(
                None,
                out_root=Path(ns.out),
                resume=ns.resume,
                progress=not ns.no_progress,
                overrides=overrides,
                iteration=ns.iter,
                verbose=ns.verbose,
            )
        else:
            if ns.iter is not None:
                return _fail("--iter N goes with --resume RUN_DIR (or with rtpo eval / rtpo export)")
            cfg = load_scenario(scenario, overrides, plugins=ns.plugin)
            result = run_scenario(cfg, out_root=Path(ns.out), progress=not ns.no_progress, verbose=ns.verbose)
    except (ConfigError, TrackerError) as e:
        return _fail(str(e))
    except (TrainingDiverged, RunWriteError) as e:  # not bad input: the run itself failed, state kept
        print(f"rtpo: error: {one_line(e)}", file=sys.stderr, flush=True)
        return 1
    s = result.summary
    if s["stopped_by"] == "interrupted":
        print(f"interrupted; resume with: rtpo run --resume {result.run_dir}", file=sys.stderr, flush=True)
        return 130
    line = f"run folder: {result.run_dir}\nfinal value {s['final_value']:.6g}"
    if s["value_over_optimum"] is not None:
        line += (
            f" = {s['value_over_optimum']:.4f} x optimum {s['optimum']:.6g}"
            f" ({'reached' if s['reached_target'] else 'below'} target {s['target']})"
        )
    line += f"; {s['rollouts']} rollouts, {s['wall_s']:.1f} s"
    print(line)
    return 0


def _cmd_solve(ns: argparse.Namespace) -> int:
    from rtpo.scenario.backends import get_backend
    from rtpo.scenario.load import ConfigError, load_scenario

    scenario, overrides = _split_scenario(ns.args)
    if scenario is None:
        return _fail("solve needs a scenario file")
    try:
        cfg = load_scenario(scenario, overrides, plugins=ns.plugin)
        spec = get_backend(cfg.backend.kind)
        if spec.solve is None:
            return _fail(f"backend {cfg.backend.kind!r} has no exact solver")
        print(spec.solve(cfg))
    except ConfigError as e:
        return _fail(str(e))
    return 0


def _cmd_plan(ns: argparse.Namespace) -> int:
    import json

    from rtpo.plan import Assumptions, plan, render
    from rtpo.scenario.load import ConfigError, load_scenario

    scenario, overrides = _split_scenario(ns.args)
    if scenario is None:
        return _fail("plan needs a scenario file")
    try:
        cfg = load_scenario(scenario, overrides, plugins=ns.plugin)
        p = plan(cfg, ns.hardware, Assumptions.parse(ns.assume))
    except ConfigError as e:
        return _fail(str(e))
    print(json.dumps(p.to_dict(), indent=2) if ns.json else render(p), end="" if not ns.json else "\n")
    return 0 if p.fits else 3


def _cmd_export(ns: argparse.Namespace) -> int:
    from rtpo.commands.export import export_run
    from rtpo.scenario.load import ConfigError

    try:
        out = export_run(ns.run, ns.out, ns.iter)
    except ConfigError as e:
        return _fail(str(e))
    print(f"wrote {out}")
    return 0


def _cmd_config(ns: argparse.Namespace) -> int:
    import json

    from rtpo.scenario import docs as configdoc
    from rtpo.scenario import plugins
    from rtpo.scenario.load import ConfigError, load_scenario

    if ns.config_command == "schema":
        try:
            plugins.load(ns.plugin, "--plugin")
        except ConfigError as e:
            return _fail(str(e))
        print(json.dumps(configdoc.schema(), indent=2, default=str))
        return 0
    if ns.config_command != "show":
        return _fail("config needs a subcommand: show [SCENARIO] [key=value ...] | schema")
    scenario, overrides = _split_scenario(ns.args)
    try:
        print(configdoc.show(load_scenario(scenario, overrides, plugins=ns.plugin)), end="")
    except ConfigError as e:
        return _fail(str(e))
    return 0


def shipped_scenarios() -> list[tuple[str, str, str]]:
    """(name, where it lives, first comment line) of every scenario shipped in the package, the embedded
    default (what `rtpo run` with no scenario runs) first."""
    from rtpo.scenario.shipped import DEFAULT, shipped

    found = sorted(shipped(), key=lambda s: (s.qualified != DEFAULT, s.kind, s.name))
    return [(s.name, str(s.path), _first_comment(s.path.read_text(errors="replace"))) for s in found]


def _first_comment(text: str) -> str:
    for line in text.splitlines():
        if line.startswith("#") and line.strip("# "):
            return line.lstrip("# ").strip()
    return ""


def _cmd_scenarios() -> int:
    """NAME  FILE  first comment line, one scenario a line: `rtpo run NAME` runs FILE."""
    rows = shipped_scenarios()
    w_name = max(len(n) for n, _, _ in rows)
    w_path = max(len(p) for _, p, _ in rows)
    for name, path, doc in rows:
        print(f"{name:<{w_name}}  {path:<{w_path}}  {doc}".rstrip())
    return 0


def _cmd_plot(ns: argparse.Namespace) -> int:
    from rtpo.rundir.checkpoint import CONFIG, read_metrics
    from rtpo.rundir.plots import run_curves
    from rtpo.scenario.load import ConfigError, load_scenario

    groups: dict[str, list[list[dict]]] = {}
    for run in ns.runs:
        d = Path(run)
        if not (d / CONFIG).is_file():
            return _fail(f"{run}: not a run folder (no {CONFIG})")
        try:
            cfg = load_scenario(d / CONFIG)
        except ConfigError as e:
            return _fail(str(e))
        groups.setdefault(f"{cfg.name} {cfg.method.name}", []).append(read_metrics(d))
    metric = ns.metric or "eval/value"
    out = Path(ns.out)
    if out.suffix.lower() not in (".png", ".svg", ".pdf"):
        return _fail(f"--out {out}: must end in .png, .svg or .pdf")
    if run_curves(groups, out, metric, ns.x) is None:
        return _fail(f"--metric {metric}: no run folder has it with {ns.x}")
    print(f"wrote {out}")
    return 0


def _cmd_report(ns: argparse.Namespace) -> int:
    from rtpo.rundir.report import ReportError, write_report

    try:
        out = write_report(ns.runs, ns.out)
    except ReportError as e:
        return _fail(str(e))
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # verify/compare/eval own their arguments entirely: hand everything after the subcommand over untouched
    if argv and argv[0] == "verify":
        return _dispatch("rtpo.verify.cli", argv[1:])
    if argv and argv[0] == "compare":
        return _dispatch("rtpo.compare", argv[1:])
    if argv and argv[0] == "eval":
        return _dispatch("rtpo.commands.eval", argv[1:])
    parser = _parser()
    # `rtpo run FILE --out D key=val`: overrides may follow the options, as `rtpo compare` accepts
    ns, extra = parser.parse_known_args(argv)
    if extra:
        if ns.command not in ("run", "solve", "config") or not hasattr(ns, "args") or not _overrides_only(extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        ns.args = [*ns.args, *extra]
    if ns.command == "run":
        return _cmd_run(ns)
    if ns.command == "solve":
        return _cmd_solve(ns)
    if ns.command == "plan":
        return _cmd_plan(ns)
    if ns.command == "export":
        return _cmd_export(ns)
    if ns.command == "config":
        return _cmd_config(ns)
    if ns.command == "scenarios":
        return _cmd_scenarios()
    if ns.command == "plot":
        return _cmd_plot(ns)
    if ns.command == "report":
        return _cmd_report(ns)
    parser.print_help(sys.stderr)
    return USAGE_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
