"""Context maps ψ: the boundary state S_k of a chat episode -> the token ids c_k = ψ(S_k) the model sees.

S_k (SPEC §1) is the prompt and every earlier turn (response l_j, feedback f_j).  Each turn is kept in
the three token blocks a map can choose from (`chat.Qwen3Chat`): the raw assistant block (the sampled
ids verbatim, thinking included), the stripped assistant block (content only) and the feedback block.
A map picks blocks; nothing is re-tokenized, so c_k is cheap and deterministic, and the ids recorded at
rollout (Trajectory.contexts) are exactly what training reuses (Eq. 5, 18).

Registered maps (CONTEXT_MAPS, select by name with `make_context_map`):
- identity:    full history, thinking included: c_{k+1} = c_k ⊕ l_k ⊕ f_k ⊕ prompt (append-only).
- think_strip: the paper's E.4 filter: drop <think>…</think> from every earlier assistant turn, keep
               commentary, tool calls and tool results.
- last_turns:  the prompt and only the last m turns (`m`, optionally think-stripped).
- summarize:   the prompt, one summary block per older turn, the last m turns in full (E.2's summarisation;
               the summaries are written when a turn ends and kept in S_k, rtpo.llm.summaries).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from rtpo.core.registry import Registry


def _frozen_ids(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.int64).reshape(-1)
    if a.flags.writeable:
        a = a.copy()
        a.flags.writeable = False
    return a


_EMPTY = np.zeros(0, dtype=np.int64)
_EMPTY.flags.writeable = False


@dataclass(frozen=True)
class TurnBlocks:
    """One finished turn of S_k as token blocks (1-D int64 arrays, never mutated).

    raw:       generation prompt + the sampled response ids + <|im_end|> + newline.
    stripped:  the same assistant message with its thinking removed.
    feedback:  the tool/feedback message that answered it.
    summary:   a short message standing for the whole turn (rtpo.llm.summaries), written when the turn
               finished; empty unless the environment's ψ uses summaries.
    """

    raw: np.ndarray
    stripped: np.ndarray
    feedback: np.ndarray
    summary: np.ndarray = field(default_factory=lambda: _EMPTY)

    def __post_init__(self) -> None:
        for name in ("raw", "stripped", "feedback", "summary"):
            object.__setattr__(self, name, _frozen_ids(getattr(self, name)))


@dataclass(frozen=True)
class ChatState:
    """S_k: prompt block (system, tools, user; no generation prompt) and the k finished turns."""

    prompt: np.ndarray
    turns: tuple[TurnBlocks, ...]
    generation_prompt: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt", _frozen_ids(self.prompt))
        object.__setattr__(self, "generation_prompt", _frozen_ids(self.generation_prompt))
        object.__setattr__(self, "turns", tuple(self.turns))

    def append(self, turn: TurnBlocks) -> ChatState:
        """S_{k+1} = S_k ∘ (l_k, f_k); shares every earlier block (snapshots are cheap)."""
        return ChatState(self.prompt, self.turns + (turn,), self.generation_prompt)

    @property
    def k(self) -> int:
        return len(self.turns)


class ContextMap(Protocol):
    name: str

    def __call__(self, state: ChatState) -> np.ndarray:
        """c_k = ψ(S_k) as int64 token ids, ending with the generation prompt."""


CONTEXT_MAPS: Registry = Registry("context map")


def _join(state: ChatState, turns, strip: bool) -> np.ndarray:
    parts = [state.prompt]
    for t in turns:
        parts.append(t.stripped if strip else t.raw)
        parts.append(t.feedback)
    parts.append(state.generation_prompt)
    return np.concatenate(parts).astype(np.int64, copy=False)


@CONTEXT_MAPS.register("identity")
@dataclass(frozen=True)
class Identity:
    """ψ = id: the full raw history (Eq. 5 with ψ the identity; A11 holds trivially)."""

    name: str = "identity"

    def __call__(self, state: ChatState) -> np.ndarray:
        return _join(state, state.turns, strip=False)


@CONTEXT_MAPS.register("think_strip")
@dataclass(frozen=True)
class ThinkStrip:
    """Qwen3 think-stripping (paper App. E.4, Fig. 4): earlier turns lose <think>…</think>, keep the rest.

    The current turn has no thinking in c_k yet (the model writes it), so every earlier turn is stripped.
    """

    name: str = "think_strip"

    def __call__(self, state: ChatState) -> np.ndarray:
        return _join(state, state.turns, strip=True)


@CONTEXT_MAPS.register("last_turns")
@dataclass(frozen=True)
class LastTurns:
    """Truncation: the prompt plus the last m turns (m >= 0), think-stripped when strip_thinking."""

    m: int = 2
    strip_thinking: bool = True
    name: str = "last_turns"

    def __post_init__(self) -> None:
        if not isinstance(self.m, int) or self.m < 0:
            raise ValueError(f"last_turns: m must be a non-negative integer, got {self.m!r}")

    def __call__(self, state: ChatState) -> np.ndarray:
        turns = state.turns[len(state.turns) - self.m :] if self.m else ()
        return _join(state, turns, strip=self.strip_thinking)


@CONTEXT_MAPS.register("summarize")
@dataclass(frozen=True)
class Summarize:
    """Summarisation (E.2): the prompt, a summary block for every turn but the last m, and the last m
    turns in full (think-stripped when strip_thinking).  The summaries are written when each turn ends
    (`summarizer`: extractive | engine, rtpo.llm.summaries) and stored in S_k, so ψ stays a pure function
    of S_k and c_k is exactly what the sampler saw (uses_summary tells the environment to write them)."""

    m: int = 1
    strip_thinking: bool = True
    summarizer: str = "extractive"
    name: str = "summarize"
    uses_summary: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.m, int) or self.m < 0:
            raise ValueError(f"summarize: m must be a non-negative integer, got {self.m!r}")

    def __call__(self, state: ChatState) -> np.ndarray:
        cut = max(0, len(state.turns) - self.m)
        parts = [state.prompt]
        for t in state.turns[:cut]:
            if t.summary.size == 0:
                raise ValueError("summarize: a turn without a summary block (the environment did not write it)")
            parts.append(t.summary)
        for t in state.turns[cut:]:
            parts.append(t.stripped if self.strip_thinking else t.raw)
            parts.append(t.feedback)
        parts.append(state.generation_prompt)
        return np.concatenate(parts).astype(np.int64, copy=False)


def make_context_map(name: str, **params) -> ContextMap:
    """Build a registered context map by name; unknown names list the valid ones, bad params name the key."""
    return CONTEXT_MAPS.build(name, **params)
