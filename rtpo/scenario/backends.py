"""Backend registry: a backend kind names its config section, its task parser, a builder and (optionally)
an exact solver.  The runner and the CLI look a kind up here and never branch on it.

A backend registers itself when its module is imported; `_PROVIDERS` says which module provides each
built-in kind, so `backend.kind: llm` imports rtpo.llm.build on first use and nothing else needs editing.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rtpo.core.methods import RunContext
from rtpo.core.registry import Registry

if TYPE_CHECKING:
    from rtpo.core.sampled_eval import SampledEval
    from rtpo.scenario.schema import ScenarioConfig


@dataclass(frozen=True)
class PendingCounters:
    """state: () -> the counters accumulated and not yet logged (a picklable dict); load: sets them."""

    state: Callable[[], dict]
    load: Callable[[dict], None]


@dataclass
class BuiltBackend:
    """What a builder returns: the objects a method drives plus how to evaluate and checkpoint them.

    ctx:                the core RunContext (env, sampler, learner, rng, budget).
    evaluate:           () -> metrics of the learner's current policy (tabular: exact value, V*, ratio).
    sampler_state:      () -> picklable sampler weights (they may lag the learner's between syncs).
    load_sampler_state: restores what sampler_state returned.
    sample_log:         optional (n) -> the episodes kept since the last call, then keep the first n that
                        finish from now on (llm: question, turns, answer, reward); the runner saves a few
                        per iteration (logging.generations_per_iteration).
    sampler_state_at_boundary: optional () -> what to checkpoint for the sampler between iterations, where
                        every method's `begin` pushes the learner's weights first (Algorithm 1 step 2.1), so
                        the weights the sampler holds are never used again (llm: a marker, not a second copy
                        of the weights; the restored sampler refuses to sample before that push).
    counters:           optional PendingCounters: the env's counters that `evaluate` logs (env/*), read and
                        set by checkpoints so a resume between two evaluations logs what was counted
                        before the checkpoint too (llm: the env's counters since the last evaluate()).
    num_queries:        size of the query set (ids cycle through it); None = unbounded ids.
    value_key:          the evaluate() metric that is the policy's value (plotted, summarised).
    optimum_key:        the evaluate() metric holding the exact optimum, if the backend knows one.
    reference_keys:     further evaluate() metrics drawn as horizontal lines on the learning curve.
    sampled_eval:       optional rtpo.core.sampled_eval.SampledEval: the eval environments, the policy at evaluation
                        sampling settings and those settings, for `rtpo eval` (Pass@k and friends).
    """

    ctx: RunContext
    evaluate: Callable[[], dict[str, float]]
    sampler_state: Callable[[], Any]
    load_sampler_state: Callable[[Any], None]
    sampler_state_at_boundary: Callable[[], Any] | None = None
    sample_log: Callable[[int], list[dict]] | None = None
    counters: PendingCounters | None = None
    num_queries: int | None = None
    value_key: str = "eval/value"
    optimum_key: str | None = None
    reference_keys: tuple[str, ...] = ()
    sampled_eval: SampledEval | None = None


@dataclass(frozen=True)
class BackendSpec:
    """config:     the backend section's pydantic model (a rtpo.scenario.load.BackendConfig subclass).
    parse_task:    raw `task` mapping -> typed task section (raises ConfigError naming `task.<key>`);
                   the returned object has to_dict() giving back plain data.
    build:         (ScenarioConfig) -> BuiltBackend.
    solve:         optional (ScenarioConfig) -> text for `rtpo solve` (exact optimum and policy).
    build_role:    optional (ScenarioConfig, role) -> RunContext holding only what one worker role of a
                   distributed run uses ("rollout": env + sampler, "trainer": learner, "driver": all);
                   without it every worker runs the full build (rtpo.distributed.ScenarioFactory).
    task_schemas:  optional () -> JSON Schemas of the task sections the backend accepts (one per task
                   family); `rtpo config schema` offers them as alternatives.
    memory:        optional (ScenarioConfig) -> [(key, bytes), ...]: what building and one iteration would
                   allocate, by the config key that drives each part; the loader refuses a scenario whose
                   total exceeds the machine's memory, naming the largest part's key.
    diagnostic:    optional (ScenarioConfig) -> lines `rtpo compare` prints under its table (tabular: the
                   exact variance decomposition and RTPO/GRPO information index under the initial policy).
    export:        optional (ScenarioConfig, weights, out, manifest) -> out: write the policy given by
                   `weights` (the learner's full state dict of model weights) as a standalone model folder
                   (llm: a Hugging Face folder); `rtpo export` and `logging.hf_export_every` call it.
                   A backend without it has nothing to export (`rtpo export` refuses in one line).
    tool_factory:  optional (ScenarioConfig) -> a picklable factory of one tool callable per Ray tool worker
                   (resources.tool_workers), or None when the scenario makes no tool calls that can run
                   there; build_role(cfg, "rollout", run_tool=...) then routes the rollout workers' calls
                   to those workers (rtpo.distributed.distribute).
    inputs:        optional (ScenarioConfig) -> {key: content digest} of what a run reads besides its config
                   (llm: backend.init's weights), recorded in RUN/provenance.json; `rtpo run --resume`
                   refuses, before building anything, a run whose digests changed since it started."""

    config: type
    parse_task: Callable[[Any], Any]
    build: Callable[[ScenarioConfig], BuiltBackend]
    solve: Callable[[ScenarioConfig], str] | None = None
    build_role: Callable[[ScenarioConfig, str], RunContext] | None = None
    memory: Callable[[ScenarioConfig], list[tuple[str, int]]] | None = None
    task_schemas: Callable[[], list[dict]] | None = None
    diagnostic: Callable[[ScenarioConfig], list[str]] | None = None
    export: Callable[[ScenarioConfig, dict, Any, dict | None], Any] | None = None
    tool_factory: Callable[[ScenarioConfig], Any] | None = None
    inputs: Callable[[ScenarioConfig], dict[str, str]] | None = None


BACKENDS: Registry[BackendSpec] = Registry("backend")

# kind -> module whose import registers it (kept lazy: an LLM backend pulls in heavy packages)
_PROVIDERS: dict[str, str] = {
    "tabular": "rtpo.tabular.build",
    "tabular_history": "rtpo.tabular.history_build",
    "llm": "rtpo.llm.build",
}
# kind -> modules imported after its provider that extend it from above the backends (they may import
# more than one backend): the llm backend's exact worlds take their MDPs from the tabular task kinds
_EXTENSIONS: dict[str, tuple[str, ...]] = {"llm": ("rtpo.worlds",)}


def register_backend(name: str, spec: BackendSpec) -> BackendSpec:
    return BACKENDS.register(name)(spec)


def get_backend(kind: Any) -> BackendSpec:
    """The spec of `kind`, importing its provider module on first use.  KeyError lists the valid kinds."""
    if not isinstance(kind, str):
        raise KeyError(f"must be a string naming a backend, got {kind!r}")
    if kind in _PROVIDERS:
        try:
            if kind not in BACKENDS:
                importlib.import_module(_PROVIDERS[kind])
            # every time, not only on first use: the provider may have been imported directly (a test, a
            # library caller), and an extension's `register()` puts back what a failed plugin import
            # rolled back (both cheap once imported)
            for ext in _EXTENSIONS.get(kind, ()):
                register = getattr(importlib.import_module(ext), "register", None)
                if register is not None:
                    register()
        except ModuleNotFoundError as e:
            raise KeyError(f"backend {kind!r} is not available here ({e})") from None
    if kind not in BACKENDS:
        valid = ", ".join(sorted(set(BACKENDS.names()) | set(_PROVIDERS)))
        raise KeyError(f"unknown backend {kind!r}; valid: {valid}")
    return BACKENDS.get(kind)


def rollout_memory(cfg: ScenarioConfig, num_turns: int, bytes_per_turn: int) -> tuple[str, int]:
    """(key, bytes) of one iteration's sampled turns, for a backend's `memory` estimate: queries per
    iteration x the method's rollouts per query x turns x `bytes_per_turn`.  The key named is the one that
    drives the product: `budget.queries_per_iteration`, or the method's largest integer setting (`method.G`,
    `method.trunks_per_query`, ...) when the rollouts per query outweigh the queries."""
    import dataclasses

    m = cfg.method.config
    per_query = cfg.method.build().rollouts_per_query(num_turns) or getattr(m, "G", 1) * num_turns
    queries = cfg.budget.queries_per_iteration
    key = "budget.queries_per_iteration"
    sizes = {
        f.name: getattr(m, f.name)
        for f in dataclasses.fields(m)
        if isinstance(getattr(m, f.name), int) and not isinstance(getattr(m, f.name), bool)
    }
    if sizes and per_query > queries:
        key = "method." + max(sizes, key=sizes.get)
    return key, int(queries * per_query * num_turns * bytes_per_turn)


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def extra_for(module: str | None) -> str | None:
    """The rtpo extra (pyproject.toml's optional dependencies) whose package provides top-level module
    `module`, read from the installed rtpo's metadata; None when no extra names it."""
    from importlib import metadata

    if not module:
        return None
    top = _norm(module.split(".")[0])
    try:
        requires = metadata.requires("rtpo") or []
    except metadata.PackageNotFoundError:
        return None
    for req in requires:
        name, _, marker = req.partition(";")
        extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", marker)
        dist = _norm(re.split(r"[\s<>=!~\[(]", name.strip(), maxsplit=1)[0])
        if extra and extra.group(1) != "ci" and (dist == top or dist.startswith(top + "-")):
            return extra.group(1)
    return None


def build_backend(cfg: ScenarioConfig) -> BuiltBackend:
    """`get_backend(cfg.backend.kind).build(cfg)`; a package of an rtpo extra that is not installed is a
    one-line ConfigError naming the extra (`pip install 'rtpo[llm]'`), not an import traceback."""
    from rtpo.scenario.schema import ConfigError

    try:
        return get_backend(cfg.backend.kind).build(cfg)
    except ModuleNotFoundError as e:
        extra = extra_for(e.name)
        if extra is None:
            raise
        raise ConfigError(
            f"backend.kind: {cfg.backend.kind} scenarios need the {extra} extra (pip install 'rtpo[{extra}]'); "
            f"{e.name!r} is not installed"
        ) from None
