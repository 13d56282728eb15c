"""Config you can read: every key of a resolved scenario with its default and one line of meaning.

One source for three outputs: `rtpo config show` (the resolved scenario as YAML, each key commented with
its meaning and default — edit it, save it, run it), `rtpo config schema` (a JSON Schema of scenario files)
and docs/config.md (`python -m rtpo.scenario.docs --write docs/config.md`; a test fails when it is stale).
The meanings come from where the keys are defined: pydantic `Field(description=...)` for the shared
sections and the backends' sections, and the `name: meaning` lines of a method's or task's Config
dataclass docstring, so a key added anywhere appears here without an edit.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, TypeAdapter

from rtpo.scenario.load import SECTIONS, BudgetConfig, EvalConfig, LoggingConfig, ScenarioConfig, TrainConfig

_TOP = {
    "name": "scenario name (first part of the run folder name)",
    "seed": "seed of the run's numpy generator and of parameter init",
    "plugins": "modules imported first, registering methods, estimators, tasks, tools or backends (docs/plugins.md)",
    "backend": "which backend runs the scenario, and its settings",
    "task": "what the policy is trained on (typed by the backend)",
    "method": "the algorithm (a registered method) and its settings",
    "budget": "how much to generate",
    "train": "optimiser settings",
    "eval": "evaluation schedule and target",
    "logging": "progress, plots and checkpoints",
    "resources": "Ray worker layout (rtpo.distributed.Resources); null = defaults",
}


# -- meanings ------------------------------------------------------------------------------------------------
def _docstring_meanings(cls: type) -> dict[str, str]:
    """`name: meaning` entries of a dataclass's docstring and its bases' (several per line allowed, `;`-separated)."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        doc = inspect.getdoc(klass) or ""
        if klass is object or not doc:
            continue
        names = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []
        for name in names:
            m = re.search(rf"(?:^|;\s*|\n\s*){re.escape(name)}:\s+([^;\n]+(?:\n\s{{6,}}(?!\w+:\s)[^;\n]+)*)", doc)
            if m:
                out[name] = " ".join(m.group(1).split()).rstrip(".")
                continue
            # a shared entry: "a, b, c: meaning"
            m = re.search(rf"(?m)^\s*((?:\w+,\s*)*{re.escape(name)}(?:,\s*\w+)*):\s+(.+)$", doc)
            if m:
                out[name] = " ".join(m.group(2).split()).rstrip(".")
    return out


def _model_meanings(model: type[BaseModel]) -> dict[str, Any]:
    """key -> meaning; a nested section's own keys under `key + "."`."""
    out: dict[str, Any] = {}
    for k, f in model.model_fields.items():
        out[k] = f.description or ""
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel):
            out[k + "."] = _model_meanings(f.annotation)
    return out


def _section_meanings(cfg: ScenarioConfig) -> dict[str, dict[str, str]]:
    """Section -> key -> meaning for the scenario's own backend, task and method."""
    out: dict[str, dict[str, str]] = {
        "backend": _model_meanings(type(cfg.backend)),
        "budget": _model_meanings(BudgetConfig),
        "train": _model_meanings(TrainConfig),
        "eval": _model_meanings(EvalConfig),
        "logging": _model_meanings(LoggingConfig),
    }
    task = cfg.task
    if isinstance(task, BaseModel):
        meanings = _model_meanings(type(task))
        inner = getattr(task, "tabular", None)  # an exact world (rtpo.llm.worlds): the tabular section inside
        if isinstance(inner, BaseModel):
            meanings.pop("tabular", None)
            meanings = {**_model_meanings(type(inner)), **meanings}
            task = inner
        params = getattr(task, "params", None)
        if params is not None and dataclasses.is_dataclass(params):
            meanings.pop("params", None)
            meanings.update(_docstring_meanings(type(params)))
        out["task"] = meanings
    if cfg.resources is not None:
        try:
            from rtpo.distributed.resources import Resources

            out["resources"] = _docstring_meanings(Resources)
        except ImportError:
            pass
    method = {"name": "registered method (rtpo.core.methods; `rtpo config show method.name=X` shows its keys)"}
    method.update(_docstring_meanings(type(cfg.method.config)))
    out["method"] = method
    return out


# -- rtpo config show ---------------------------------------------------------------------------------------
def _scalar(v: Any) -> str:
    text = yaml.safe_dump(v, default_flow_style=True, width=10_000).strip()
    return text[:-4].strip() if text.endswith("...") else text


def _lines(data: dict, meanings: dict[str, Any], defaults: dict[str, Any], indent: int) -> list[str]:
    out = []
    pad = "  " * indent
    for key, value in data.items():
        meaning = meanings.get(key, "") if isinstance(meanings, dict) else ""
        meaning = meaning if isinstance(meaning, str) else ""
        section = isinstance(meanings, dict) and isinstance(meanings.get(key + "."), dict)
        if isinstance(value, dict) and value and (section or indent == 0):
            note = f"  # {meaning}" if meaning else ""
            out.append(f"{pad}{key}:{note}")
            sub = meanings.get(key + ".", {}) if isinstance(meanings, dict) else {}
            out += _lines(value, sub, defaults.get(key, {}) if isinstance(defaults.get(key), dict) else {}, indent + 1)
            continue
        line = f"{pad}{key}: {_scalar(value)}"
        extra = []
        if meaning:
            extra.append(meaning)
        if key in defaults and defaults[key] != value:
            extra.append(f"default {_scalar(defaults[key])}")
        out.append(line + (f"  # {'; '.join(extra)}" if extra else ""))
    return out


def _defaults(cfg: ScenarioConfig) -> dict[str, dict[str, Any]]:
    def of_model(model: type[BaseModel]) -> dict[str, Any]:
        out = {}
        for k, f in model.model_fields.items():
            if not f.is_required():
                out[k] = f.get_default(call_default_factory=True)
                if isinstance(out[k], BaseModel):
                    out[k] = out[k].model_dump()
        return out

    def of_dataclass(obj: Any) -> dict[str, Any]:
        return {
            f.name: f.default for f in dataclasses.fields(obj) if f.init and f.default is not dataclasses.MISSING
        } | {
            f.name: f.default_factory()
            for f in dataclasses.fields(obj)
            if f.init and f.default_factory is not dataclasses.MISSING
        }

    d = {
        "backend": of_model(type(cfg.backend)),
        "budget": of_model(BudgetConfig),
        "train": of_model(TrainConfig),
        "eval": of_model(EvalConfig),
        "logging": of_model(LoggingConfig),
        "method": of_dataclass(cfg.method.config),
        "seed": 0,
    }
    task = cfg.task
    if isinstance(task, BaseModel):
        t = of_model(type(task))
        inner = getattr(task, "tabular", None)  # an exact world: the tabular section's defaults too
        if isinstance(inner, BaseModel):
            t.pop("tabular", None)
            t = {**of_model(type(inner)), **t}
            task = inner
        params = getattr(task, "params", None)
        if params is not None and dataclasses.is_dataclass(params):
            t.pop("params", None)
            t.update(of_dataclass(params))
        d["task"] = t
    return d


def show(cfg: ScenarioConfig) -> str:
    """The resolved scenario as YAML, every key commented with its meaning (and its default where the
    scenario sets another value); loading the text back gives the same scenario."""
    data = cfg.to_dict()
    meanings = _section_meanings(cfg)
    defaults = _defaults(cfg)
    lines = [
        f"# Scenario {cfg.name!r}, fully resolved: every key with its meaning (rtpo config show).",
        "# Save it, edit it and run it: rtpo run FILE.  Keys left out take the defaults shown here.",
    ]
    for key in SECTIONS:
        if key not in data:
            continue
        value = data[key]
        if isinstance(value, dict):
            lines.append("")
            lines.append(f"{key}:  # {_TOP[key]}")
            lines += _lines(value, meanings.get(key, {}), defaults.get(key, {}), 1)
        else:
            lines.append(f"{key}: {_scalar(value)}  # {_TOP[key]}")
    return "\n".join(lines) + "\n"


# -- rtpo config schema -------------------------------------------------------------------------------------
def _load_all_backends() -> None:
    from rtpo.scenario import backends

    for kind in list(getattr(backends, "_PROVIDERS", {})):
        try:
            backends.get_backend(kind)
        except Exception:  # noqa: BLE001 - a backend whose extra is missing is left out of the schema
            continue


def _dataclass_schema(cls: type) -> dict:
    props, meanings = {}, _docstring_meanings(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        s = TypeAdapter(hints[f.name]).json_schema()
        if meanings.get(f.name):
            s["description"] = meanings[f.name]
        if f.default is not dataclasses.MISSING:
            s["default"] = f.default
        props[f.name] = s
    return {"type": "object", "properties": props, "additionalProperties": False}


def schema() -> dict:
    """A JSON Schema (draft 2020-12) of scenario files: sections, every registered method's keys, every
    installed backend's section and task keys (a task's kind-specific keys as alternatives)."""
    from rtpo.core import methods
    from rtpo.scenario import backends, plugins

    plugins.load()  # installed plugins' methods and backends are part of what a scenario may say
    _load_all_backends()
    method_variants = []
    for name in methods.names():
        s = _dataclass_schema(methods.get(name).Config)
        s["properties"] = {"name": {"const": name}, **s["properties"]}
        s["required"] = ["name"]
        method_variants.append(s)
    backend_variants, task_variants = [], []
    for kind in backends.BACKENDS.names():
        spec = backends.BACKENDS.get(kind)
        b = spec.config.model_json_schema()
        b.setdefault("properties", {})["kind"] = {"const": kind}
        backend_variants.append(b)
        task_variants.extend(_task_schemas(spec))
    sections = {
        "name": {"type": "string", "pattern": "^[A-Za-z0-9_.-]+$", "description": _TOP["name"]},
        "seed": {"type": "integer", "minimum": 0, "description": _TOP["seed"]},
        "plugins": {"type": "array", "items": {"type": "string"}, "description": _TOP["plugins"]},
        "backend": {"oneOf": backend_variants, "description": _TOP["backend"]},
        "task": {"anyOf": task_variants, "description": _TOP["task"]},
        "method": {"oneOf": method_variants, "description": _TOP["method"]},
        "budget": BudgetConfig.model_json_schema(),
        "train": TrainConfig.model_json_schema(),
        "eval": EvalConfig.model_json_schema(),
        "logging": LoggingConfig.model_json_schema(),
        "resources": {"type": ["object", "null"], "description": _TOP["resources"]},
    }
    # pydantic puts sub-models under each model's own "$defs" but refers to them from the document root
    # ("#/$defs/X"): hoist them all to the root so every reference resolves
    defs: dict[str, Any] = {}
    for variant in (*backend_variants, *task_variants, *(sections[k] for k in ("budget", "train", "eval", "logging"))):
        for name, sub in variant.pop("$defs", {}).items():
            if name in defs and defs[name] != sub:
                raise RuntimeError(f"two config models are both named {name!r} with different schemas")
            defs[name] = sub
    out = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "rtpo scenario",
        "type": "object",
        "properties": sections,
        "required": ["name", "backend", "task", "method"],
        "additionalProperties": False,
    }
    if defs:
        out["$defs"] = defs
    return out


def _task_schemas(spec) -> list[dict]:
    return spec.task_schemas() if spec.task_schemas is not None else [{"type": "object"}]


# -- docs/config.md -----------------------------------------------------------------------------------------
# one scenario of each task family, so that every task section's keys are documented
DOC_SCENARIOS = (
    "default",
    "scenarios/llm/tiny-cpu.yaml",
    "scenarios/llm/tiny-cpu-search.yaml",
    "scenarios/llm/tiny-cpu-airline.yaml",
)


class ConfigDocError(RuntimeError):
    """A scenario of DOC_SCENARIOS cannot be loaded here (e.g. the llm extra is missing): docs/config.md
    would leave its sections out, so nothing is written."""


def markdown() -> str:
    """docs/config.md: the resolved, commented default tabular scenario and a tiny LLM one per task family.
    Every DOC_SCENARIOS entry is documented or ConfigDocError is raised (never a file missing sections)."""
    from rtpo.scenario.load import load_scenario

    parts = [
        "# Scenario keys",
        "",
        "Generated by `python -m rtpo.scenario.docs --write docs/config.md` from the code that defines the keys",
        "(a test fails when this file is stale). `rtpo config show [SCENARIO] [key=value ...]` prints the same",
        "for any scenario, `rtpo config schema` a JSON Schema, `rtpo scenarios` the shipped scenarios.",
        "",
    ]
    root = Path(__file__).resolve().parents[2]
    for which in DOC_SCENARIOS:
        path = None if which == "default" else root / which
        try:
            cfg = load_scenario(path)
        except Exception as e:  # noqa: BLE001 - whatever stops it (a missing extra, a bad file), named in one line
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ConfigDocError(
                f"cannot document {which}: {type(e).__name__}: {first} "
                "(run it in the project's environment: pip install -e '.[ci]')"
            ) from e
        title = "the embedded default scenario (tabular)" if path is None else f"`{which}` (llm)"
        parts += [f"## {title}", "", "```yaml", show(cfg).rstrip(), "```", ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    """`--write FILE` writes docs/config.md (whole, via a temporary file and a rename), else prints it; when a
    section cannot be documented: one line on stderr, exit 2, FILE untouched."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        text = markdown()
    except ConfigDocError as e:
        print(f"rtpo.scenario.docs: {e}; nothing written", file=sys.stderr)
        return 2
    if argv[:1] == ["--write"] and len(argv) == 2:
        target = Path(argv[1])
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(text)
        tmp.replace(target)
        print(f"wrote {argv[1]}")
        return 0
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
