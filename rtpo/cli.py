"""The `rtpo` command: run a scenario, solve it exactly, and dispatch to `verify` and `compare`.

    rtpo run [SCENARIO] [key=value ...] [--resume RUN_DIR] [--out DIR]
    rtpo solve SCENARIO [key=value ...]
    rtpo verify ...      (rtpo.verify.cli.main)
    rtpo compare ...     (rtpo.compare.main)

Bad input is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

USAGE_ERROR = 2


class _OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus the error over several lines; rtpo's contract is one line, exit 2."""

    def error(self, message: str):  # type: ignore[override]
        print(f"{self.prog}: error: {' '.join(message.split())}", file=sys.stderr)
        raise SystemExit(USAGE_ERROR)


def _fail(message: str) -> int:
    print(f"rtpo: error: {' '.join(str(message).split())}", file=sys.stderr)
    return USAGE_ERROR


def _split_scenario(args: list[str]) -> tuple[str | None, list[str]]:
    """The first positional is the scenario file unless it is already a key=value override."""
    if args and "=" not in args[0]:
        return args[0], args[1:]
    return None, args


def _parser() -> argparse.ArgumentParser:
    p = _OneLineParser(prog="rtpo", description="Reverse-Turn Policy Optimization testbed")
    sub = p.add_subparsers(dest="command", metavar="{run,solve,verify,compare}", parser_class=_OneLineParser)
    run = sub.add_parser("run", help="train on a scenario (default: the embedded default scenario)")
    run.add_argument("args", nargs="*", metavar="[SCENARIO] [key=value ...]",
                     help="scenario YAML file, then overrides such as method.G=6 budget.iterations=10")
    run.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run from its checkpoint")
    run.add_argument("--out", metavar="DIR", default="runs", help="folder that receives the run folder (default: runs)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    solve = sub.add_parser("solve", help="exact optimum and recursively optimal policy of a scenario")
    solve.add_argument("args", nargs="+", metavar="SCENARIO [key=value ...]")
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
    from rtpo.config import ConfigError, load_scenario
    from rtpo.run import run_scenario

    scenario, overrides = _split_scenario(ns.args)
    try:
        if ns.resume is not None:
            if scenario is not None or overrides:
                return _fail("--resume continues a run with its own config.yaml; give no scenario or overrides")
            result = run_scenario(None, out_root=Path(ns.out), resume=ns.resume, progress=not ns.no_progress)
        else:
            cfg = load_scenario(scenario, overrides)
            result = run_scenario(cfg, out_root=Path(ns.out), progress=not ns.no_progress)
    except ConfigError as e:
        return _fail(str(e))
    s = result.summary
    line = f"run folder: {result.run_dir}\nfinal value {s['final_value']:.6g}"
    if s["value_over_optimum"] is not None:
        line += (f" = {s['value_over_optimum']:.4f} x optimum {s['optimum']:.6g}"
                 f" ({'reached' if s['reached_target'] else 'below'} target {s['target']})")
    line += f"; {s['rollouts']} rollouts, {s['wall_s']:.1f} s"
    print(line)
    return 0


def _cmd_solve(ns: argparse.Namespace) -> int:
    from rtpo.backends import get_backend
    from rtpo.config import ConfigError, load_scenario

    scenario, overrides = _split_scenario(ns.args)
    if scenario is None:
        return _fail("solve needs a scenario file")
    try:
        cfg = load_scenario(scenario, overrides)
        spec = get_backend(cfg.backend.kind)
        if spec.solve is None:
            return _fail(f"backend {cfg.backend.kind!r} has no exact solver")
        print(spec.solve(cfg))
    except ConfigError as e:
        return _fail(str(e))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # verify/compare own their arguments entirely: hand everything after the subcommand over untouched
    if argv and argv[0] == "verify":
        return _dispatch("rtpo.verify.cli", argv[1:])
    if argv and argv[0] == "compare":
        return _dispatch("rtpo.compare", argv[1:])
    parser = _parser()
    ns = parser.parse_args(argv)
    if ns.command == "run":
        return _cmd_run(ns)
    if ns.command == "solve":
        return _cmd_solve(ns)
    parser.print_help(sys.stderr)
    return USAGE_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
