"""Gold trajectories for multi-hop QA with the search tool (rtpo.llm.gold), on the generated two-hop task
(task.kind multihop: HotpotQA-format records and the corpus built from their paragraphs).

A gold trajectory searches for the person the question names, reads the birth city from the retrieved
paragraph titled with that person, searches for the city, reads its country from the paragraph titled
with the city and answers it in \\boxed{}: every fact comes from a real BM25 result of the run's corpus
(the question never names the city, the person's paragraph never names the country).

Imperfect kinds (a share `imperfect` of the problems): `stop_early` (answers the city after one search:
F1 0), `bad_call` (a search call with a wrong argument name, the error it gets, then the gold steps;
needs num_turns >= 4).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from rtpo.llm.gold import Stepper, _record, tool_call

IMPERFECT_QA = ("stop_early", "bad_call")
_PERSON = re.compile(r"^In which country is the city where (.+) was born\?$")


def _doc_text(feedback: str, title: str) -> str | None:
    """The text of the retrieved passage titled `title` in a search result, None if it was not retrieved."""
    head = f"(Title: {title}) "
    for line in feedback.splitlines():
        if head in line:
            return line.split(head, 1)[1]
    return None


def qa_demonstrations(env: Any, imperfect: float = 0.15, seed: int = 0) -> list[dict]:
    """One demonstration per problem of a generated multihop task (see the module docstring)."""
    rng = np.random.default_rng(seed)
    out = []
    for q in range(len(env.task)):
        item = env.task[q]
        question = item.raw_question or item.question
        m = _PERSON.match(question)
        if m is None:
            raise ValueError(f"problem {q}: not a generated two-hop question ({question[:60]!r}): task.kind multihop")
        person = m.group(1)
        kind = IMPERFECT_QA[int(rng.integers(len(IMPERFECT_QA)))] if rng.random() < imperfect else None
        if kind == "bad_call" and env.num_turns < 4:
            kind = "stop_early"
        s = Stepper(env, q)
        if kind == "bad_call":
            s.say(tool_call("search", {"q": person}))
        fb = s.say(tool_call("search", {"query": person}))
        bio = _doc_text(fb or "", person)
        city = re.search(r" born in (.+?)\.$", bio or "")
        if city is None:
            raise ValueError(f"problem {q}: the search for {person!r} did not retrieve their paragraph")
        city = city.group(1)
        if kind == "stop_early":
            s.say(f"\\boxed{{{city}}}")
        else:
            fb = s.say(tool_call("search", {"query": city}))
            place = re.search(r" is a city in (.+?)\.", _doc_text(fb or "", city) or "")
            if place is None:
                raise ValueError(f"problem {q}: the search for {city!r} did not retrieve its paragraph")
            s.say(f"\\boxed{{{place.group(1)}}}")
            if kind is None and s.reward != 1.0:
                raise ValueError(f"problem {q}: the gold trajectory scored {s.reward} (answer {place.group(1)!r})")
        out.append(_record(q, question, "imperfect" if kind else "gold", s.messages, kind))
    return out
