"""Exact worlds on the llm backend: the wiring that lets every tabular task kind run as a chat task.

Owns nothing but that wiring; may import rtpo.tabular, rtpo.llm (their task and world modules) and the
core.  rtpo.tabular and rtpo.llm never import each other; this package sits beside them on the backends'
floor (the backend registry
imports it with the llm backend, rtpo.scenario.backends._EXTENSIONS) and registers one provider in
rtpo.llm.worlds.WORLDS: the kinds of rtpo.tabular.tasks.TASKS (asked each time, so a plugin's kind
counts), parsed by the tabular backend's own task parser (the same keys, the same one-line errors) and
built into the MDP's arrays with V* from the tabular solver (rtpo.tabular.solve, backward induction).
So `task: {kind: tool_chain, ...}` means the same MDP under `backend.kind: tabular` and `llm`.
"""

from __future__ import annotations

from rtpo.llm.worlds import WORLDS, World, WorldProvider
from rtpo.tabular.build import TabularTaskConfig, build_mdp
from rtpo.tabular.build import parse_task as parse_tabular_task
from rtpo.tabular.solve import solve
from rtpo.tabular.tasks import TASKS


def _build(section: TabularTaskConfig) -> World:
    mdp = build_mdp(section)
    return World.of(mdp, solve(mdp).value, section.kind)


def register() -> None:
    """Register the tabular provider in WORLDS unless it is there (the backend registry calls this each
    time the llm backend is asked for)."""
    if "tabular" not in WORLDS:
        WORLDS.register("tabular")(WorldProvider(kinds=TASKS.names, parse=parse_tabular_task, build=_build))


register()
