"""The scenario schema: section models, the one-line ConfigError, YAML reading and validation helpers.

Everything here is below the backends: a backend's config section and task parser build on these pieces,
and rtpo.scenario.load (which parses a whole scenario by looking its backend and method up in their
registries) builds on them and on the backends.  Import from rtpo.scenario.load in user code; it re-exports
these names.
"""

from __future__ import annotations

import dataclasses
import math
import re
import reprlib
import typing
from dataclasses import asdict
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

SECTIONS = ("name", "seed", "plugins", "backend", "task", "method", "budget", "train", "eval", "logging", "resources")


class ConfigError(ValueError):
    """A bad scenario file, key or value; str(err) is one line naming the key."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))  # guarantee a single line


# -- YAML with floats as people write them ---------------------------------------------------------
class _Loader(yaml.SafeLoader):
    """PyYAML (YAML 1.1) reads `1e-3` as a string; scenario files mean a float."""


_Loader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _construct_mapping(self: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict:
    """A key given twice in one mapping is an error naming both lines (PyYAML keeps the last silently,
    so a scenario's second `G:` would override the first unseen).  `<<` merges may still be overridden."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicated key {str(key)[:60]!r} (first at line {seen[key]})", key_node.start_mark
                )
            seen[key] = line
    return yaml.SafeLoader.construct_mapping(self, node, deep=deep)


_Loader.construct_mapping = _construct_mapping  # type: ignore[method-assign]


MAX_SCENARIO_NODES = 100_000  # values in a scenario after expanding YAML aliases; real ones have < 1,000


def parse_yaml(text: str, where: str) -> Any:
    try:
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"{where}: invalid YAML{at}: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{where}: invalid YAML: nested too deeply") from None
    check_plain_data(data, where)
    return data


def check_plain_data(data: Any, where: str = "scenario") -> None:
    """Refuse what no scenario means but YAML can say: an alias bomb (a few lines that expand to billions
    of values: counted per shared node, never expanded), nesting deeper than a stack, and non-finite
    numbers (`.nan`, `.inf`: a NaN learning rate runs to the end and reports NaN).  The error names the
    first offending key path."""
    sizes: dict[int, int] = {}  # id(container) -> values below it once expanded (shared nodes counted once)

    def size(node: Any, path: str, depth: int) -> int:
        if isinstance(node, float) and not math.isfinite(node):
            raise ConfigError(f"{path or where}: must be a finite number, got {node!r}")
        if not isinstance(node, (dict, list)):
            return 1
        if depth > 100:
            raise ConfigError(f"{path or where}: nested more than 100 levels deep")
        key = id(node)
        if key in sizes:
            return sizes[key]
        sizes[key] = 0  # a self-referencing alias counts as nothing more
        items = node.items() if isinstance(node, dict) else enumerate(node)
        total = 1
        for k, v in items:
            total += size(v, f"{path}.{k}" if path else str(k), depth + 1)
            if total > MAX_SCENARIO_NODES:
                raise ConfigError(
                    f"{path or where}: expands to more than {MAX_SCENARIO_NODES:,} values (YAML aliases?)"
                )
        sizes[key] = total
        return total

    size(data, "", 0)


# -- sections shared by every backend ---------------------------------------------------------------
class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class BackendConfig(Section):
    """Base of every backend section; a backend registers a subclass with its own fields."""

    kind: str = Field(description="registered backend: tabular | llm")
    distributed: Literal["none", "sharded", "ray"] = Field(
        "none", description="in-process | in-process with per-boundary rng streams | Ray workers (rtpo.distributed)"
    )
    address: str | None = Field(
        None, description="Ray cluster to join (auto, ray://host:10001); null starts a local one"
    )


class BudgetConfig(Section):
    iterations: int = Field(20, ge=1, description="training iterations (one batch of queries each)")
    queries_per_iteration: int = Field(32, ge=1, description="queries (prompts) per iteration")
    max_rollouts: int | None = Field(
        None,
        ge=1,
        description="stop at the first iteration boundary where this many rollouts are spent; a begun "
        "iteration always finishes, so a run can pass the cap by less than one iteration (null = no cap)",
    )
    max_tokens: int | None = Field(
        None,
        ge=1,
        description="the same cap on generated response tokens (equal-token budgets; null = no cap)",
    )


class TrainConfig(Section):
    lr: float = Field(0.1, gt=0, description="learning rate of the optimiser")
    optimizer: Literal["adam", "sgd"] = Field("adam", description="optimiser: adam | sgd")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant",
        description="learning rate after the warm-up, by optimiser step (rtpo.core.schedule, torch's LambdaLR; "
        "resumed exactly): constant | linear or cosine decay to min_lr_ratio·lr over decay_steps",
    )
    warmup_steps: int = Field(0, ge=0, description="linear warm-up: optimiser step s < W runs at lr·(s+1)/W (0 = none)")
    decay_steps: int | None = Field(
        None,
        ge=1,
        description="optimiser steps after the warm-up over which linear/cosine decay; the rate is held at "
        "min_lr_ratio·lr afterwards (required by linear and cosine)",
    )
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="where linear/cosine decay ends, as a fraction of lr")

    @model_validator(mode="after")
    def _decay_needs_steps(self) -> TrainConfig:
        if self.lr_schedule != "constant" and self.decay_steps is None:
            raise ValueError(
                f"lr_schedule {self.lr_schedule!r} needs train.decay_steps (optimiser steps to decay over)"
            )
        return self

    def lr_schedule_config(self):
        """The schedule as rtpo.core.schedule.LRSchedule (what both backends' learners take)."""
        from rtpo.core.schedule import LRSchedule

        return LRSchedule(self.lr_schedule, self.warmup_steps, self.decay_steps, self.min_lr_ratio)


class EvalConfig(Section):
    every: int = Field(1, ge=1, description="evaluate the policy after every N-th phase (and after the last)")
    target: float = Field(0.95, gt=0, le=1, description="summary reports whether value >= target * optimum")


class LoggingConfig(Section):
    progress: bool = Field(True, description="rich progress bar (only on a terminal)")
    plot: bool = Field(True, description="write learning_curve.png at the end of the run")
    checkpoint_every: int = Field(
        1,
        ge=1,
        description="phases between checkpoints (the run's last phase always gets "
        "one); --resume restarts from the latest, dropping later metric lines",
    )
    keep_last: int | None = Field(
        3,
        ge=1,
        description="iteration checkpoints kept under RUN/ckpt/iter_N (the newest N; null = all) for "
        "`rtpo eval|export --iter N` and `rtpo run --resume RUN --iter N`",
    )
    generations_per_iteration: int = Field(
        4,
        ge=0,
        description="llm runs: the first N episodes that finish in each iteration's first sampling (trunks or "
        "groups) go to RUN/generations/iter_<i>.jsonl: question, turns, answer, reward (0 = none)",
    )
    hf_export_every: int | None = Field(
        None,
        ge=1,
        description="llm runs: write the policy as a Hugging Face model folder RUN/hf/iter_N after every N-th "
        "iteration and after the last (null = never; `rtpo export RUN OUT` exports a checkpoint afterwards)",
    )
    profile_iteration: int | None = Field(
        None,
        ge=0,
        description="record a torch profiler trace (CPU, and CUDA where there is one) of this iteration, begin "
        "to last phase, into RUN/profile/iter_N.trace.json (Chrome trace format; null = never)",
    )
    trackers: tuple[str, ...] = Field(
        ("jsonl",),
        description="experiment trackers fed the same record as metrics.jsonl, all local/offline "
        "(rtpo.rundir.trackers: jsonl, tensorboard, wandb, trackio, mlflow; each but jsonl is an extra: pip install 'rtpo[wandb]')",
    )

    @field_validator("trackers", mode="before")
    @classmethod
    def _known_trackers(cls, v: Any) -> Any:
        from rtpo.rundir.trackers import TRACKERS

        if isinstance(v, str):
            v = (v,)
        if isinstance(v, list):
            v = tuple(v)
        for name in v if isinstance(v, tuple) else ():
            if name not in TRACKERS:
                raise ValueError(
                    f"unknown tracker {name!r}{suggest(name, TRACKERS.names())} (valid: {', '.join(TRACKERS.names())})"
                )
        return v


class MethodSection(BaseModel):
    """`method: {name: <registered>, **fields of that method's Config dataclass}`."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    name: str = Field(description="registered method (rtpo.core.methods)")
    config: Any = Field(description="an instance of the method's Config dataclass")

    def build(self):
        from rtpo.core import methods

        return methods.get(self.name)(self.config)

    def to_dict(self) -> dict:
        return {"name": self.name, **asdict(self.config)}


class ScenarioConfig(BaseModel):
    """A resolved, validated scenario.  `task` is the backend's own typed task section."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    name: str = Field(description="scenario name (first part of the run folder name)")
    seed: int = Field(0, description="seed of the run's numpy generator and of parameter init")
    plugins: tuple[str, ...] = Field(
        (), description="modules imported before the scenario is read (rtpo.scenario.plugins; --plugin adds to it)"
    )
    backend: Any = Field(description="backend section (a BackendConfig subclass chosen by kind)")
    task: Any = Field(description="task section, typed by the backend")
    method: MethodSection = Field(description="method name and its Config fields")
    budget: BudgetConfig = Field(default_factory=BudgetConfig, description="how much to generate")
    train: TrainConfig = Field(default_factory=TrainConfig, description="optimiser settings")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="evaluation schedule and target")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="progress bar and plots")
    resources: dict | None = Field(None, description="Ray worker layout (rtpo.distributed.Resources); null = defaults")

    def to_dict(self) -> dict:
        """The resolved config as plain data; parse_scenario(cfg.to_dict()) == cfg."""
        task = self.task.to_dict() if hasattr(self.task, "to_dict") else self.task.model_dump()
        return {
            "name": self.name,
            "seed": self.seed,
            # left out when empty, so the config (and checkpoint fingerprint) of a plugin-free run is unchanged
            **({"plugins": list(self.plugins)} if self.plugins else {}),
            "backend": self.backend.model_dump(),
            "task": task,
            "method": self.method.to_dict(),
            "budget": self.budget.model_dump(),
            "train": self.train.model_dump(),
            "eval": self.eval.model_dump(),
            "logging": self.logging.model_dump(),
            **({"resources": self.resources} if self.resources is not None else {}),
        }

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


# -- validation helpers (also used by backends for their task sections) -----------------------------
_SHORT = reprlib.Repr()  # Python 3.11's Repr takes no keyword arguments
_SHORT.maxlevel, _SHORT.maxdict, _SHORT.maxlist, _SHORT.maxtuple, _SHORT.maxset = 2, 3, 3, 3, 3
_SHORT.maxstring = _SHORT.maxlong = _SHORT.maxother = 40


def _fmt_input(value: Any) -> str:
    """A short rendering of a bad value: bounded work and length whatever the value (an alias bomb, a
    400-digit int), so an error message can never hang or flood."""
    text = _SHORT.repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def suggest(word: Any, valid) -> str:
    """' (did you mean X?)' for the closest valid name, or ''."""
    import difflib

    match = difflib.get_close_matches(str(word)[:100], [str(v) for v in valid], n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The pydantic model a nested error location points into (task.fields -> FieldsSection), or None."""
    import typing

    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return None
        ann = field.annotation
        cands = [ann, *typing.get_args(ann)]  # `X | None`
        nxt = next((c for c in cands if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if nxt is None:
            return None
        model = nxt
    return model


def pydantic_error(e: ValidationError, prefix: str, model: type[BaseModel] | None = None) -> ConfigError:
    """The first error of a pydantic ValidationError as a one-line ConfigError under `prefix`."""
    err = e.errors()[0]
    loc = ".".join(str(p) for p in (prefix, *err["loc"]) if p != "")
    if err["type"] == "extra_forbidden":
        hint = ""
        sub = _model_at(model, err["loc"][:-1]) if model is not None else None
        if sub is not None:
            hint = suggest(err["loc"][-1], sub.model_fields)
        return ConfigError(f"{loc}: unknown key{hint}")
    if err["type"] == "missing":
        return ConfigError(f"{loc}: required key missing")
    msg = err["msg"]
    msg = re.sub(r"^Value error, ", "", msg)
    msg = re.sub(r"^Input should be ", "must be ", msg)
    msg = msg.replace("greater than or equal to", ">=").replace("less than or equal to", "<=")
    msg = msg.replace("greater than", ">").replace("less than", "<")
    return ConfigError(f"{loc}: {msg}, got {_fmt_input(err.get('input'))}")


def validate_model(model: type[BaseModel], data: Any, prefix: str) -> BaseModel:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix}: must be a mapping, got {_fmt_input(data)}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise pydantic_error(e, prefix, model) from None


def validate_dataclass(cls: type, data: dict, prefix: str, reserved: tuple[str, ...] = ()) -> Any:
    """Build dataclass `cls` from `data`, checking each field's type strictly (an int is a float, a
    bool is not an int) and turning __post_init__'s ValueError into an error naming the field it
    starts with.  Keys in `reserved` belong to the caller and are skipped."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    values = {}
    for key, raw in data.items():
        if key in reserved:
            continue
        if key not in fields:
            valid = ", ".join(sorted((*reserved, *fields)))
            raise ConfigError(f"{prefix}.{key}: unknown key{suggest(key, (*reserved, *fields))} (valid: {valid})")
        try:
            values[key] = TypeAdapter(hints[key], config=ConfigDict(strict=True)).validate_python(raw)
        except ValidationError as e:
            raise pydantic_error(e, f"{prefix}.{key}") from None
    try:
        return cls(**values)
    except (ValueError, TypeError, KeyError) as e:
        msg = " ".join(str(e.args[0] if e.args else e).split())
        head, _, rest = msg.partition(" ")
        if head in fields and rest:  # "G must be >= 2 ..." names its field first
            raise ConfigError(f"{prefix}.{head}: {rest}") from None
        # a registry lookup ("unknown estimator 'x'; valid: ...") names the bad value instead
        named = [k for k, v in values.items() if isinstance(v, str) and repr(v) in msg]
        if len(named) == 1:
            raise ConfigError(f"{prefix}.{named[0]}: {msg}") from None
        raise ConfigError(f"{prefix}: {msg}") from None


def registered_name(data: Any, section: str, key: str, registry: Any, what: str) -> str:
    """The registered name a section selects by `key` (method.name, task.kind), checked with one-line errors."""
    if not isinstance(data, dict):
        raise ConfigError(f"{section}: must be a mapping, got {_fmt_input(data)}")
    name = data.get(key)
    if name is None:
        raise ConfigError(f"{section}.{key}: required key missing")
    if not isinstance(name, str) or name not in registry:
        hint = suggest(name, registry.names())
        raise ConfigError(
            f"{section}.{key}: unknown {what} {_fmt_input(name)}{hint} (valid: {', '.join(registry.names())})"
        )
    return name
