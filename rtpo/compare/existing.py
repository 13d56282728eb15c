"""`rtpo compare --runs RUN...` (rtpo.compare): the comparison's tables and figures over run folders that
exist already (written by `rtpo run` or by an earlier `rtpo compare`), without running anything.

Each folder gives its config.yaml (method, its settings, seed), summary.json (the finished run's result)
and metrics.jsonl (the curve).  Rows are methods: the method's name, plus `:key=value` for each
method setting that differs between the given runs of that method (`rtpo:G=3`, `rtpo:G=8`); the seeds
of a row are its runs, so the bands and intervals are over seeds exactly as in `rtpo compare`.  Every
run must be of the same scenario: the runs may differ only in method, seed, budget and logging, else the
first differing key is named.  The budget is not imposed here: the table says each row's real spend.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rtpo.compare.jobs import Job
from rtpo.compare.runner import CURVE_KEYS, Outcome

FREE = ("method", "seed", "budget", "logging")  # what runs compared side by side may differ in


def _flat(prefix: str, data, out: dict) -> dict:
    if isinstance(data, dict):
        for k, v in data.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = data
    return out


def _load(run_dir: Path) -> tuple[dict, dict, list[dict], dict]:
    from rtpo.compare.jobs import resolved_settings
    from rtpo.rundir.checkpoint import read_metrics
    from rtpo.scenario.load import ConfigError, load_scenario

    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"--runs {run_dir}: not a run folder (no config.yaml)")
    if not (run_dir / "summary.json").is_file():
        raise ConfigError(
            f"--runs {run_dir}: the run has not finished (no summary.json); `rtpo run --resume {run_dir}` finishes it"
        )
    scenario = load_scenario(run_dir / "config.yaml")
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"--runs {run_dir}: summary.json is not readable JSON ({e})") from None
    return scenario.to_dict(), summary, read_metrics(run_dir), resolved_settings(scenario)


def _labels(configs: list[dict]) -> list[str]:
    """Method name, plus the method settings that differ between the given runs of that method."""
    by_name: dict[str, list[dict]] = {}
    for c in configs:
        by_name.setdefault(c["method"]["name"], []).append(_flat("", c["method"], {}))
    varying = {
        name: sorted(k for k in set().union(*flats) if len({json.dumps(f.get(k), default=str) for f in flats}) > 1)
        for name, flats in by_name.items()
    }
    out = []
    for c in configs:
        name, flat = c["method"]["name"], _flat("", c["method"], {})
        out.append(":".join([name, *(f"{k}={flat.get(k)}" for k in varying[name])]))
    return out


def from_runs(paths: list[str]) -> tuple[list[Outcome], dict]:
    """Outcomes (one per run folder) and the comparison meta for rtpo.compare.write_outputs."""
    from rtpo.scenario.load import ConfigError

    runs = [Path(p) for p in paths]
    loaded = [_load(r) for r in runs]
    configs = [c for c, _, _, _ in loaded]
    fixed = [{k: v for k, v in _flat("", c, {}).items() if k.split(".", 1)[0] not in FREE} for c in configs]
    for run, f in zip(runs[1:], fixed[1:]):
        for key in sorted(set(f) | set(fixed[0])):
            if f.get(key) != fixed[0].get(key):
                raise ConfigError(
                    f"--runs {run}: a different scenario from {runs[0]} ({key}: {f.get(key)!r} vs "
                    f"{fixed[0].get(key)!r}); runs compared side by side differ only in {', '.join(FREE)}"
                )
    outcomes = []
    first: dict[tuple[str, int], Path] = {}  # (row, seed) -> the run counted for it
    for run, (cfg, summary, metrics, settings), lab in zip(runs, loaded, _labels(configs)):
        seed = int(cfg["seed"])
        if (lab, seed) in first:  # not an independent sample: three runs of one seed are one seed
            print(
                f"warning: --runs {run}: seed {seed} of {lab} again (as {first[lab, seed]}); counted once",
                file=sys.stderr,
            )
            continue
        first[lab, seed] = run
        job = Job(
            label=lab,
            method=cfg["method"]["name"],
            sweep=None,
            seed=seed,
            data=cfg,
            out_root=str(run.parent),
            G=settings.get("G"),
            settings=settings,
        )
        curve = [{k: m[k] for k in m if k in CURVE_KEYS or k.startswith("samples/turn_")} for m in metrics]
        summary = {k: v for k, v in summary.items() if not isinstance(v, (list, dict))}
        summary.setdefault("run_dir", str(run))
        outcomes.append(Outcome(job, summary=summary, curve=curve))
    spent = max((o.summary.get("rollouts") or 0) for o in outcomes)
    labels = list(dict.fromkeys(o.job.label for o in outcomes))
    seeds = max(sum(o.job.label == lab for o in outcomes) for lab in labels)
    meta = {
        "scenario": configs[0]["name"],
        "budgets": {"None": spent},  # the figures' x range: the largest spend among the runs
        "budget_unit": "rollouts",
        "budget_note": "Existing run folders (`rtpo compare --runs`), each at the budget it ran (none is imposed)",
        "diagnostics": {},
        "seeds": seeds,
        "sweep_key": None,
        "order": [(None, lab) for lab in labels],
        "runs": [str(r) for r in first.values()],
    }
    return outcomes, meta
