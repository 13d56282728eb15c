"""Gold trajectories (demonstrations for rtpo.llm.sft; the command is rtpo.commands.gold) for the three task families, written by stepping the
scenario's own environment, so every tool result, retrieval and user reply in them is a real one.

    python -m rtpo.commands.gold SCENARIO --out FILE [--imperfect 0.15] [--seed 0] [key=value ...]

- math with the Python tool (task.kind arithmetic): the policy calls python with the problem's expression,
  reads the sandbox's output and answers it in \\boxed{}.
- multi-hop QA (task.kind multihop and the other QA layouts): a search for the question's subject, a
  search for the bridge entity read from the retrieved paragraph, then the answer in \\boxed{} (rtpo.llm.gold_qa).
- τ²-airline: each task's gold actions called in order through the environment's database, with the
  scripted user answering the agent's messages (rtpo.llm.gold_airline).

A share `imperfect` of the problems (drawn with `seed`) gets an imperfect trajectory instead, of a kind
named in its `note`: for math `guess` (answers without the tool: a wrong number), `bad_call` (a call
with a syntax error, then the right call and answer: one wasted turn) and `miscopy` (the right call, a
digit of its output changed in the answer); the other families document theirs in their modules.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from rtpo.core.types import Generation, Ragged

IMPERFECT_MATH = ("guess", "bad_call", "miscopy")
_EXPR = re.compile(r"^Compute (.+?)\. Put the final answer")


def tool_call(name: str, arguments: dict) -> str:
    """An assistant turn that is one tool call, in the Qwen3 template's format."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


class Stepper:
    """One episode of `env` stepped by assistant texts; records the messages a demonstration holds."""

    def __init__(self, env: Any, problem: int, seed: int = 0) -> None:
        self.env = env
        self.rng = np.random.default_rng(seed)
        (self.ep,) = env.reset(np.array([problem]), self.rng)
        self.messages: list[dict] = []
        self.done = False
        self.reward = 0.0

    def say(self, text: str) -> str | None:
        """Step with assistant `text`; returns the feedback (None when the episode ended)."""
        if self.done:
            raise RuntimeError("the episode already ended")
        chat = self.env.chat
        ids = np.concatenate([chat.ids(text), [chat.im_end_id]]).astype(np.int64)
        gen = Generation(Ragged.from_rows([ids], dtype=np.int64), Ragged.from_rows([np.zeros(ids.size)]))
        (self.ep,), out = self.env.step([self.ep], gen, self.rng)
        self.messages.append({"role": "assistant", "content": text})
        self.done = bool(out.done[0])
        self.reward = float(out.reward[0])
        fb = out.feedback[0]
        if not self.done:
            self.messages.append({"role": self.feedback_role, "content": fb})
        return None if self.done else fb

    @property
    def feedback_role(self) -> str:
        return "tool"


def _record(problem: int, question: str | None, quality: str, messages: list[dict], note: str | None) -> dict:
    rec: dict[str, Any] = {"problem": problem}
    if question is not None:
        rec["question"] = question
    rec["quality"] = quality
    if note:
        rec["note"] = note
    rec["messages"] = messages
    return rec


def _miscopy(value: str, rng: np.random.Generator) -> str:
    digits = [i for i, c in enumerate(value) if c.isdigit()]
    i = int(rng.choice(digits))
    d = (int(value[i]) + int(rng.integers(1, 10))) % 10
    if i == 0 or (i == 1 and value[0] == "-"):
        d = d or 1  # no leading zero
    return value[:i] + str(d) + value[i + 1 :]


def math_demonstrations(env: Any, imperfect: float = 0.15, seed: int = 0) -> list[dict]:
    """One demonstration per problem of an arithmetic task (see the module docstring)."""
    rng = np.random.default_rng(seed)
    out = []
    for q in range(len(env.task)):
        item = env.task[q]
        m = _EXPR.match(item.question)
        if m is None:
            raise ValueError(f"problem {q}: not a generated arithmetic question ({item.question[:60]!r})")
        expr = m.group(1)
        kind = IMPERFECT_MATH[int(rng.integers(len(IMPERFECT_MATH)))] if rng.random() < imperfect else None
        if kind == "bad_call" and env.num_turns < 3:
            kind = "miscopy"
        s = Stepper(env, q)
        if kind == "guess":
            s.say(f"\\boxed{{{_miscopy(item.answer, rng)}}}")
        else:
            if kind == "bad_call":
                s.say(tool_call("python", {"code": f"print({expr}"}))
            fb = s.say(tool_call("python", {"code": f"print({expr})"}))
            if fb is None:
                raise ValueError(f"problem {q}: the episode ended at the tool call (num_turns too small?)")
            value = fb.strip().splitlines()[-1].strip() if fb.strip() else ""
            if kind is None and value != item.answer:
                raise ValueError(f"problem {q}: the sandbox printed {fb!r}, the gold answer is {item.answer!r}")
            s.say(f"\\boxed{{{_miscopy(value, rng) if kind == 'miscopy' else value}}}")
        if kind is None and s.reward != 1.0:
            raise ValueError(f"problem {q}: the gold trajectory scored {s.reward}")
        out.append(_record(q, item.question, "imperfect" if kind else "gold", s.messages, kind))
    return out


def write_demonstrations(records: list[dict], out: str | Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return out
