"""Where a scenario's file paths point: a relative path written in a scenario file is relative to that
file's folder, not to the folder `rtpo` runs from, so a user running `rtpo run scenarios/llm/x.yaml` from
the repository, `rtpo run x` (the shipped copy, package data) and `rtpo run ../repo/scenarios/llm/x.yaml`
from elsewhere all read the same data.  A relative path given on the command line (`key=value`) is
relative to the current folder, as a shell user expects.  Either way the path is made absolute at load
time, so the resolved config written into a run folder names the file itself (a resume from another
folder reads the same one).

Only the keys of INPUT_PATHS are paths the run reads; folders a run writes (`backend.model_cache`, a QA
task's `data_dir`, `retriever.cache_dir`) stay relative to the current folder, like `--out`.  A relative
path that names nothing is a one-line ConfigError naming the key and the resolved path; an absolute one
is checked where it is read (a shipped 8-GPU scenario's `/path/to/Qwen3-8B` is a placeholder).

May import: rtpo.scenario.schema (ConfigError) only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rtpo.scenario.schema import ConfigError

# dotted key -> the values at that key that are names, not paths
INPUT_PATHS: dict[str, tuple[str, ...]] = {
    "backend.model": ("tiny-random",),
    "backend.init": (),
    "method.data": (),
    "task.path": (),
    "task.eval_path": (),
    "task.retriever.corpus": (),
    "task.judge.model": ("initial",),
    "task.user_model": ("policy",),
    "task.judge_model": ("policy",),
}
# keys that are input paths for some task kinds only (elsewhere the same name is an output folder)
INPUT_PATHS_BY_KIND: dict[str, dict[str, tuple[str, ...]]] = {"airline": {"task.data_dir": ()}}


def _keys(data: dict) -> dict[str, tuple[str, ...]]:
    task = data.get("task")
    kind = task.get("kind") if isinstance(task, dict) else None
    return {**INPUT_PATHS, **INPUT_PATHS_BY_KIND.get(kind if isinstance(kind, str) else "", {})}


def _get(data: dict, key: str) -> tuple[dict | None, str]:
    node: Any = data
    *parents, last = key.split(".")
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    return (node if isinstance(node, dict) else None), last


def resolve_one(key: str, value: Any, base: Path, where: str, names: tuple[str, ...] = ()) -> Any:
    """`value` at `key` as an absolute path: relative ones joined to `base` and checked to exist (a
    one-line ConfigError naming key and resolved path otherwise; `where` says what they are relative to)."""
    if not isinstance(value, str) or not value.strip() or value in names or os.path.isabs(value):
        return value
    resolved = os.path.normpath(os.path.join(os.path.abspath(base), os.path.expanduser(value)))
    if not os.path.exists(resolved):
        raise ConfigError(f"{key}: {resolved} does not exist ({value!r} is relative to {where})")
    return resolved


def resolve_paths(data: dict, base: Path, where: str) -> dict:
    """Rewrite, in place, every relative INPUT_PATHS value of the raw scenario mapping `data` to an
    absolute path relative to `base`; returns `data`."""
    for key, names in _keys(data).items():
        node, last = _get(data, key)
        if node is not None and last in node:
            node[last] = resolve_one(key, node[last], base, where, names)
    return data


def resolve_override(data: dict, key: str) -> None:
    """After a command-line `key=value`: a relative input path in it is relative to the current folder."""
    names = _keys(data).get(key)
    if names is None:
        return
    node, last = _get(data, key)
    if node is not None and last in node:
        node[last] = resolve_one(key, node[last], Path.cwd(), "the current folder", names)


def file_data(path: Path, data: dict) -> dict:
    """A scenario file's raw mapping with its relative input paths resolved against the file's folder."""
    return resolve_paths(data, path.parent, f"the scenario's folder {os.path.abspath(path.parent)}")
