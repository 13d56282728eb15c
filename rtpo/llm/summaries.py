"""Summaries of finished turns for the summarising context map ψ = `summarize` (paper E.2 names
summarisation beside truncation and think-stripping).

A summary is written once, when the turn finishes (LLMEnv.step), and kept in S_k as one more token
block of that turn (`contexts.TurnBlocks.summary`).  ψ then picks blocks as every map does, so c_k is
exactly what the sampler saw and RTPO trains on the recorded ids (ratio 1), while a flat baseline that
trains on the full history (`full_context_map: identity`) shows the mismatch of Eq. 2/10.

Summarisers (SUMMARIZERS, by name):
- extractive: deterministic, no model: the queries searched and the titles found (from the search
  tool's result itself, `ToolResult.found`, never parsed back out of its text; only a record written
  without them falls back to the `Doc i (Title: …)` lines), other tools by name, and the last sentence
  the assistant wrote.
- engine:     the rollout engine writes the summary (one response per turn, its own sampling settings,
  drawn from the step's rng: recorded, so nothing about consistency depends on how it was written).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from rtpo.core.registry import Registry
from rtpo.core.types import Ragged

_DOC = re.compile(r"^Doc (\d+) \(Title: ", re.MULTILINE)
_CALL = re.compile(r"<tool_call>.*?</tool_call>", re.DOTALL)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True)
class TurnRecord:
    """What a summariser reads of one finished turn: the assistant's content (no thinking), its tool
    calls (name, arguments), the feedback texts it got back and, per call, the names of what it found
    (`ToolResult.found`: a search's titles; empty when the tool gives none)."""

    content: str
    calls: tuple[tuple[str, Any], ...]
    results: tuple[str, ...]
    found: tuple[tuple[str, ...], ...] = ()


class Summarizer(Protocol):
    def summarize(self, turns: Sequence[TurnRecord], rng: np.random.Generator) -> list[str]:
        """One summary text per turn."""


SUMMARIZERS: Registry = Registry("summarizer")


def _titles(result: str) -> list[str]:
    """Titles of a search result given only as text: the lines `Doc 1 (Title: …)`, `Doc 2 …` in order
    (a `Doc N` line out of sequence is passage text), each title up to the parenthesis that closes
    `(Title:`, so `Ed Wood (film)` stays whole."""
    out: list[str] = []
    for m in _DOC.finditer(result):
        if int(m.group(1)) != len(out) + 1:
            continue
        depth, i = 1, m.end()
        while i < len(result) and result[i] != "\n":
            depth += {"(": 1, ")": -1}.get(result[i], 0)
            if depth == 0:
                out.append(result[m.end() : i])
                break
            i += 1
    return out


def _last_sentence(text: str, limit: int = 200) -> str:
    body = _CALL.sub(" ", text).strip()
    if not body:
        return ""
    parts = [p for p in _SENTENCE_END.split(body) if p.strip()]
    last = " ".join(parts[-1].split()) if parts else ""
    return last if len(last) <= limit else last[:limit] + "..."


@SUMMARIZERS.register("extractive")
@dataclass(frozen=True)
class ExtractiveSummarizer:
    """Queries, titles found and the last sentence written; `max_titles` titles per search at most."""

    max_titles: int = 5

    def summarize(self, turns: Sequence[TurnRecord], rng: np.random.Generator | None = None) -> list[str]:
        return [self.one(t) for t in turns]

    def one(self, t: TurnRecord) -> str:
        parts = []
        results = list(t.results)
        for j, (name, args) in enumerate(t.calls):
            res = results[j] if j < len(results) else ""
            if name == "search" and isinstance(args, dict):
                named = t.found[j] if j < len(t.found) else ()
                titles = list(dict.fromkeys(named or _titles(res)))[: self.max_titles]
                found = "; ".join(titles) if titles else "nothing"
                parts.append(f'searched "{str(args.get("query", ""))[:120]}" and found: {found}.')
            else:
                parts.append(f"called {name}" + (" (error)." if res.startswith("Error") else "."))
        last = _last_sentence(t.content)
        if last:
            parts.append(f"Noted: {last}")
        return "Earlier turn: " + (" ".join(parts) if parts else "no tool call.")


@SUMMARIZERS.register("engine")
class EngineSummarizer:
    """The engine summarises each turn from a fixed instruction; needs `engine` and `chat` (a Qwen3Chat)."""

    INSTRUCTION = (
        "Summarise in one or two sentences what the assistant searched for or computed in this step and "
        "what it found. Keep names and numbers.\n\nAssistant: {content}\n\nResults: {results}"
    )

    def __init__(self, engine: Any = None, chat: Any = None, max_chars: int = 2000) -> None:
        # the llm backend attaches the engine once it exists; the environment attaches its chat
        self.engine, self.chat, self.max_chars = engine, chat, max_chars

    def summarize(self, turns: Sequence[TurnRecord], rng: np.random.Generator) -> list[str]:
        if not turns:
            return []
        if self.engine is None or self.chat is None:
            raise RuntimeError("the engine summarizer has no engine: build the environment through the llm backend")
        prompts = []
        for t in turns:
            text = self.INSTRUCTION.format(
                content=_CALL.sub("[tool call]", t.content)[: self.max_chars],
                results=" | ".join(t.results)[: self.max_chars],
            )
            prompts.append(np.concatenate([self.chat.prompt_block(text), self.chat.generation_prompt]))
        gen = self.engine.generate(
            Ragged.from_rows(prompts, dtype=np.int64), np.zeros(len(prompts), dtype=np.int64), 1, rng
        )
        out = []
        for i in range(len(prompts)):
            ids = gen.tokens[i]
            if ids.size and int(ids[-1]) in self.chat.stop_ids:
                ids = ids[:-1]
            out.append("Earlier turn (summary): " + " ".join(self.chat.decode(ids).split()))
        return out


def make_summarizer(name: str, **params: Any) -> Summarizer:
    return SUMMARIZERS.build(name, **params)


__all__ = ["SUMMARIZERS", "EngineSummarizer", "ExtractiveSummarizer", "Summarizer", "TurnRecord", "make_summarizer"]
