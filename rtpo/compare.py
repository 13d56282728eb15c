"""`rtpo compare`: every method × seed of a scenario at an equal rollout budget (SPEC §2.3), a table with
95% intervals over seeds, and plots.

    rtpo compare SCENARIO [--methods a,b:key=v,...] [--seeds N] [--sweep key=v1,v2,...]
                 [--workers 2] [--out DIR] [key=value ...]

- A method spec is a registered name with optional `:key=value` settings of its Config
  (`grpo:normalize=false`, `rtpo:estimator=leave_one_out`); the spec is the row label.  A method
  whose Config is the scenario method's Config or a subclass of it (the RTPO variants from `rtpo`)
  starts from the scenario's method settings; any other starts from its own defaults.
- `key=value` overrides apply to every run; a `method.X=v` override applies to the methods whose
  Config has a field X and is skipped for the others.
- Equal tokens instead: with `budget.max_tokens=T` every method runs until it has generated T response
  tokens (checked at iteration boundaries; the last iteration may run past T and the table says so).
- The budget B: `budget.max_rollouts` if the scenario sets it, else what the scenario's own method plans
  for `budget.iterations` iterations (iterations × rollouts_per_query(K) × queries_per_iteration).
  Each method runs the whole iterations that fit in B (B // (its rollouts_per_query × queries), at
  least 1) and is also capped at B at iteration boundaries (a begun iteration always finishes and is
  trained: rtpo.run._run_loop's budget rule); the table shows what each really spent, which is its
  checkpoint's counter, and flags a row that spent more than B (one iteration costs more than B).
- The report prints every method's resolved settings (its whole Config as run, inherited scenario
  settings included, and train.lr), calls out the shared update settings that differ between methods
  (e.g. RTPO inheriting the scenario's `epochs: 2` while GRPO runs its default 1), and counts training
  samples per turn (batch rows of turn k over the run, from each phase's `samples/turn_<k>`).  On the
  tabular backends it also prints which regime the task is in before training (the exact variance
  decomposition and RTPO/GRPO information index of rtpo.tabular.diagnostic).
- Tabular rows also give the normalised gain (V − V_uniform)/(V* − V_uniform) and how many seeds ended
  locked onto a wrong first action (eval/first_action_wrong > 1/2 at the last evaluation).
- `--sweep key=v1,v2,...` repeats the whole comparison for each value (e.g. task.num_turns=3,4,5).
- Seeds are scenario.seed + 0..N−1.  Runs go to 2 worker processes (single-threaded torch each,
  forked where the platform allows) whenever more than one run is queued.

Writes DIR/compare-<scenario>-<time>/: comparison.md, comparison.json (rewritten after every finished
run, so nothing computed is lost), curves.png (value / V* against rollouts, mean and 95% band over seeds),
ratio.png (rollout/train ratio against rollouts), zero_adv_vs_G.png (zero-advantage rate against G),
sweep.png (final value / V* against the swept key) and runs/ with every run folder.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_all_start_methods, get_context
from pathlib import Path
from typing import Any

import numpy as np

USAGE_ERROR = 2
DEFAULT_METHODS = "rtpo,grpo,seeupo"
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
class Job:
    """One run: the row label, the sweep value, the seed and the raw scenario data to validate and run."""

    label: str
    method: str
    sweep: str | None
    seed: int
    data: dict
    out_root: str
    G: int | None = None
    settings: dict = field(default_factory=dict)  # the method's resolved Config, as run


@dataclass
class Outcome:
    job: Job
    summary: dict | None = None
    curve: list = field(default_factory=list)
    error: str | None = None


# -- parsing --------------------------------------------------------------------------------------------
def parse_method_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """`name:key=value:key=value` -> (name, {key: value}); values are YAML scalars."""
    from rtpo.config import ConfigError, parse_yaml

    name, *parts = spec.strip().split(":")
    if not name:
        raise ConfigError(f"--methods: empty method name in {spec!r}")
    kv = {}
    for p in parts:
        key, eq, raw = p.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"--methods {spec}: setting {p!r} must look like key=value")
        kv[key.strip()] = parse_yaml(raw, f"--methods {spec}") if raw.strip() else None
    return name, kv


def _method_fields(name: str) -> set[str]:
    import dataclasses

    from rtpo.core import methods

    return {f.name for f in dataclasses.fields(methods.get(name).Config)}


def _scenario_data(scenario: str | None) -> tuple[dict, str]:
    from rtpo.config import ConfigError, default_scenario_text, parse_yaml

    if scenario is None:
        return parse_yaml(default_scenario_text(), "default scenario"), "default"
    p = Path(scenario)
    if not p.is_file():
        raise ConfigError(f"{scenario}: no such scenario file")
    data = parse_yaml(p.read_text(), scenario)
    if not isinstance(data, dict):
        raise ConfigError(f"{scenario}: must be a mapping of sections")
    return data, p.stem


def _num_turns(cfg) -> int:
    from rtpo.backends import get_backend

    return int(get_backend(cfg.backend.kind).build(cfg).ctx.env.num_turns)


def _plan_budget(cfg, num_turns: int) -> int:
    """budget.max_rollouts, or what the scenario's own method plans for budget.iterations."""
    from rtpo.config import ConfigError

    if cfg.budget.max_rollouts is not None:
        return int(cfg.budget.max_rollouts)
    per_query = cfg.method.build().rollouts_per_query(num_turns)
    if per_query is None:
        raise ConfigError(f"budget.max_rollouts: required, method {cfg.method.name!r} does not plan its rollouts")
    return int(cfg.budget.iterations * per_query * cfg.budget.queries_per_iteration)


def build_jobs(
    scenario: str | None,
    method_specs: list[str],
    seeds: int,
    overrides: list[str],
    sweep: tuple[str, list[str]] | None,
    out_root: Path,
) -> tuple[list[Job], dict]:
    """Every (sweep value, method, seed) run, each config validated before anything runs."""
    from rtpo.backends import get_backend
    from rtpo.config import ConfigError, apply_override, parse_scenario

    try:  # registers `backend.kind: tabular_history` (full-history contexts beside ψ)
        import rtpo.tabular.history_build  # noqa: F401
    except ImportError:
        pass
    raw, stem = _scenario_data(scenario)
    if not isinstance(raw.get("method"), dict):
        raise ConfigError("method: required section missing")
    specs = [parse_method_spec(s) for s in method_specs]
    labels = [s.strip() for s in method_specs]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"--methods: a method spec is repeated in {','.join(labels)}")
    method_ov = [o for o in overrides if o.strip().startswith("method.")]
    other_ov = [o for o in overrides if not o.strip().startswith("method.")]
    points: list[str | None] = [None] if sweep is None else list(sweep[1])
    jobs: list[Job] = []
    budgets: dict[str, int] = {}
    units: set[str] = set()
    diagnostics: dict[str, list[str]] = {}
    for point in points:
        base = copy.deepcopy(raw)
        for ov in other_ov:
            apply_override(base, ov)
        if sweep is not None and not sweep[0].startswith("method."):
            apply_override(base, f"{sweep[0]}={point}")
        point_method_ov = method_ov + (
            [f"{sweep[0]}={point}"] if sweep is not None and sweep[0].startswith("method.") else []
        )
        base_cfg = parse_scenario(_with_method_overrides(base, base["method"], point_method_ov))
        num_turns = _num_turns(base_cfg)
        token_budget = base_cfg.budget.max_tokens
        budget = int(token_budget) if token_budget is not None else _plan_budget(base_cfg, num_turns)
        budgets[str(point)] = budget
        units.add("tokens" if token_budget is not None else "rollouts")
        diagnostic = get_backend(base_cfg.backend.kind).diagnostic
        diag_cfg = base_cfg  # replaced by the first compared RTPO variant's, so the index uses its G
        for label, (name, kv) in zip(labels, specs):
            from rtpo.core import methods

            if name not in methods.METHODS:
                raise ConfigError(f"--methods: unknown method {name!r} (valid: {', '.join(methods.names())})")
            msec = _inherited_method(base["method"], name)
            msec.update(kv)
            data = _with_method_overrides(base, msec, point_method_ov)
            if token_budget is not None:  # equal tokens: no method's tokens per iteration are known ahead
                data["budget"] = {**(data.get("budget") or {}), "max_tokens": budget, "iterations": 10**9}
            else:
                data["budget"] = {**(data.get("budget") or {}), "max_rollouts": budget, "iterations": 10**9}
                try:
                    iters = _whole_iterations(parse_scenario(data), budget, num_turns)
                except ConfigError as e:
                    raise ConfigError(f"--methods {label}: {e}") from None
                if iters is not None:
                    data["budget"]["iterations"] = iters
            data["logging"] = {**(data.get("logging") or {}), "progress": False, "plot": False}
            for i in range(seeds):
                d = copy.deepcopy(data)
                d["seed"] = int(raw.get("seed", 0)) + i
                try:
                    cfg = parse_scenario(d)
                except ConfigError as e:
                    raise ConfigError(f"--methods {label}: {e}") from None
                if i == 0 and name.startswith("rtpo") and diag_cfg is base_cfg:
                    diag_cfg = cfg
                jobs.append(
                    Job(
                        label,
                        name,
                        point,
                        d["seed"],
                        d,
                        str(out_root / "runs"),
                        getattr(cfg.method.config, "G", None),
                        resolved_settings(cfg),
                    )
                )
        if diagnostic is not None:
            diagnostics[str(point)] = diagnostic(diag_cfg)
    if len(units) > 1:
        raise ConfigError("--sweep: budget.max_tokens must be set for every swept value or for none")
    unit = units.pop() if units else "rollouts"
    return jobs, {"scenario": stem, "budgets": budgets, "budget_unit": unit, "diagnostics": diagnostics}


def resolved_settings(cfg) -> dict:
    """Every field of the method's Config as the run uses it (defaults and inherited scenario settings
    included), plus the optimiser's learning rate: what the report prints for each row."""
    import dataclasses

    out = {}
    for f in dataclasses.fields(cfg.method.config):
        v = getattr(cfg.method.config, f.name)
        out[f.name] = v if isinstance(v, (bool, int, float, str, type(None))) else repr(v)
    out["train.lr"] = cfg.train.lr
    return out


def settings_lines(rows: list[dict]) -> list[str]:
    """One line per method with its resolved settings, and the update settings several methods share
    (epochs, minibatch, clip, KL, lr) where they differ between rows, so an inherited value is visible."""
    seen: dict[str, dict] = {}
    for r in rows:
        seen.setdefault(r["method"], r.get("settings") or {})
    lines = [f"- {m}: " + ", ".join(f"{k}={v}" for k, v in st.items()) for m, st in seen.items()]
    shared = ("epochs", "minibatch_size", "clip_eps", "clip_eps_high", "kl_coef", "log_ratio_clip", "train.lr")
    for key in shared:
        vals = {m: st[key] for m, st in seen.items() if key in st}
        if len(set(map(repr, vals.values()))) > 1:
            lines.append(f"- differs between methods: {key} (" + ", ".join(f"{m} {v}" for m, v in vals.items()) + ")")
    return lines


def _inherited_method(scenario_method: dict, name: str) -> dict:
    """The method section a compared method starts from: the scenario's settings when its Config is
    the scenario method's Config or a subclass of it (rtpo_offpolicy from rtpo: same G, epochs, ...),
    else just the name (its own defaults: GRPO's G is a different quantity from RTPO's)."""
    from rtpo.core import methods

    base_name = scenario_method.get("name")
    if base_name == name:
        return dict(scenario_method)
    if base_name in methods.METHODS and issubclass(methods.get(name).Config, methods.get(base_name).Config):
        return {**scenario_method, "name": name}
    return {"name": name}


def _whole_iterations(cfg, budget: int, num_turns: int) -> int | None:
    """Whole iterations of this method that fit in the budget (None when the method cannot plan)."""
    per_query = cfg.method.build().rollouts_per_query(num_turns)
    if not per_query:
        return None
    return max(1, int(budget // (per_query * cfg.budget.queries_per_iteration)))


def _with_method_overrides(base: dict, msec: dict, method_ov: list[str]) -> dict:
    from rtpo.config import apply_override

    data = copy.deepcopy(base)
    data["method"] = dict(msec)
    fields = _method_fields(msec["name"]) if "name" in msec else set()
    for ov in method_ov:
        key = ov.partition("=")[0].strip().split(".", 1)[1]
        if key in fields:
            apply_override(data, ov)
    return data


# -- running ---------------------------------------------------------------------------------------------
def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)


def run_job(job: Job) -> Outcome:
    """Run one job (in a worker process); a failure is returned as a one-line error, never raised."""
    try:
        import rtpo.tabular.history_build  # noqa: F401
    except ImportError:
        pass
    from rtpo.config import parse_scenario
    from rtpo.run import run_scenario

    try:
        cfg = parse_scenario(job.data)
        res = run_scenario(cfg, out_root=Path(job.out_root), progress=False)
    except Exception as e:  # one bad run must not lose the others
        return Outcome(job, error=f"{type(e).__name__}: {' '.join(str(e).split())}")
    curve = [{k: m[k] for k in m if k in CURVE_KEYS or k.startswith("samples/turn_")} for m in res.metrics]
    summary = {k: v for k, v in res.summary.items() if not isinstance(v, (list, dict))}
    return Outcome(job, summary=summary, curve=curve)


def run_all(jobs: list[Job], workers: int, on_done) -> list[Outcome]:
    outcomes: list[Outcome] = []
    if workers <= 1 or len(jobs) <= 1:
        _init_worker()
        for job in jobs:
            outcomes.append(run_job(job))
            on_done(outcomes)
        return outcomes
    _init_worker()  # the parent never starts torch's thread pool, so forking it is safe
    # fork: a worker starts with rtpo and torch already imported (a spawned one re-imports them, seconds
    # each on a loaded machine); spawn where fork does not exist
    method = "fork" if "fork" in get_all_start_methods() else "spawn"
    with ProcessPoolExecutor(
        max_workers=min(workers, len(jobs)), mp_context=get_context(method), initializer=_init_worker
    ) as pool:
        futures = [pool.submit(run_job, j) for j in jobs]
        for fut in as_completed(futures):
            outcomes.append(fut.result())
            on_done(outcomes)
    return outcomes


# -- statistics and output -------------------------------------------------------------------------------
def mean_ci(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """Mean and the half-width of its Student-t confidence interval (nan for fewer than 2 values)."""
    from scipy import stats

    v = np.asarray([x for x in values if x is not None and not math.isnan(x)], np.float64)
    if v.size == 0:
        return float("nan"), float("nan")
    if v.size == 1:
        return float(v[0]), float("nan")
    half = stats.t.ppf(0.5 + level / 2, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size)
    return float(v.mean()), float(half)


def _ratio_dev(curve: list[dict]) -> float | None:
    r = [c["consistency/rollout_train_ratio"] for c in curve if "consistency/rollout_train_ratio" in c]
    return float(np.max(np.abs(np.asarray(r) - 1.0))) if r else None


def _normalised_gain(curve: list[dict]) -> float | None:
    """(V − V_uniform) / (V* − V_uniform) at the run's last evaluation: 0 = the uniform policy, 1 = V*.
    On families where an exogenous event sets most of the value (region_chain), value/V* starts near
    1 for any policy; this is the share of the controllable gap closed."""
    last = [c for c in curve if "eval/value" in c and "eval/v_uniform" in c and "eval/v_star" in c]
    if not last:
        return None
    c = last[-1]
    gap = c["eval/v_star"] - c["eval/v_uniform"]
    return (c["eval/value"] - c["eval/v_uniform"]) / gap if gap > 0 else None


def _samples_per_turn(curve: list[dict]) -> dict[str, float]:
    """Training samples of each turn over the whole run: the sum of the phases' `samples/turn_<k>`."""
    out: dict[str, float] = {}
    for c in curve:
        for key, v in c.items():
            if key.startswith("samples/turn_"):
                k = key.removeprefix("samples/turn_")
                out[k] = out.get(k, 0.0) + float(v)
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def _wrong_first_action(curve: list[dict]) -> bool | None:
    """Whether the run ended locked onto a wrong first action: at its last evaluation, more than half
    of the start-state mass has a most likely turn-0 action that is not optimal (tabular)."""
    last = [c for c in curve if "eval/first_action_wrong" in c]
    return None if not last else bool(last[-1]["eval/first_action_wrong"] > 0.5)


def aggregate(outcomes: list[Outcome]) -> list[dict]:
    """One row per (sweep value, label): mean ± 95% interval over seeds of each quantity."""
    groups: dict[tuple, list[Outcome]] = {}
    for o in outcomes:
        groups.setdefault((o.job.sweep, o.job.label), []).append(o)
    rows = []
    for (point, label), outs in groups.items():
        ok = [o for o in outs if o.summary is not None]
        row: dict[str, Any] = {
            "sweep": point,
            "method": label,
            "G": outs[0].job.G,
            "seeds": len(outs),
            "failed": [o.error for o in outs if o.error],
            "per_seed": [],
        }
        for o in ok:
            s = o.summary
            row["per_seed"].append(
                {
                    "seed": o.job.seed,
                    "value_over_optimum": s.get("value_over_optimum"),
                    "normalised_gain": _normalised_gain(o.curve),
                    "wrong_first_action": _wrong_first_action(o.curve),
                    "final_value": s.get("final_value"),
                    "reached_target": s.get("reached_target"),
                    "zero_advantage_rate": s.get("zero_advantage_rate_mean"),
                    "rollout_train_ratio": s.get("rollout_train_ratio_mean"),
                    "max_abs_ratio_minus_1": _ratio_dev(o.curve),
                    "rollouts": s.get("rollouts"),
                    "tokens": s.get("tokens"),
                    "samples_per_turn": _samples_per_turn(o.curve),
                    "wall_s": s.get("wall_s"),
                    "run_dir": s.get("run_dir"),
                }
            )
            per = row["per_seed"][-1]["samples_per_turn"]
            per_mean = float(np.mean(list(per.values()))) if per else None
            row["per_seed"][-1]["samples_per_turn_mean"] = per_mean
        for key in (
            "value_over_optimum",
            "normalised_gain",
            "final_value",
            "zero_advantage_rate",
            "rollout_train_ratio",
            "max_abs_ratio_minus_1",
            "rollouts",
            "tokens",
            "samples_per_turn_mean",
            "wall_s",
        ):
            m, h = mean_ci([p[key] for p in row["per_seed"] if p[key] is not None])
            row[key] = {"mean": m, "ci95": h}
        row["reached_target"] = sum(bool(p["reached_target"]) for p in row["per_seed"])
        wrong = [p["wrong_first_action"] for p in row["per_seed"] if p["wrong_first_action"] is not None]
        row["wrong_first_action"] = sum(wrong) if wrong else None
        row["settings"] = outs[0].job.settings
        turns = sorted({k for p in row["per_seed"] for k in p["samples_per_turn"]}, key=int)
        row["samples_per_turn"] = {
            k: float(np.mean([p["samples_per_turn"].get(k, 0.0) for p in row["per_seed"]])) for k in turns
        }
        if ok:
            row["optimum"] = ok[0].summary.get("optimum")
        rows.append(row)
    return rows


def _pm(stat: dict, digits: int = 3) -> str:
    m, h = stat["mean"], stat["ci95"]
    if m is None or math.isnan(m):
        return "–"
    if abs(m) >= 1000:
        return f"{m:.0f}" + ("" if math.isnan(h) else f" ± {h:.0f}")
    return f"{m:.{digits}f}" + ("" if math.isnan(h) else f" ± {h:.{digits}f}")


def table_markdown(rows: list[dict], meta: dict) -> str:
    sweep_key = meta.get("sweep_key")
    head = ["method"] if sweep_key is None else [sweep_key, "method"]
    head += [
        "value/V*",
        "gain",
        "final value",
        "reached target",
        "wrong first action",
        "zero-adv rate",
        "rollout/train ratio",
        "max abs(ratio−1)",
        "rollouts",
        "tokens",
        "samples/turn",
        "wall s",
    ]
    lines = [
        f"# rtpo compare: {meta['scenario']}",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"Equal {meta.get('budget_unit', 'rollouts')[:-1]} budget per run (SPEC §2.3): "
        f"{', '.join(f'{v}' for v in meta['budgets'].values())} {meta.get('budget_unit', 'rollouts')}; "
        f"{meta['seeds']} seeds; mean ± 95% t-interval over seeds.  gain = (V − V_uniform) / (V* − V_uniform) "
        "at the last evaluation (tabular); wrong first action = seeds whose final policy's most likely turn-0 "
        "action is not optimal for most of the start-state mass.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in rows:
        cells = [r["method"]] if sweep_key is None else [str(r["sweep"]), r["method"]]
        n_ok = len(r["per_seed"])
        cells += [
            _pm(r["value_over_optimum"]),
            _pm(r["normalised_gain"]),
            _pm(r["final_value"]),
            f"{r['reached_target']}/{n_ok}",
            "–" if r.get("wrong_first_action") is None else f"{r['wrong_first_action']}/{n_ok}",
            _pm(r["zero_advantage_rate"]),
            _pm(r["rollout_train_ratio"], 4),
            _pm(r["max_abs_ratio_minus_1"], 4),
            _pm(r["rollouts"]),
            _pm(r["tokens"]),
            _pm(r["samples_per_turn_mean"], 1),
            _pm(r["wall_s"], 1),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "samples/turn: training samples (batch rows) per turn over the run, averaged over turns; by turn k:",
        "",
    ]
    for r in rows:
        where = "" if sweep_key is None else f" ({sweep_key}={r['sweep']})"
        per = ", ".join(f"{k}: {v:.0f}" for k, v in r.get("samples_per_turn", {}).items())
        lines.append(f"- {r['method']}{where}: {per or '–'}")
    lines += ["", "Method settings, resolved (what each row ran):", "", *settings_lines(rows)]
    unit = meta.get("budget_unit", "rollouts")
    over = [
        (r["method"], r["sweep"], r[unit]["mean"])
        for r in rows
        if r["per_seed"] and r[unit]["mean"] > meta["budgets"].get(str(r["sweep"]), math.inf)
    ]
    if over:
        why = (
            "one whole iteration costs more than the budget"
            if unit == "rollouts"
            else "the cap is checked at iteration boundaries, so the last iteration runs past it"
        )
        lines += ["", f"Over budget ({why}; it ran and is reported):"]
        lines += [
            f"- {m}{'' if p is None else f' at {sweep_key}={p}'}: {v:.0f} {unit} > {meta['budgets'][str(p)]}"
            for m, p, v in over
        ]
    for point, diag in (meta.get("diagnostics") or {}).items():
        where = "" if sweep_key is None else f" ({sweep_key}={point})"
        lines += [
            "",
            f"Which regime{where}, before training (exact; rtpo.tabular.diagnostic):",
            "",
            "```",
            *diag,
            "```",
        ]
    failed = [(r["method"], e) for r in rows for e in r["failed"]]
    if failed:
        lines += ["", "Failed runs:"] + [f"- {m}: {e}" for m, e in failed]
    lines += ["", "![learning curves](curves.png)", "", "![rollout/train ratio](ratio.png)", ""]
    if meta.get("has_zero_plot"):
        lines += ["![zero-advantage rate vs G](zero_adv_vs_G.png)", ""]
    if sweep_key is not None:
        lines += [f"![final value vs {sweep_key}](sweep.png)", ""]
    return "\n".join(lines)


def _band(
    outs: list[Outcome], key: str, grid: np.ndarray, normalise: bool, x_key: str = "budget/rollouts"
) -> tuple[np.ndarray, np.ndarray] | None:
    """Mean and 95% half-width over seeds of `key` interpolated on a spend grid of `x_key` (step-wise hold)."""
    from scipy import stats

    ys = []
    for o in outs:
        pts = [
            (c[x_key], c[key] / c["eval/v_star"] if normalise else c[key])
            for c in o.curve
            if key in c and x_key in c and (not normalise or c.get("eval/v_star"))
        ]
        if not pts:
            continue
        x, y = np.array(pts).T
        idx = np.searchsorted(x, grid, side="right") - 1
        ys.append(np.where(idx >= 0, y[np.maximum(idx, 0)], y[0]))
    if not ys:
        return None
    ys = np.array(ys)
    mean = ys.mean(axis=0)
    if len(ys) < 2:
        return mean, np.zeros_like(mean)
    return mean, stats.t.ppf(0.975, len(ys) - 1) * ys.std(axis=0, ddof=1) / np.sqrt(len(ys))


def write_plots(outcomes: list[Outcome], rows: list[dict], meta: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [o for o in outcomes if o.summary is not None]
    if not ok:
        return
    points = list(dict.fromkeys(o.job.sweep for o in ok))
    labels = list(dict.fromkeys(o.job.label for o in ok))
    colors = {lab: f"C{i % 10}" for i, lab in enumerate(labels)}
    for fname, key, normalise, ylabel in (
        ("curves.png", "eval/value", True, "policy value / V*"),
        ("ratio.png", "consistency/rollout_train_ratio", False, "rollout/train ratio (geometric mean)"),
    ):
        fig, axes = plt.subplots(1, len(points), figsize=(5.0 * len(points), 3.8), dpi=100, squeeze=False)
        for ax, point in zip(axes[0], points):
            budget = meta["budgets"][str(point)]
            grid = np.linspace(0, budget, 200)
            for lab in labels:
                outs = [o for o in ok if o.job.label == lab and o.job.sweep == point]
                band = _band(outs, key, grid, normalise, f"budget/{meta.get('budget_unit', 'rollouts')}")
                if band is None:
                    continue
                m, h = band
                ax.plot(grid, m, color=colors[lab], label=lab, lw=1.5)
                ax.fill_between(grid, m - h, m + h, color=colors[lab], alpha=0.2, lw=0)
            if normalise:
                ax.axhline(1.0, color="k", ls="--", lw=1, label="V*")
                psi = [
                    c["eval/v_star_psi"] / c["eval/v_star"]
                    for o in ok
                    if o.job.sweep == point
                    for c in o.curve
                    if "eval/v_star_psi" in c and c.get("eval/v_star")
                ]
                if psi and psi[0] < 1 - 1e-9:
                    ax.axhline(psi[0], color="k", ls=":", lw=1, label="V*_ψ (recursive optimum)")
            else:
                ax.axhline(1.0, color="k", ls="--", lw=1)
            title = meta["scenario"] if point is None else f"{meta['scenario']}  {meta['sweep_key']}={point}"
            ax.set_title(title, fontsize=9)
            ax.set_xlabel(f"{meta.get('budget_unit', 'rollouts')} spent")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="best")
        fig.tight_layout()
        fig.savefig(out / fname)
        plt.close(fig)
    with_g = [r for r in rows if r["G"] is not None and r["per_seed"]]
    meta["has_zero_plot"] = bool(with_g)
    if with_g:
        fig, ax = plt.subplots(figsize=(5.0, 3.8), dpi=100)
        by_method: dict[str, list] = {}
        for r in with_g:
            name = r["method"].split(":")[0]
            by_method.setdefault(name, []).append(
                (r["G"], r["zero_advantage_rate"]["mean"], r["zero_advantage_rate"]["ci95"])
            )
        for i, (name, pts) in enumerate(by_method.items()):
            pts.sort()
            g, m, h = (np.array(x, np.float64) for x in zip(*pts))
            ax.errorbar(g, m, yerr=np.nan_to_num(h), marker="o", capsize=3, label=name, color=f"C{i}")
        ax.set_xlabel("group size G")
        ax.set_ylabel("zero-advantage rate")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "zero_adv_vs_G.png")
        plt.close(fig)
    if meta.get("sweep_key") is not None:
        fig, ax = plt.subplots(figsize=(5.5, 3.8), dpi=100)
        for lab in labels:
            pts = [
                (r["sweep"], r["value_over_optimum"]["mean"], r["value_over_optimum"]["ci95"])
                for r in rows
                if r["method"] == lab and r["per_seed"]
            ]
            try:
                xs = [float(p[0]) for p in pts]
            except ValueError:
                xs = list(range(len(pts)))
            ax.errorbar(
                xs,
                [p[1] for p in pts],
                yerr=np.nan_to_num([p[2] for p in pts]),
                marker="o",
                capsize=3,
                label=lab,
                color=colors[lab],
            )
        ax.set_xlabel(meta["sweep_key"])
        ax.set_ylabel("final value / V*")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "sweep.png")
        plt.close(fig)


def write_outputs(outcomes: list[Outcome], meta: dict, out: Path, plots: bool) -> list[dict]:
    rows = aggregate(outcomes)
    order = {(p, lab): i for i, (p, lab) in enumerate(meta["order"])}
    rows.sort(key=lambda r: order.get((r["sweep"], r["method"]), 0))
    if plots:
        write_plots(outcomes, rows, meta, out)
    payload = {**{k: v for k, v in meta.items() if k != "order"}, "rows": rows}
    tmp = out / "comparison.json.tmp"
    tmp.write_text(json.dumps(payload, indent=2, default=float) + "\n")
    os.replace(tmp, out / "comparison.json")
    (out / "comparison.md").write_text(table_markdown(rows, meta))
    return rows


# -- the command -----------------------------------------------------------------------------------------
class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        print(f"rtpo compare: error: {' '.join(message.split())}", file=sys.stderr)
        raise SystemExit(USAGE_ERROR)


def _parser() -> argparse.ArgumentParser:
    p = _OneLineParser(prog="rtpo compare", description="equal-budget comparison of methods over seeds")
    p.add_argument("args", nargs="*", metavar="[SCENARIO] [key=value ...]")
    p.add_argument(
        "--methods", default=DEFAULT_METHODS, help=f"comma-separated method specs (default {DEFAULT_METHODS})"
    )
    p.add_argument("--seeds", type=int, default=3, help="seeds per method (default 3)")
    p.add_argument("--sweep", metavar="KEY=V1,V2,...", help="repeat the comparison for each value of KEY")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--out", default="runs", help="folder that receives the comparison folder (default runs)")
    return p


def main(argv: list[str]) -> int:
    from rtpo.config import ConfigError

    _init_worker()  # single-threaded torch here too (and before any fork)
    ns = _parser().parse_intermixed_args(argv)
    args = list(ns.args)
    scenario = args.pop(0) if args and "=" not in args[0] else None
    if ns.seeds < 1:
        return _fail("--seeds must be >= 1")
    if ns.workers < 1:
        return _fail("--workers must be >= 1")
    sweep = None
    if ns.sweep:
        key, eq, vals = ns.sweep.partition("=")
        values = [v.strip() for v in vals.split(",") if v.strip()]
        if not eq or not key.strip() or not values:
            return _fail(f"--sweep {ns.sweep!r}: must look like key=v1,v2,...")
        sweep = (key.strip(), values)
    specs = [s for s in ns.methods.split(",") if s.strip()]
    if not specs:
        return _fail("--methods: no method given")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    try:
        raw_stem = Path(scenario).stem if scenario else "default"
        out = Path(ns.out) / f"compare-{raw_stem}-{stamp}"
        jobs, meta = build_jobs(scenario, specs, ns.seeds, args, sweep, out)
    except ConfigError as e:
        return _fail(str(e))
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


def _fail(message: str) -> int:
    print(f"rtpo compare: error: {' '.join(str(message).split())}", file=sys.stderr)
    return USAGE_ERROR


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
