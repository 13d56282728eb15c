"""Gold trajectories for τ²-airline (rtpo.llm.gold): each task's gold actions replayed through the
environment, one tool call per response, on the episode's own database (real tool outputs), then one
message to the user that states the task's communicate_info and asks whether anything else is needed;
the scripted user answers it with the stop signal and the episode ends normally (scored by τ²'s reward).
A gold action that is a transfer to a human agent ends the episode itself, as in τ².

Imperfect kinds (a share `imperfect` of the tasks): `missing_step` (the last gold action left out),
`bad_call` (a first call to a tool that does not exist, the error it gets, then the gold steps).
The demonstrations' `question` is the τ² task id.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rtpo.llm.gold import Stepper, _record, tool_call

IMPERFECT_AIRLINE = ("missing_step", "bad_call")
CLOSING = "Is there anything else I can help you with?"


class _AirlineStepper(Stepper):
    """Feedback to a tool call is the tool's message; to a message, the user's reply."""

    def say(self, text: str) -> str | None:
        self._role = "tool" if "<tool_call>" in text else "user"
        return super().say(text)

    @property
    def feedback_role(self) -> str:
        return self._role


def airline_demonstrations(env: Any, imperfect: float = 0.15, seed: int = 0) -> list[dict]:
    """One demonstration per training task (see the module docstring)."""
    rng = np.random.default_rng(seed)
    out = []
    for q in range(len(env.task)):
        task = env.task[q]
        actions = list(task.actions)
        kind = IMPERFECT_AIRLINE[int(rng.integers(len(IMPERFECT_AIRLINE)))] if rng.random() < imperfect else None
        if kind == "missing_step" and not actions:
            kind = "bad_call"
        need = len(actions) + 1 + (kind == "bad_call")
        if need > env.num_turns:
            raise ValueError(f"task {task.id}: {need} turns needed, task.num_turns is {env.num_turns}")
        s = _AirlineStepper(env, q)
        if kind == "bad_call":
            s.say(tool_call("lookup_everything", {"user_id": "unknown"}))
        if kind == "missing_step":
            actions = actions[:-1]
        for a in actions:
            s.say(tool_call(a.name, dict(a.arguments)))
            if s.done:
                break
        if not s.done:
            said = " ".join(f"{info}." for info in task.communicate_info)
            s.say(f"Your request has been handled. {said} {CLOSING}".replace("  ", " ").strip())
        if not s.done:
            raise ValueError(f"task {task.id}: the scripted user did not end the conversation")
        note = kind if kind else None
        out.append(_record(q, task.id, "imperfect" if kind else "gold", s.messages, note))
        out[-1]["reward"] = s.reward  # τ²'s score of the replay (documentation; the loader ignores it)
    return out
