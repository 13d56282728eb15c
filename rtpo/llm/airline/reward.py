"""τ²'s reward for an airline episode.

- DB:          replay the task's gold `actions` on a fresh database (the shared base, no changes) and
               compare the final database with the episode's: 1 if equal, else 0.  Gold calls that fail
               are skipped, as τ² does (their error leaves the database unchanged).
- COMMUNICATE: 1 if every `communicate_info` string occurs in some assistant message (case-insensitive,
               commas removed from the message), else 0; 1 when there is nothing to communicate.  Every
               assistant message counts, one that also calls a tool included (its text beside the call),
               as τ² counts every assistant message with text.
- ACTION:      1 if every gold action was called, else 0: same name and, on the gold action's
               compare_args (when it has them) or else on the keys of the agent's own call (as τ²
               compares), the same values on both sides.
- NL_ASSERTION: only through an optional judge (`judge(task, assistant_messages) -> float`), reported
               separately and never part of the reward unless listed in reward_basis and a judge is set.
The reward is the product of the components the task's `reward_basis` names.  An episode that did not
end normally (the user ended it, or the agent transferred to a human) scores 0, as τ² scores every
termination other than an agent or user stop.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rtpo.llm.airline.data import AirlineTask
from rtpo.llm.airline.db import AirlineDB
from rtpo.llm.airline.tools import call_tool


@dataclass(frozen=True)
class AirlineReward:
    reward: float
    db: float | None
    communicate: float | None
    action: float | None
    nl_assertion: float | None


def replay(base: AirlineDB, calls: Sequence[tuple[str, dict]]) -> AirlineDB:
    """The database after running `calls` (name, arguments) in order from `base`; failures skipped."""
    db = base
    for name, args in calls:
        db, _, _ = call_tool(db, name, args)
    return db


class AirlineScorer:
    """Scores episodes of one base database; each task's gold database is replayed once and cached."""

    def __init__(self, fresh: AirlineDB, judge: Callable[[AirlineTask, Sequence[str]], float] | None = None) -> None:
        self.fresh = fresh
        self.judge = judge
        self._gold: dict[str, AirlineDB] = {}

    def gold_db(self, task: AirlineTask) -> AirlineDB:
        if task.id not in self._gold:
            self._gold[task.id] = replay(self.fresh, [(a.name, a.arguments) for a in task.actions])
        return self._gold[task.id]

    def score(
        self,
        task: AirlineTask,
        db: AirlineDB,
        assistant_messages: Sequence[str],
        tool_calls: Sequence[tuple[str, dict]] = (),
        normal_end: bool = True,
    ) -> AirlineReward:
        db_r = float(db.same_as(self.gold_db(task)))
        com_r = communicate_reward(task, assistant_messages)
        act_r = action_reward(task, tool_calls)
        nl_r = None if self.judge is None or not task.nl_assertions else float(self.judge(task, assistant_messages))
        parts = {"DB": db_r, "COMMUNICATE": com_r, "ACTION": act_r, "NL_ASSERTION": nl_r}
        reward = 1.0
        for basis in task.reward_basis:
            value = parts[basis]
            if value is not None:
                reward *= value
        if not normal_end:
            reward = 0.0
        return AirlineReward(reward, db_r, com_r, act_r, nl_r)


def communicate_reward(task: AirlineTask, assistant_messages: Sequence[str]) -> float:
    texts = [m.lower().replace(",", "") for m in assistant_messages]
    return float(all(any(info.lower() in t for t in texts) for info in task.communicate_info))


def action_reward(task: AirlineTask, tool_calls: Sequence[tuple[str, dict]]) -> float:
    def matches(gold, call) -> bool:
        name, args = call
        if name != gold.name or not isinstance(args, dict):
            return False
        keys = set(gold.compare_args if gold.compare_args is not None else args)
        if not keys:
            return True
        mine = {k: v for k, v in args.items() if k in keys}
        return mine == {k: v for k, v in gold.arguments.items() if k in keys}

    return float(all(any(matches(g, c) for c in tool_calls) for g in task.actions))


class LLMJudge:
    """nl_assertions judged by an engine (rtpo.llm.engines: HF or vLLM): one yes/no question per assertion
    about the agent's messages; the component is 1 when every assertion is judged met, else 0 (as τ²
    combines its NL assertions).  Off unless configured (task.judge: llm); reported as
    reward/nl_assertion and part of the reward only when a task's reward_basis names NL_ASSERTION."""

    def __init__(self, engine: Any, tokenizer: Any) -> None:
        self.engine = engine
        self.tokenizer = tokenizer

    def messages(self, assertion: str, assistant_messages: Sequence[str]) -> list[dict]:
        said = "\n".join(f"- {m}" for m in assistant_messages) or "(the agent said nothing)"
        msgs = [
            {
                "role": "system",
                "content": "You check a customer-service conversation. Answer with one word: yes or no.",
            },
            {"role": "user", "content": f"The agent's messages:\n{said}\n\nIs this true of them: {assertion}"},
        ]
        return msgs

    def prompt(self, assertion: str, assistant_messages: Sequence[str]) -> str:
        return self.tokenizer.apply_chat_template(
            self.messages(assertion, assistant_messages), tokenize=False, add_generation_prompt=True,
            enable_thinking=False,
        )  # fmt: skip

    def prompt_ids(self, assertion: str, assistant_messages: Sequence[str]):
        """The judge's prompt ids; the agent's messages and the assertion are untrusted text."""
        from rtpo.llm.context_text import ContextEncoder

        return ContextEncoder.for_tokenizer(self.tokenizer).chat(
            self.messages(assertion, assistant_messages), add_generation_prompt=True, enable_thinking=False
        )

    def __call__(self, task: AirlineTask, assistant_messages: Sequence[str]) -> float:
        import numpy as np

        from rtpo.core.types import Ragged

        if not task.nl_assertions:
            return 1.0
        rows = [self.prompt_ids(a, assistant_messages) for a in task.nl_assertions]
        gen = self.engine.generate(
            Ragged.from_rows(rows, dtype=np.int64), np.zeros(len(rows), np.int64), 1, np.random.default_rng(0)
        )
        verdicts = []
        for i in range(len(rows)):
            text = self.tokenizer.decode([int(t) for t in gen.tokens[i]], skip_special_tokens=True)
            words = re.sub(r"<think>.*?(</think>|$)", " ", text, flags=re.S).split()
            verdicts.append(bool(words) and words[0].strip(".,!:").lower() == "yes")
        return float(all(verdicts))
