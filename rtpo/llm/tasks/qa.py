"""Multi-hop question answering: local loaders for HotpotQA, 2WikiMultiHopQA and the Search-R1 layout,
a seeded generator of multi-hop questions written in the official HotpotQA format, and the corpus
(`{id, title, text}` JSONL) a retriever indexes.

Nothing is downloaded: point a loader at a file you have (any format rtpo.llm.data_files reads: JSONL, a JSON
list, Parquet, Arrow, a datasets save_to_disk folder).  A bad file is a one-line `QADataError`
naming the file, the record (line or 1-based position) and the field.

Layouts (the public field names of each release):

| layout   | source (public release)                         | question   | gold answers                    | gold titles                |
|----------|-------------------------------------------------|------------|---------------------------------|----------------------------|
| hotpotqa | hotpot_{train,dev_distractor,dev_fullwiki}_v1.1 | question   | answer                          | supporting_facts[*][0]     |
|          | .json: a JSON list of {_id, question, answer,   |            |                                 |                            |
|          | supporting_facts, context, type, level}         |            |                                 |                            |
| 2wiki    | 2WikiMultihopQA {train,dev}.json: a JSON list   | question   | answer (+ answer_aliases when   | supporting_facts[*][0]     |
|          | of {_id, type, question, context,               |            | present)                        |                            |
|          | supporting_facts, evidences, answer}            |            |                                 |                            |
| searchr1 | Search-R1 / verl parquet or JSONL: {id,         | question   | golden_answers (list), or       | (none)                     |
|          | question, golden_answers, data_source, ...}     |            | reward_model.ground_truth.target|                            |

`context` is a list of [title, [sentence, ...]] paragraphs (HotpotQA's distractor setting gives the two
gold paragraphs and eight distractors); `corpus_from_contexts` turns every file's paragraphs into the
retrieval corpus (deduplicated by title), which is how a run works without a Wikipedia dump.

Answer format (the choice this module makes for the prompt): the model gives its final answer as
`\\boxed{...}`, as in the math family, so one response parser serves both; `<answer>...</answer>`
(Search-R1's tag) is accepted too when the scenario sets `answer_parse: answer_tag`.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rtpo.core.registry import Registry

DEFAULT_PROMPT = (
    "Answer the question. You can call the search tool to look up facts; each call returns passages "
    "from a document collection. Reason step by step, search as often as you need, and give the final "
    "answer (a short phrase) as \\boxed{...}.\n\nQuestion: {question}"
)


class QADataError(ValueError):
    """A QA file that does not fit its layout; the message names file, record and field."""


@dataclass(frozen=True)
class QAItem:
    """One question.  question: the prompt text shown to the model (the raw question in `raw_question`);
    answer: the gold answers (any of them counts); titles: the gold supporting paragraph titles (for
    retrieval recall; empty when the layout has none); paragraphs: the item's own context paragraphs as
    (title, text) pairs (the distractor setting's ten)."""

    id: str
    question: str
    answer: tuple[str, ...]
    source: str
    raw_question: str = ""
    titles: tuple[str, ...] = ()
    paragraphs: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class QATask:
    """An indexable, immutable set of questions; the environment's query ids index into it."""

    name: str
    items: tuple[QAItem, ...]

    def __post_init__(self) -> None:
        if not self.items:
            raise QADataError(f"task {self.name!r} has no items")

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> QAItem:
        return self.items[i]

    def __iter__(self) -> Iterator[QAItem]:
        return iter(self.items)


def _records(path: str) -> Iterator[tuple[str, Any]]:
    """(place, record) of a data file or datasets folder, read by rtpo.llm.data_files (JSONL, JSON, Parquet, Arrow)."""
    from rtpo.llm.data_files import DataError, iter_raw

    try:
        yield from iter_raw(path)
    except DataError as e:
        raise QADataError(str(e)) from None


def _text(rec: dict, field: str, where: str) -> str:
    value = rec.get(field)
    if value is None:
        raise QADataError(f"{where}: missing field {field!r}")
    if not isinstance(value, str) or not value.strip():
        raise QADataError(f"{where}: field {field!r} must be a non-empty string")
    return value.strip()


def _answers(value: Any, where: str) -> tuple[str, ...]:
    values = value if isinstance(value, (list, tuple)) else [value]
    out = []
    for v in values:
        if isinstance(v, bool) or v is None:
            raise QADataError(f"{where}: an answer must be a string or number, got {v!r}")
        if isinstance(v, float) and not math.isfinite(v):  # JSON's NaN/Infinity: no answer to compare with
            raise QADataError(f"{where}: a gold answer is {v!r}, not a string or a finite number")
        if isinstance(v, (int, float)):
            v = str(int(v)) if float(v).is_integer() else str(v)
        if not isinstance(v, str):
            raise QADataError(f"{where}: an answer must be a string or number, got {type(v).__name__}")
        if v.strip():
            out.append(v.strip())
    if not out:
        raise QADataError(f"{where}: no non-empty gold answer")
    return tuple(dict.fromkeys(out))


def _join_sentences(sents: Sequence[str], layout: str) -> str:
    """A paragraph from its sentences as the official files require: HotpotQA's sentences keep the space
    that separates them (" It lies ..."), so they are concatenated; 2WikiMultiHopQA's have none, so one
    space goes between two sentences unless one of them already has it."""
    if layout != "2wiki":
        return "".join(sents)
    out = ""
    for s in sents:
        if out and s and not out[-1].isspace() and not s[0].isspace():
            out += " "
        out += s
    return out


def _paragraphs(value: Any, where: str, layout: str = "hotpotqa") -> tuple[tuple[str, str], ...]:
    """HotpotQA/2Wiki `context`: [[title, [sentence, ...]], ...] -> ((title, text), ...)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise QADataError(f"{where}: field 'context' must be a list of [title, sentences] pairs")
    out = []
    for j, para in enumerate(value):
        if not (isinstance(para, (list, tuple)) and len(para) == 2 and isinstance(para[0], str)):
            raise QADataError(f"{where}: context[{j}] must be [title, [sentence, ...]]")
        title, sents = para
        if isinstance(sents, str):
            sents = [sents]
        if not isinstance(sents, list) or not all(isinstance(s, str) for s in sents):
            raise QADataError(f"{where}: context[{j}] sentences must be a list of strings")
        out.append((title.strip(), _join_sentences(sents, layout).strip()))
    return tuple(out)


def _titles(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise QADataError(f"{where}: field 'supporting_facts' must be a list of [title, sentence id] pairs")
    out = []
    for j, fact in enumerate(value):
        ok = isinstance(fact, (list, tuple)) and len(fact) == 2 and isinstance(fact[0], str)
        if not ok or isinstance(fact[1], bool) or not isinstance(fact[1], int) or fact[1] < 0:
            raise QADataError(
                f"{where}: field supporting_facts[{j}] must be [title, sentence id] (an integer >= 0), "
                f"got {json.dumps(fact, default=str)[:80]}"
            )
        out.append(fact[0].strip())
    return tuple(dict.fromkeys(out))


def _hotpot_like(rec: dict, where: str, layout: str) -> dict:
    answers = rec.get("answer")
    if answers is None:
        raise QADataError(f"{where}: missing field 'answer' (a test split without answers cannot be scored)")
    golds = _answers(answers, f"{where}: field 'answer'")
    if layout == "2wiki" and isinstance(rec.get("answer_aliases"), list):
        golds = tuple(dict.fromkeys(golds + _answers(rec["answer_aliases"] or golds[0], where)))
    return {
        "id": rec.get("_id", rec.get("id")),
        "question": _text(rec, "question", where),
        "answer": golds,
        "titles": _titles(rec.get("supporting_facts"), where),
        "paragraphs": _paragraphs(rec.get("context"), where, layout),
    }


def _searchr1(rec: dict, where: str, layout: str) -> dict:
    golds = rec.get("golden_answers")
    if golds is None:
        gt = (rec.get("reward_model") or {}).get("ground_truth") if isinstance(rec.get("reward_model"), dict) else None
        golds = gt.get("target") if isinstance(gt, dict) else gt
    if golds is None:
        raise QADataError(f"{where}: missing field 'golden_answers' (or reward_model.ground_truth.target)")
    if hasattr(golds, "tolist"):  # a numpy array out of parquet
        golds = golds.tolist()
    return {
        "id": rec.get("id", rec.get("_id")),
        "question": _text(rec, "question", where),
        "answer": _answers(golds, f"{where}: field 'golden_answers'"),
        "titles": (),
        "paragraphs": (),
    }


QA_LAYOUTS: Registry = Registry("QA layout")
QA_LAYOUTS.register("hotpotqa")(_hotpot_like)
QA_LAYOUTS.register("2wiki")(_hotpot_like)
QA_LAYOUTS.register("searchr1")(_searchr1)


def load_qa(
    path: str | os.PathLike,
    layout: str,
    name: str | None = None,
    limit: int | None = None,
    prompt: str = DEFAULT_PROMPT,
) -> QATask:
    """Load a QA file in one of QA_LAYOUTS; `prompt` formats {question} into the model's user message."""
    path = os.fspath(path)
    parse = QA_LAYOUTS.get(layout)
    if "{question}" not in prompt:
        raise QADataError("the QA prompt template must contain {question}")
    items: list[QAItem] = []
    seen: dict[str, str] = {}
    for where, rec in _records(path):
        if not isinstance(rec, dict):
            raise QADataError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        f = parse(rec, where, layout)
        item_id = str(f["id"]) if f["id"] is not None else f"{layout}-{len(items)}"
        if item_id in seen:
            raise QADataError(f"{where}: duplicate id {item_id[:60]!r} (first at {seen[item_id]})")
        seen[item_id] = where
        items.append(
            QAItem(
                id=item_id,
                question=prompt.replace("{question}", f["question"]),
                answer=f["answer"],
                source=layout,
                raw_question=f["question"],
                titles=f["titles"],
                paragraphs=f["paragraphs"],
            )
        )
        if limit is not None and len(items) >= limit:
            break
    if not items:
        raise QADataError(f"{path}: no records")
    return QATask(name or f"{layout}:{os.path.basename(path)}", tuple(items))


# -- the retrieval corpus --------------------------------------------------------------------------------


def corpus_from_contexts(tasks: Sequence[QATask], out: str | os.PathLike) -> Path:
    """Write the paragraphs of every item of `tasks` as corpus JSONL {id, title, text}, one line per
    distinct title (the first text seen wins), in first-seen order; returns the path."""
    out = Path(out)
    seen: dict[str, str] = {}
    for task in tasks:
        for item in task:
            for title, text in item.paragraphs:
                seen.setdefault(title, text)
    if not seen:
        raise QADataError("corpus_from_contexts: the tasks carry no context paragraphs (use task.corpus)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        for i, (title, text) in enumerate(seen.items()):
            f.write(json.dumps({"id": str(i), "title": title, "text": text}, ensure_ascii=False) + "\n")
    os.replace(tmp, out)
    return out


# -- a generated multi-hop task in the official HotpotQA format ------------------------------------------

_SYLLABLES = ("ka", "lo", "mi", "ren", "tu", "sa", "vor", "el", "di", "nam", "qui", "zo", "bar", "fen", "ho", "ja")


def _name(rng: random.Random, used: set[str], parts: int) -> str:
    """A capitalised made-up word of at least `parts` syllables not in `used` (one syllable more after
    every 50 collisions, so any number of distinct names can be drawn)."""
    tries = 0
    while True:
        word = "".join(rng.choice(_SYLLABLES) for _ in range(parts + tries // 50)).capitalize()
        if word not in used:
            used.add(word)
            return word
        tries += 1


def write_multihop(path: str | os.PathLike, n: int, seed: int, distractors: int = 8, people_per_city: int = 2) -> Path:
    """Write n seeded two-hop questions as an official-format HotpotQA JSON list; returns the path.

    Construction (what the retrieval tests' bounds come from): people, cities and countries get unique
    made-up names (one word per city and country, two words per person).  A person's paragraph says
    where they were born; a city's paragraph names its country; each city is the birthplace of at most
    `people_per_city` people.  Question i asks for the country of person i's birth city: the bridge
    paragraph (the person's) is the only document that contains the person's name, so BM25 on the
    question ranks it first; the city's name occurs in the city's paragraph and in the paragraphs of the
    people born there, so a search for the city finds its paragraph within the top 1 + people_per_city.
    Each item's context is its two gold paragraphs and `distractors` others, shuffled (the distractor
    setting's layout); supporting_facts cite sentence 0 of both gold paragraphs; type "bridge".
    """
    if n < 1 or distractors < 0 or people_per_city < 1:
        raise ValueError("write_multihop needs n >= 1, distractors >= 0, people_per_city >= 1")
    rng = random.Random(seed)
    used: set[str] = set()
    n_cities = -(-n // people_per_city)
    n_countries = max(2, n_cities // 3)
    countries = [_name(rng, used, 3) for _ in range(n_countries)]
    cities = [_name(rng, used, 3) for _ in range(n_cities)]
    country_of = {c: countries[i % n_countries] for i, c in enumerate(cities)}
    people = [f"{_name(rng, used, 2)} {_name(rng, used, 2)}" for _ in range(n)]
    city_of = {p: cities[i // people_per_city] for i, p in enumerate(people)}
    jobs = ("painter", "engineer", "poet", "farmer", "sailor", "judge", "chemist", "composer")
    para: dict[str, list[str]] = {}  # title -> sentences (HotpotQA keeps the separating space on the left one)
    for p in people:
        job = rng.choice(jobs)
        para[p] = [f"{p} was {'an' if job[0] in 'aeiou' else 'a'} {job} born in {city_of[p]}."]
    for c in cities:
        para[c] = [f"{c} is a city in {country_of[c]}. ", f"It lies on the river {_name(rng, used, 2)}."]
    titles = list(para)
    records = []
    for i, p in enumerate(people):
        city = city_of[p]
        gold = [p, city]
        others = [t for t in titles if t not in gold]
        picked = rng.sample(others, min(distractors, len(others)))
        context = gold + picked
        rng.shuffle(context)
        records.append(
            {
                "_id": f"mh-{seed}-{i}",
                "question": f"In which country is the city where {p} was born?",
                "answer": country_of[city],
                "supporting_facts": [[p, 0], [city, 0]],
                "context": [[t, list(para[t])] for t in context],
                "type": "bridge",
                "level": "easy",
            }
        )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(records, ensure_ascii=False, indent=0), encoding="utf-8")
    os.replace(tmp, path)
    return path


__all__ = [
    "DEFAULT_PROMPT",
    "QA_LAYOUTS",
    "QADataError",
    "QAItem",
    "QATask",
    "corpus_from_contexts",
    "load_qa",
    "write_multihop",
]
