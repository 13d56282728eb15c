"""The runs of a comparison (rtpo.compare): method specs, the equal budget B of each sweep value, and one
validated Job per (sweep value, method, seed), each with the method's resolved settings."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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


def parse_method_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """`name:key=value:key=value` -> (name, {key: value}); values are YAML scalars."""
    from rtpo.scenario.load import ConfigError, parse_yaml

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
    from rtpo.scenario.load import ConfigError, default_scenario_text, parse_yaml

    if scenario is None:
        return parse_yaml(default_scenario_text(), "default scenario"), "default"
    from rtpo.scenario.shipped import scenario_file

    p = scenario_file(scenario)  # a file, or a shipped scenario's name
    data = parse_yaml(p.read_text(), str(p))
    if not isinstance(data, dict):
        raise ConfigError(f"{scenario}: must be a mapping of sections")
    from rtpo.scenario.paths import file_data

    return file_data(p, data), p.stem


def _num_turns(cfg) -> int:
    """K of the scenario's task: its section's num_turns where it has one (an llm build would start the
    model, its warm start and an inference engine in this process just to count turns), else the built
    environment's."""
    from rtpo.scenario.backends import get_backend

    k = getattr(cfg.task, "num_turns", None)
    if isinstance(k, int) and not isinstance(k, bool) and k > 0:
        return k
    return int(get_backend(cfg.backend.kind).build(cfg).ctx.env.num_turns)


def _plan_budget(cfg, num_turns: int) -> int:
    """budget.max_rollouts, or what the scenario's own method plans for budget.iterations."""
    from rtpo.scenario.load import ConfigError

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
    plugins: list[str] | tuple[str, ...] = (),
    seed_offset: int = 0,
) -> tuple[list[Job], dict]:
    """Every (sweep value, method, seed) run, each config validated before anything runs.  `plugins`
    (--plugin) join the scenario's own `plugins` list, so every run's config.yaml records them.  Seeds
    are scenario.seed + seed_offset + 0..seeds−1 (--tune's tuning seeds start after the reported ones)."""
    from rtpo.scenario.backends import get_backend
    from rtpo.scenario.load import ConfigError, apply_override, parse_scenario

    try:  # registers `backend.kind: tabular_history` (full-history contexts beside ψ)
        import rtpo.tabular.history_build  # noqa: F401
    except ImportError:
        pass
    raw, stem = _scenario_data(scenario)
    if plugins:
        from rtpo.scenario.plugins import check_names

        raw["plugins"] = list(dict.fromkeys([*check_names(raw.get("plugins")), *plugins]))
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
                d["seed"] = int(raw.get("seed", 0)) + seed_offset + i
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
    from rtpo.scenario.load import apply_override

    data = copy.deepcopy(base)
    data["method"] = dict(msec)
    fields = _method_fields(msec["name"]) if "name" in msec else set()
    for ov in method_ov:
        key = ov.partition("=")[0].strip().split(".", 1)[1]
        if key in fields:
            apply_override(data, ov)
    return data
