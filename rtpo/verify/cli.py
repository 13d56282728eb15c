"""`rtpo verify`: run the claim suite, run it against every mutant, or print the claim report.

rtpo verify                 pytest rtpo/verify (extra pytest arguments after `--`)
rtpo verify --mutants       each mutant in its own subprocess (two at a time) against its claim
                            modules; prints which tests killed it; exit 1 if any survives
rtpo verify --report        claim | status | measured figures
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from rtpo.commands.common import OneLineParser, fail

VERIFY_DIR = Path(__file__).resolve().parent
REPO_ROOT = VERIFY_DIR.parents[1]
CLAIMS = ("T1a", "T1b", "T1c", "T2a", "T2b", "T2c", "T2d", "T3a", "T3b", "IS1", "IS2", "MM1", "CS1")
_CLAIM_RE = re.compile(r"test_(" + "|".join(CLAIMS) + r")_")


@dataclass(frozen=True)
class PytestRun:
    returncode: int
    passed: tuple[str, ...]
    failed: tuple[str, ...]  # failures and errors, as "file.py::test_name"
    output: str


def run_pytest(
    targets: list[str], mutant: str | None = None, extra: list[str] | None = None, capture: bool = True
) -> PytestRun:
    """pytest in a subprocess (a mutant patches process-wide names), results read from a JUnit XML file."""
    env = dict(os.environ)
    env.pop("RTPO_MUTANT", None)
    if mutant:
        env["RTPO_MUTANT"] = mutant
    env.setdefault("HYPOTHESIS_PROFILE", "ci")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    with tempfile.TemporaryDirectory(prefix="rtpo-verify-") as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            *targets,
            "-q",
            "-p",
            "no:cacheprovider",
            "-W",
            "ignore::UserWarning",
            f"--junitxml={junit}",
            *(extra or []),
        ]
        proc = subprocess.run(
            cmd,
            cwd=REPO_ROOT,
            env=env,
            text=True,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.STDOUT if capture else None,
        )
        passed, failed = _read_junit(junit)
    return PytestRun(proc.returncode, passed, failed, proc.stdout or "")


def _read_junit(path: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if not path.exists():
        return (), ()
    passed, failed = [], []
    for case in ET.parse(path).getroot().iter("testcase"):
        module = (case.get("classname") or "").rsplit(".", 1)[-1]
        name = f"{module}.py::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(name)
        elif case.find("skipped") is None:
            passed.append(name)
    return tuple(passed), tuple(failed)


def _targets_for(mutant_name: str, fast: bool) -> tuple[list[str], list[str]]:
    from rtpo.verify import mutants

    m = mutants.get(mutant_name)
    if fast:
        return [str(REPO_ROOT / k) for k in mutants.killer_nodes(mutant_name)], ["-x"]
    return [str(VERIFY_DIR / f) for f in m.modules], []


def run_mutants(names: list[str] | None = None, fast: bool = False, jobs: int = 2) -> dict[str, PytestRun]:
    """Run each mutant (a subprocess each, `jobs` at a time); returns mutant -> its pytest run."""
    from rtpo.verify import mutants

    names = names or mutants.names()

    def one(name: str) -> tuple[str, PytestRun]:
        targets, extra = _targets_for(name, fast)
        return name, run_pytest(targets, mutant=name, extra=extra)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return dict(pool.map(one, names))


def _mutants_main(args: argparse.Namespace) -> int:
    from rtpo.verify import mutants

    names = args.only or mutants.names()
    for n in names:
        mutants.get(n)  # unknown names fail here with the valid list
    union = sorted({t for n in names for t in _targets_for(n, args.fast)[0]})
    clean = run_pytest(union)
    if clean.returncode != 0:
        print(f"rtpo verify: the claim tests fail without any mutant ({len(clean.failed)} failing); fix those first:")
        for t in clean.failed:
            print(f"  {t}")
        return 2
    results = run_mutants(names, fast=args.fast, jobs=args.jobs)
    survivors = []
    for name in names:
        res = results[name]
        killed = bool(res.failed) or res.returncode not in (0, 5)
        if not killed:
            survivors.append(name)
        status = "KILLED " if killed else "SURVIVED"
        print(f"{status} {name:24s} {mutants.get(name).description}")
        for t in res.failed:
            print(f"           by {t}")
        if killed and not res.failed:
            print(f"           (pytest exit code {res.returncode})")
    print(f"{len(names) - len(survivors)}/{len(names)} mutants killed")
    if survivors:
        print("survivors: " + ", ".join(survivors))
        return 1
    return 0


def _report_main(args: argparse.Namespace) -> int:
    from rtpo.verify import report

    run = run_pytest([str(VERIFY_DIR)])
    status: dict[str, list[int]] = {c: [0, 0] for c in CLAIMS}
    for name in run.passed + run.failed:
        for claim in set(_CLAIM_RE.findall(name.split("::")[-1])):
            status[claim][1] += 1
            status[claim][0] += name in run.passed
    figures = report.figures()
    rows = []
    for c in CLAIMS:
        ok, total = status[c]
        state = "no tests" if total == 0 else ("PASS" if ok == total else "FAIL")
        rows.append((c, f"{state} {ok}/{total}", figures.get(c, "")))
    width = max(len(r[1]) for r in rows)
    print(f"{'claim':6s} {'status':{width}s} measured")
    for c, st, fig in rows:
        lines = fig.split("\n") if fig else [""]
        print(f"{c:6s} {st:{width}s} {lines[0]}")
        for extra in lines[1:]:
            print(f"{'':6s} {'':{width}s} {extra}")
    return 0 if all(r[1].startswith("PASS") for r in rows) else 1


PROG = "rtpo verify"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, passthrough = argv[:i], argv[i + 1 :]
    p = OneLineParser(prog=PROG, description="Check the paper's claims (SPEC §4).")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--mutants", action="store_true", help="run the suite against every mutant; exit 1 if one survives"
    )
    mode.add_argument("--report", action="store_true", help="print claim, status and measured figures")
    p.add_argument("--only", action="append", metavar="MUTANT", help="with --mutants: just this mutant (repeatable)")
    p.add_argument("--fast", action="store_true", help="with --mutants: only each mutant's designated killer tests")
    p.add_argument("--jobs", type=int, default=2, help="with --mutants: mutants run in parallel (default 2)")
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.jobs < 1:
        return fail(PROG, "--jobs must be >= 1")
    if args.mutants:
        try:
            return _mutants_main(args)
        except KeyError as err:
            return fail(PROG, err.args[0])
    if args.report:
        return _report_main(args)
    # honour RTPO_MUTANT for a plain run too (run_pytest clears it unless asked)
    mutant = os.environ.get("RTPO_MUTANT", "").strip() or None
    return run_pytest([str(VERIFY_DIR)], mutant=mutant, extra=passthrough, capture=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
