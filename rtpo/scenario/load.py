"""Typed scenario configs: load a YAML scenario, apply `key.sub=value` overrides, validate every key.

A scenario has the sections `name`, `seed`, `backend`, `task`, `method`, `budget`, `train`, `eval` and
`logging`.  `backend.kind` picks a registered backend (rtpo.scenario.backends), which validates `task`;
`method.name` picks a registered method, whose `Config` dataclass validates the rest of `method`, so a
new method or backend needs no edit here.  An optional `plugins` list names modules (rtpo.scenario.plugins) imported
before any of that, so a user's registered names are valid too.  Every failure is a ConfigError whose message is one line
that starts with the offending key (`method.G: must be >= 2 ..., got 1`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path
from typing import Any

from rtpo.scenario.schema import (  # noqa: F401 - re-exported: rtpo.scenario.load is the public home of these names
    MAX_SCENARIO_NODES,
    SECTIONS,
    BackendConfig,
    BudgetConfig,
    ConfigError,
    EvalConfig,
    LoggingConfig,
    MethodSection,
    ScenarioConfig,
    Section,
    TrainConfig,
    _fmt_input,
    check_plain_data,
    parse_yaml,
    pydantic_error,
    registered_name,
    suggest,
    validate_dataclass,
    validate_model,
)


def _method_section(data: Any) -> MethodSection:
    from rtpo.core import methods

    try:
        name = registered_name(data, "method", "name", methods.METHODS, "method")
    except ConfigError as e:
        if "unknown method" not in str(e):
            raise
        raise ConfigError(f"{e}; a plugin's method needs --plugin MODULE or `plugins:` (docs/plugins.md)") from None
    cfg = validate_dataclass(methods.get(name).Config, data, "method", reserved=("name",))
    return MethodSection(name=name, config=cfg)


def parse_scenario(data: Any) -> ScenarioConfig:
    """Validate a scenario given as plain data (a parsed YAML mapping)."""
    from rtpo.scenario.backends import get_backend

    if not isinstance(data, dict):
        raise ConfigError(f"scenario: must be a mapping of sections, got {_fmt_input(data)}")
    check_plain_data(data)  # also for data that did not come through parse_yaml (Python callers, overrides)
    from rtpo.scenario import plugins as _plugins

    plugin_names = _plugins.load(data.get("plugins"))  # before any registry lookup below
    for key in data:
        if key not in SECTIONS:
            raise ConfigError(f"{str(key)[:60]}: unknown key{suggest(key, SECTIONS)} (valid: {', '.join(SECTIONS)})")
    for key in ("name", "backend", "task", "method"):
        if key not in data:
            raise ConfigError(f"{key}: required key missing")
    name, seed = data["name"], data.get("seed", 0)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ConfigError(f"name: must be a string of letters, digits, '_', '.', '-', got {_fmt_input(name)}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed: must be a non-negative integer, got {_fmt_input(seed)}")
    backend_raw = data["backend"]
    if not isinstance(backend_raw, dict):
        raise ConfigError(f"backend: must be a mapping, got {_fmt_input(backend_raw)}")
    kind = backend_raw.get("kind")
    if kind is None:
        raise ConfigError("backend.kind: required key missing")
    try:
        spec = get_backend(kind)
    except KeyError as e:
        from rtpo.scenario.backends import _PROVIDERS, BACKENDS

        raise ConfigError(f"backend.kind: {e.args[0]}{suggest(kind, {*_PROVIDERS, *BACKENDS.names()})}") from None
    backend = validate_model(spec.config, backend_raw, "backend")
    task = spec.parse_task(data["task"])
    sections = {}
    for key, model in (
        ("budget", BudgetConfig),
        ("train", TrainConfig),
        ("eval", EvalConfig),
        ("logging", LoggingConfig),
    ):
        sections[key] = validate_model(model, data.get(key) or {}, key)
    resources_raw = data.get("resources")
    if resources_raw is not None:
        if not isinstance(resources_raw, dict):
            raise ConfigError(f"resources: must be a mapping, got {_fmt_input(resources_raw)}")
        from rtpo.distributed.resources import Resources

        try:
            Resources.from_dict(resources_raw)
        except (ValueError, TypeError) as e:
            raise ConfigError(str(e).splitlines()[0]) from None
    cfg = ScenarioConfig(
        name=name,
        seed=seed,
        plugins=plugin_names,
        backend=backend,
        task=task,
        method=_method_section(data["method"]),
        resources=resources_raw,
        **sections,
    )
    if spec.memory is not None:
        check_memory(spec.memory(cfg))
    return cfg


def machine_memory_bytes() -> int:
    """Physical memory of this machine (RTPO_MEMORY_LIMIT_GB overrides it, e.g. for a shared node)."""
    override = os.environ.get("RTPO_MEMORY_LIMIT_GB")
    if override:
        return int(float(override) * 2**30)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_memory(parts: list[tuple[str, int]]) -> None:
    """Refuse, before anything is allocated, a scenario whose estimated footprint exceeds the machine."""
    total, limit = sum(b for _, b in parts), machine_memory_bytes()
    if total > limit:
        key, _ = max(parts, key=lambda p: p[1])
        raise ConfigError(
            f"{key}: the scenario would need about {total / 2**30:,.1f} GiB, more than this machine's "
            f"{limit / 2**30:,.1f} GiB (RTPO_MEMORY_LIMIT_GB overrides the limit)"
        )


# -- files and overrides -----------------------------------------------------------------------------
def default_scenario_text() -> str:
    """The embedded default scenario (package data, so `rtpo run` works from any directory)."""
    from rtpo.scenario.shipped import default_path

    return default_path().read_text()


def apply_override(data: dict, override: str) -> None:
    """Set `key.sub=value` in the raw mapping; value is parsed as a YAML scalar."""
    key, eq, raw = override.partition("=")
    key = key.strip()
    if not eq or not key:
        raise ConfigError(f"override {override!r}: must look like key.sub=value")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", key):
        raise ConfigError(f"{key}: not a valid key path")
    value = parse_yaml(raw, key) if raw.strip() else None
    if isinstance(value, dict) or (isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value)):
        raise ConfigError(f"{key}: override value must be a scalar or a list of scalars, got {_fmt_input(raw)}")
    node, last = dotted_parent(data, key)
    node[last] = value
    from rtpo.scenario.paths import resolve_override

    resolve_override(data, key)  # a relative input path typed on the command line: the current folder's


def dotted_parent(data: dict, key: str) -> tuple[dict, str]:
    """(the section that holds `key`'s last part, that part) for a dotted key in a raw mapping; missing
    sections on the way are created, a value standing where a section should be is a ConfigError."""
    parts = key.split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{'.'.join(parts[: i + 1])}: is a value, not a section")
        node = child
    return node, parts[-1]


def load_scenario(
    path: str | Path | None, overrides: list[str] | tuple[str, ...] = (), plugins: list[str] | tuple[str, ...] = ()
) -> ScenarioConfig:
    """Read a scenario file (None = the embedded default), apply overrides, validate.

    `plugins` (the CLI's --plugin MODULE) are added to the scenario's own `plugins` list, which is loaded
    (rtpo.scenario.plugins) before anything is looked up in a registry and is recorded in the resolved config."""
    if path is None:
        text, where = default_scenario_text(), "default scenario"
    else:
        from rtpo.scenario.shipped import scenario_file

        p = scenario_file(path)  # a file, or a shipped scenario's name (one-line errors: a folder, no such name)
        where = str(p)
        try:
            text = p.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{where}: cannot read: {e}") from None
    data = parse_yaml(text, where)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: must be a mapping of sections, got {_fmt_input(data)}")
    if path is not None:
        from rtpo.scenario.paths import file_data

        file_data(p, data)  # relative data paths in the file are relative to its folder (rtpo.scenario.paths)
    before = data.get("method", {}).get("name") if isinstance(data.get("method"), dict) else None
    for ov in overrides:
        apply_override(data, ov)
    from rtpo.scenario import plugins as _plugins

    if plugins:
        data["plugins"] = list(dict.fromkeys([*_plugins.check_names(data.get("plugins")), *plugins]))
    _plugins.load(data.get("plugins"))  # a plugin's method must be known to _switch_method below
    _switch_method(data, before, overrides)
    return parse_scenario(data)


def _switch_method(data: dict, before: Any, overrides) -> None:
    """`method.name=<other>` on the command line: keep the file's method keys the other method also has,
    drop the rest (named on stderr) — the file's `trunks_per_query` means nothing to GRPO.  Keys given
    on the command line are always kept (and validated)."""
    method = data.get("method")
    if not isinstance(method, dict) or method.get("name") == before or before is None:
        return
    from rtpo.core import methods

    try:
        cfg_cls = methods.get(method.get("name")).Config
    except (KeyError, ValueError, AttributeError):
        return  # an unknown name: parse_scenario says so
    known = {f.name for f in dataclasses.fields(cfg_cls)} | {"name"}
    given = {ov.partition("=")[0].strip().split(".", 1)[1] for ov in overrides if ov.strip().startswith("method.")}
    dropped = sorted(k for k in method if k not in known and k not in given)
    for k in dropped:
        del method[k]
    if dropped:
        print(
            f"note: method {method['name']!r} has no {', '.join(dropped)} (from the scenario's {before!r}); dropped",
            file=sys.stderr,
        )
