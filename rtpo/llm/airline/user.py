"""User simulators for τ²-airline, pluggable by name (USER_SIMULATORS).

A simulator keeps an immutable per-episode state (so it is part of the boundary snapshot) and answers a
batch at once:

    start(task)                               -> (state, opening message)
    reply(tasks, states, agent_messages, rng) -> [(state, message, stop)]  one per episode

`stop` is the end-of-conversation signal (τ²'s ###STOP### / a transfer): the episode then ends and is
scored.  A reply that is None or empty is never passed on as nothing: the environment substitutes a
fixed line and counts it (metric user/empty), so a silent simulator cannot crash a run.

- scripted: deterministic, from the task's user_scenario.  Opening = reason_for_call + known_info
  (second person turned into first person).  Then, by the agent's message: asked for identity details
  (user id, name, reservation, date of birth, email) -> the known_info; asked to confirm (confirm /
  proceed / yes or no / would you like) -> "Yes, please go ahead."; the transfer message or a closing
  question ("anything else") -> stop; anything else -> a repeat of the request.  After `max_replies`
  replies it stops.  It never invents facts beyond the scenario, so runs and tests are reproducible.
- llm: a second engine (rtpo.llm.engines: vLLM or HF) playing the user from the task's instructions,
  in the way τ² prompts its user simulator: the scenario in the system prompt, the agent's messages as
  the other side of the chat, ###STOP### (or ###TRANSFER###) in its message ends the conversation.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from rtpo.core.registry import Registry
from rtpo.llm.airline.data import AirlineTask
from rtpo.llm.context_text import ContextEncoder

STOP = "###STOP###"
TRANSFER = "###TRANSFER###"
TRANSFER_MESSAGE = "YOU ARE BEING TRANSFERRED TO A HUMAN AGENT"
USER_SIMULATORS: Registry = Registry("user simulator")

_PRONOUNS = (
    (r"\bYou are\b", "I am"),
    (r"\byou are\b", "I am"),
    (r"\bYou were\b", "I was"),
    (r"\byou were\b", "I was"),
    (r"\bYou have\b", "I have"),
    (r"\byou have\b", "I have"),
    (r"\bYour\b", "My"),
    (r"\byour\b", "my"),
    (r"\bYourself\b", "Myself"),
    (r"\byourself\b", "myself"),
    (r"\bYou\b", "I"),
    (r"\byou\b", "I"),
)


def first_person(text: str) -> str:
    """The scenario's second-person text as the user would say it ("Your user id is x" -> "My user id is x")."""
    for pat, rep in _PRONOUNS:
        text = re.sub(pat, rep, text)
    return " ".join(text.split())


_IDENTITY = re.compile(
    r"user ?id|your (full )?name|first name|last name|date of birth|\bdob\b|email|verify|identif", re.I
)
_CONFIRM = re.compile(r"confirm|proceed|\(yes|yes or no|yes/no|would you like|shall i|do you want|go ahead", re.I)
_CLOSING = re.compile(r"anything else|have a (great|nice|good) day|goodbye", re.I)


@USER_SIMULATORS.register("scripted")
class ScriptedUser:
    """Deterministic user from the task's user_scenario (state: the number of replies given)."""

    def __init__(self, max_replies: int = 6) -> None:
        if max_replies < 1:
            raise ValueError(f"scripted user: max_replies must be >= 1, got {max_replies}")
        self.max_replies = max_replies

    def start(self, task: AirlineTask) -> tuple[int, str]:
        opening = first_person(task.reason_for_call)
        if task.known_info:
            opening += " " + first_person(task.known_info)
        return 0, opening

    def reply(
        self, tasks: Sequence[AirlineTask], states: Sequence[int], messages: Sequence[str], rng: np.random.Generator
    ) -> list[tuple[int, str, bool]]:
        return [self._one(t, s, m) for t, s, m in zip(tasks, states, messages)]

    def _one(self, task: AirlineTask, state: int, message: str) -> tuple[int, str, bool]:
        n = state + 1
        if TRANSFER_MESSAGE in message.upper():
            return n, TRANSFER, True
        if _CLOSING.search(message) or n > self.max_replies:
            return n, f"No, that's all. Thank you! {STOP}", True
        if _CONFIRM.search(message):
            return n, "Yes, please go ahead.", False
        if _IDENTITY.search(message):
            return n, first_person(task.known_info) or "I don't have that information.", False
        return n, first_person(task.reason_for_call), False


def user_system_prompt(task: AirlineTask) -> str:
    """The llm user's instructions: who it is, what it wants, what it knows, how to end (rtpo's wording)."""
    parts = [
        "You play a customer contacting an airline's customer-service agent. Write only the customer's next "
        "message, in plain conversational text, one message at a time. Stay in character; do not invent "
        "details that the scenario below does not give; if asked for something you do not know, say so.",
        f"Why you are calling: {task.reason_for_call}",
    ]
    if task.known_info:
        parts.append(f"What you know: {task.known_info}")
    if task.unknown_info:
        parts.append(f"What you do not know: {task.unknown_info}")
    if task.task_instructions:
        parts.append(f"How to behave: {task.task_instructions}")
    parts.append(
        f"When your request is fully handled, or it cannot be, write {STOP} at the end of your message. "
        f"If you are transferred to a human agent, write {TRANSFER}."
    )
    return "\n\n".join(parts)


@USER_SIMULATORS.register("llm")
class LLMUser:
    """A user played by a second engine (HF or vLLM): state = the conversation so far, as (role, text)
    pairs from the user's side ('assistant' = the simulated user, 'user' = the agent).

    engine:    anything with `generate(contexts: Ragged, turn, n, rng) -> Generation` (rtpo.llm.engines).
    tokenizer: the engine's chat tokenizer (Qwen3 template); thinking is switched off.
    """

    def __init__(self, engine: Any, tokenizer: Any, max_replies: int = 10) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.max_replies = max_replies

    def start(self, task: AirlineTask) -> tuple[tuple, str]:
        opening = first_person(task.reason_for_call)
        if task.known_info:
            opening += " " + first_person(task.known_info)
        # the opening is the scenario's own request, so every episode of a task starts alike
        return (("system", user_system_prompt(task)), ("assistant", opening)), opening

    def _ids(self, conversation: tuple) -> np.ndarray:
        msgs = [{"role": r, "content": t} for r, t in conversation]
        # the agent's messages and the scenario are untrusted text here: never control tokens
        encoder = ContextEncoder.for_tokenizer(self.tokenizer)
        return encoder.chat(msgs, add_generation_prompt=True, enable_thinking=False)

    def reply(
        self, tasks: Sequence[AirlineTask], states: Sequence[tuple], messages: Sequence[str], rng: np.random.Generator
    ) -> list[tuple[tuple, str | None, bool]]:
        from rtpo.core.types import Ragged

        convs = [s + (("user", m),) for s, m in zip(states, messages)]
        if not convs:
            return []
        gen = self.engine.generate(
            Ragged.from_rows([self._ids(c) for c in convs], dtype=np.int64),
            np.zeros(len(convs), dtype=np.int64),
            1,
            rng,
        )
        out = []
        for i, conv in enumerate(convs):
            ids = [int(t) for t in gen.tokens[i]]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            text = re.sub(r"<think>.*?</think>", "", text, flags=re.S).strip()
            n_replies = sum(r == "assistant" for r, _ in conv)
            stop = STOP in text or TRANSFER in text or n_replies >= self.max_replies
            out.append((conv + (("assistant", text),), text, stop))
        return out


def make_user(name: str, **params: Any):
    cls = USER_SIMULATORS.get(name)
    try:
        return cls(**params)
    except TypeError as e:
        raise ValueError(f"user simulator {name!r}: {e}") from None
