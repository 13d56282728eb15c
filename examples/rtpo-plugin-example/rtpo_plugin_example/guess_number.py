"""An rtpo plugin with a text environment: importing this module registers `guess_number`.

The user thinks of a number from 1 to `high`; the model guesses, the user answers "higher", "lower" or
"correct".  Reward 1 for the right guess (the episode ends there), 0 otherwise; a message without a
number gets "Please answer with one number." (metric text/no_number).  Each item has its own number,
fixed by the item index, the split and `seed` (train and eval draw different ones).

It is the smallest complete example of the text-environment interface (rtpo.llm.textenv, docs/plugins.md):
`__len__`, `reset(item, rng) -> (state, observation)` and `step(state, action, rng) -> TextStep`, the state
an immutable value (here a tuple of the guesses so far), so rtpo can snapshot and fork episodes at any
turn boundary without re-running anything.  A scenario runs it with

    plugins: [rtpo_plugin_example.guess_number]
    task: {kind: text, env: guess_number, params: {high: 8, items: 16}, num_turns: 3}

It is kept out of the package's `__init__` so that the tabular-only plugin loads without the llm extra.
"""

from __future__ import annotations

import re

import numpy as np

from rtpo.llm.textenv import TextEnvironment, TextStep, register_text_env

_NUMBER = re.compile(r"-?\d+")


@register_text_env("guess_number")
class GuessNumber(TextEnvironment):
    """split: "train" or "eval" (rtpo passes it); high: the numbers are 1..high; items: how many; seed."""

    def __init__(self, split: str = "train", high: int = 8, items: int = 16, seed: int = 0) -> None:
        if high < 2 or items < 1:
            raise ValueError(f"guess_number needs high >= 2 and items >= 1, got high={high}, items={items}")
        rng = np.random.default_rng([seed, 0 if split == "train" else 1])
        self.high = high
        self.targets = tuple(int(t) for t in rng.integers(1, high + 1, size=items))

    def __len__(self) -> int:
        return len(self.targets)

    def reset(self, item: int, rng: np.random.Generator) -> tuple[tuple, str]:
        return (
            self.targets[item],
            (),
        ), f"I am thinking of a number from 1 to {self.high}. Guess it: answer with one number."

    def step(self, state: tuple, action: str, rng: np.random.Generator) -> TextStep:
        target, guesses = state
        found = _NUMBER.findall(action)
        if not found:
            return TextStep(state, "Please answer with one number.", metrics={"no_number": 1})
        guess = int(found[-1])
        state = (target, guesses + (guess,))
        if guess == target:
            return TextStep(state, None, reward=1.0, done=True, metrics={"solved": 1})
        return TextStep(state, "Higher." if guess < target else "Lower.", metrics={"wrong": 1})
