"""The Python API: train a scenario (or your own TurnMDP) from Python and get the metrics and the policy.

    import rtpo
    result = rtpo.train("scenarios/tabular/math_short.yaml", method={"G": 4}, budget__iterations=5)
    result.summary["value_over_optimum"], result.metrics[-1], result.policy

`rtpo.train` runs exactly what `rtpo run` runs (the same runner, phases, metrics and summary).  By
default it runs in memory and writes nothing: no run folder, metrics file, checkpoint, plot or tracker
output.  (An llm scenario's tiny random model is cached under runs/.models as in every llm run.)  `out="runs"` makes it write a run folder, as `rtpo run --out runs` does, which `rtpo eval`,
`--resume` and `rtpo compare` can use afterwards.  docs/python-api.md has a worked example, and a test runs it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rtpo.scenario.schema import SECTIONS, ConfigError, ScenarioConfig


@dataclass
class TrainResult:
    """config:  the resolved scenario that ran.
    metrics: one dict per phase, the lines metrics.jsonl would hold (counters, method metrics, evaluation).
    summary: what summary.json holds (final value, optimum, value_over_optimum, rollouts, wall time).
    learner: the trained learner; `learner.weights()` is θ.
    policy:  tabular: π_θ as a (K, C, A) array of action probabilities per turn and context; other
             backends: the learner's weights.
    run_dir: the run folder, or None for an in-memory run."""

    config: ScenarioConfig
    metrics: list[dict]
    summary: dict
    learner: Any
    policy: Any
    run_dir: Path | None


def _merge(node: dict, key: str, value: Any) -> None:
    """Set `key` (dotted) in the raw mapping; a mapping value merges into an existing section."""
    from rtpo.scenario.load import dotted_parent

    node, last = dotted_parent(node, key)
    if isinstance(value, Mapping) and isinstance(node.get(last), dict):
        for k, v in value.items():
            _merge(node[last], str(k), v)
    else:
        node[last] = copy.deepcopy(dict(value) if isinstance(value, Mapping) else value)


def _scenario_data(scenario: Any) -> dict:
    from rtpo.scenario.load import default_scenario_text, parse_yaml

    if scenario is None:
        return parse_yaml(default_scenario_text(), "default scenario")
    if isinstance(scenario, ScenarioConfig):
        return scenario.to_dict()
    if isinstance(scenario, Mapping):
        return copy.deepcopy(dict(scenario))
    if isinstance(scenario, (str, Path)):
        from rtpo.scenario.shipped import scenario_file

        p = scenario_file(scenario)  # a file, or a shipped scenario's name
        try:
            data = parse_yaml(p.read_text(), str(p))
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{p}: cannot read: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: must be a mapping of sections")
        from rtpo.scenario.paths import file_data

        return file_data(p, data)
    raise ConfigError(
        f"scenario: must be None (the default), a file path, a mapping or a ScenarioConfig, got {type(scenario).__name__}"
    )


def resolve(scenario: Any = None, plugins: Sequence[str] = (), **overrides: Any) -> ScenarioConfig:
    """The validated scenario `train` would run: `scenario` (None = the embedded default, a YAML path, a
    mapping or a ScenarioConfig) with `overrides` applied.  An override is a section
    (`method={"G": 4}` merges into the method section), a top-level key (`seed=3`), or a dotted path
    written with `__` (`budget__iterations=5` is `budget.iterations=5`).  Values are Python values, not
    YAML text.  Giving another `method.name` keeps only the keys the new method also has, as `rtpo run
    method.name=...` does."""
    from rtpo.scenario import plugins as _plugins
    from rtpo.scenario.load import _switch_method, parse_scenario

    data = _scenario_data(scenario)
    before = data.get("method", {}).get("name") if isinstance(data.get("method"), dict) else None
    given: list[str] = []  # method keys set here, in the `method.KEY=` form _switch_method reads
    for raw_key, value in overrides.items():
        key = raw_key.replace("__", ".")
        if key.split(".", 1)[0] not in SECTIONS:
            from rtpo.scenario.schema import suggest

            raise ConfigError(
                f"{key}: unknown key{suggest(key.split('.', 1)[0], SECTIONS)} (valid: {', '.join(SECTIONS)})"
            )
        _merge(data, key, value)
        if key == "method" and isinstance(value, Mapping):
            given += [f"method.{k}=" for k in value if k != "name"]
        elif key.startswith("method."):
            given.append(f"{key}=")
    if plugins:
        data["plugins"] = list(dict.fromkeys([*_plugins.check_names(data.get("plugins")), *plugins]))
    _plugins.load(data.get("plugins"))
    _switch_method(data, before, given)
    return parse_scenario(data)


def train(
    scenario: Any = None,
    *,
    mdp: Any = None,
    out: str | Path | None = None,
    plugins: Sequence[str] = (),
    progress: bool = False,
    **overrides: Any,
) -> TrainResult:
    """Train `scenario` with `overrides` (see `resolve`), and return the metrics, summary and trained policy.

    mdp:      a rtpo.tabular TurnMDP to train on instead of the scenario's task (tabular backends only;
              the task section still chooses the policy class: softmax table, loglinear, shared).  It runs
              in memory only, because a run folder's config.yaml could not rebuild the MDP.
    out:      None (default): in memory, nothing written.  A folder: a run folder is made in it, exactly
              as `rtpo run --out OUT` makes one.
    plugins:  modules to import first (rtpo.scenario.plugins), recorded in the config as `--plugin` does.
    progress: print one line per phase (or a bar on a terminal).
    Bad input raises a one-line rtpo.scenario.load.ConfigError naming the key."""
    from rtpo.rundir.runner import run_in_memory, run_scenario

    cfg = resolve(scenario, plugins, **overrides)
    if mdp is not None:
        if out is not None:
            raise ConfigError(
                "mdp: a run on your own TurnMDP is in memory only (out=None); its run folder could not be resumed"
            )
        built = _built_on_mdp(cfg, mdp)
        res = run_in_memory(cfg, built, progress=progress)
    elif out is None:
        res = run_in_memory(cfg, None, progress=progress)
    else:
        res = run_scenario(cfg, out_root=Path(out), progress=progress)
    learner = res.learner
    table = getattr(getattr(learner, "policy", None), "table", None)  # a tabular policy's dense (K, C, A) π
    policy = table(learner.weights()) if callable(table) else learner.weights()
    return TrainResult(
        config=cfg, metrics=res.metrics, summary=res.summary, learner=learner, policy=policy, run_dir=res.run_dir
    )


def _built_on_mdp(cfg: ScenarioConfig, mdp: Any):
    from rtpo.tabular.backend import TabularEnv
    from rtpo.tabular.build import assemble, make_policy
    from rtpo.tabular.mdp import TurnMDP

    if not isinstance(mdp, TurnMDP):
        raise ConfigError(f"mdp: must be a rtpo.tabular TurnMDP, got {type(mdp).__name__}")
    if cfg.backend.kind != "tabular":
        raise ConfigError(f"mdp: needs backend.kind tabular, the scenario has {cfg.backend.kind!r}")
    if cfg.backend.distributed != "none":
        raise ConfigError("mdp: runs in this process only (backend.distributed: none)")
    return assemble(cfg, mdp, make_policy(cfg.task, mdp), TabularEnv(mdp))
