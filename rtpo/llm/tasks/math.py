"""Math tasks: local loaders for the public benchmark layouts, and a seeded arithmetic generator.

Nothing is downloaded: point a loader at a file you have, in any format rtpo.llm.data_files reads (JSONL, a JSON
list, Parquet, Arrow, a `datasets` save_to_disk folder; docs/data.md).  `fields` ({question, answer, id}:
column) points a layout at your own column names (dotted for nested columns).  A bad file is a one-line
`MathDataError` naming the file, the line (row) and the field: non-UTF-8 bytes, invalid JSON, a record
that is not an object, a missing or empty field, and a duplicate id (an error, not a warning: per-problem
Pass@k and eval results are keyed by id, so two problems under one id would silently merge).

A gold answer that holds a `\\boxed{}` (a worked solution) becomes the contents of its last box.

Layouts (the public field names of each benchmark's common release; alternatives in order tried):

| layout  | source (public release)                          | question field            | gold answer field                 |
|---------|--------------------------------------------------|---------------------------|-----------------------------------|
| gsm8k   | openai/gsm8k, main, JSONL                        | question                  | answer: solution, then `#### n`   |
| math500 | HuggingFaceH4/MATH-500, test.jsonl               | problem                   | answer (also: solution, subject…) |
| aime24  | HuggingFaceH4/aime_2024 (id, problem, solution,  | problem / Problem /       | answer / Answer (int or string)   |
|         | answer, url, year); Maxwell-Jia/AIME_2024 (ID,   | question                  |                                   |
|         | Problem, Solution, Answer)                       |                           |                                   |
| aime25  | opencompass/AIME2025 aime2025-I/II.jsonl         | question / problem        | answer                            |
|         | (question, answer); math-ai/aime25 (problem,     |                           |                                   |
|         | answer, id)                                      |                           |                                   |
| amc23   | math-ai/amc23, zwhe99/amc23 (id, question,       | question / problem        | answer (a float such as 27.0:     |
|         | answer, url)                                     |                           | integral floats become "27")      |
| oe_math | OlympiadBench OE_TO_maths_en_COMP (id, question, | question                  | final_answer: list of LaTeX       |
|         | solution, final_answer, is_multiple_answer,      |                           | strings in `$…$`; several answers |
|         | unit, answer_type, …)                            |                           | are joined with ", "              |
| math    | the MATH release (hendrycks: problem, level,      | problem                   | solution: its last `\\boxed{}`    |
|         | type, solution)                                   |                           |                                   |
| verl    | verl RLHFDataset parquet (data_source, prompt:    | prompt (last user turn)   | reward_model.ground_truth         |
|         | chat messages, ability, reward_model, extra_info) | id: extra_info.index      |                                   |
| generic | any file; name your columns in `fields`           | question / problem        | answer                            |
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rtpo.core.registry import Registry
from rtpo.llm.chat import last_boxed
from rtpo.llm.data_files import DataError, chat_text, read_records


class MathDataError(DataError):
    """A dataset file that does not fit its layout; the message names file, line and field."""


@dataclass(frozen=True)
class MathItem:
    """One problem: question text and gold answer (a short LaTeX/number string, no `$`)."""

    id: str
    question: str
    answer: str
    source: str


@dataclass(frozen=True)
class MathTask:
    """An indexable, immutable set of problems; the environment's query ids index into it."""

    name: str
    items: tuple[MathItem, ...]

    def __post_init__(self) -> None:
        if not self.items:
            raise MathDataError(f"task {self.name!r} has no items")

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> MathItem:
        return self.items[i]

    def __iter__(self) -> Iterator[MathItem]:
        return iter(self.items)


@dataclass(frozen=True)
class Layout:
    question_fields: tuple[str, ...]
    answer_fields: tuple[str, ...]
    answer_fn: Callable[[Any, str], str]  # (raw value, where) -> gold string; raises MathDataError
    id_fields: tuple[str, ...] = ("id", "ID", "unique_id", "problem_idx")


LAYOUTS: Registry = Registry("math layout")


def _plain(value: Any, where: str) -> str:
    if isinstance(value, bool) or value is None:
        raise MathDataError(f"{where}: expected a number or string, got {value!r}")
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise MathDataError(f"{where}: not a finite number: {value!r}")
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, int):
        return str(value)
    if not isinstance(value, str):
        raise MathDataError(f"{where}: expected a number or string, got {type(value).__name__}")
    text = value.strip()
    if "\\boxed" in text or "\\fbox" in text:
        return _boxed(text, where)  # a worked solution (MATH's `solution`): its last \boxed{} is the answer
    if len(text) >= 2 and text.startswith("$") and text.endswith("$"):
        text = text.strip("$").strip()
    if not text:
        raise MathDataError(f"{where}: empty answer")
    return text


def _boxed(value: Any, where: str) -> str:
    """The gold answer of a worked solution: the contents of its last \\boxed{} (MATH's convention)."""
    if not isinstance(value, str):
        raise MathDataError(
            f"{where}: expected a solution string with a \\boxed{{}} answer, got {type(value).__name__}"
        )
    inner = last_boxed(value)
    if inner is None:
        raise MathDataError(f"{where}: no \\boxed{{...}} answer in the solution (or its braces are unbalanced)")
    inner = inner.strip()
    if not inner:
        raise MathDataError(f"{where}: the last \\boxed{{}} is empty")
    return inner


def _gsm8k(value: Any, where: str) -> str:
    if not isinstance(value, str) or "####" not in value:
        raise MathDataError(f"{where}: a GSM8K answer must end with '#### <number>'")
    final = value.rsplit("####", 1)[1].strip().replace(",", "")
    if not final:
        raise MathDataError(f"{where}: nothing after '####'")
    return final


def _oe(value: Any, where: str) -> str:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise MathDataError(f"{where}: empty final_answer list")
    return ", ".join(_plain(v, where) for v in values)


for _name, _layout in {
    "gsm8k": Layout(("question",), ("answer",), _gsm8k),
    "math500": Layout(("problem",), ("answer",), _plain),
    "aime24": Layout(("problem", "Problem", "question"), ("answer", "Answer"), _plain),
    "aime25": Layout(("question", "problem", "Problem"), ("answer", "Answer"), _plain),
    "amc23": Layout(("question", "problem"), ("answer",), _plain),
    "oe_math": Layout(("question",), ("final_answer",), _oe),
    # the MATH training/test release (hendrycks: problem, solution, level, type): no answer field, the gold
    # answer is the last \boxed{} of `solution`
    "math": Layout(("problem",), ("solution",), _boxed),
    # verl's RLHFDataset parquet: prompt = chat messages, reward_model.ground_truth, data_source, extra_info
    "verl": Layout(("prompt",), ("reward_model.ground_truth",), _plain, ("extra_info.index", "id", "index")),
    # any file: point task.fields at your columns (defaults: question, answer, id)
    "generic": Layout(("question", "problem"), ("answer",), _plain),
}.items():
    LAYOUTS.register(_name)(_layout)


def _question(value: Any, where: str) -> str:
    text = chat_text(value, where)  # a string, or verl's chat-list prompt (the last user message)
    if not text.strip():
        raise MathDataError(f"{where} must be a non-empty string")
    return text.strip()


def load_math(
    path: str | os.PathLike,
    layout: str,
    name: str | None = None,
    limit: int | None = None,
    fields: Mapping[str, str] | None = None,
    split: str | None = None,
) -> MathTask:
    """Load a benchmark file (any rtpo.llm.data_files format) in one of LAYOUTS; `limit` keeps the first items.

    fields: {question|answer|id: column} overrides where the layout looks (dotted paths reach nested
    columns, e.g. {"answer": "reward_model.ground_truth"}); errors call it `task.fields`.
    """
    path = os.fspath(path)
    spec: Layout = LAYOUTS.get(layout)
    fields = dict(fields or {})
    bad = sorted(set(fields) - {"question", "answer", "id"})
    if bad:
        raise MathDataError(f"task.fields: unknown key(s) {', '.join(bad)} (valid: question, answer, id)")
    sources = {
        "question": fields.get("question", spec.question_fields),
        "answer": fields.get("answer", spec.answer_fields),
    }
    try:
        records = read_records(
            path,
            fields=sources,
            id_field=fields.get("id", spec.id_fields),
            require_id="id" in fields,
            allow_empty=True,  # the layout's answer function names an empty answer precisely
            split=split,
            limit=limit,
            mapping_name="task.fields",
        )
    except DataError as e:
        raise MathDataError(str(e)) from None
    items = []
    for i, rec in enumerate(records):
        try:
            question = _question(rec["question"], f"{rec.where}: {rec.label('question')}")
            answer = spec.answer_fn(rec["answer"], f"{rec.where}: {rec.label('answer')}")
        except DataError as e:
            raise MathDataError(str(e)) from None
        items.append(MathItem(rec.id if rec.id is not None else f"{layout}-{i}", question, answer, layout))
    return MathTask(name or f"{layout}:{os.path.basename(path.rstrip(os.sep))}", tuple(items))


def arithmetic_task(
    n: int, seed: int, max_operand: int = 99, num_operands: int = 3, ops: Sequence[str] = ("+", "-", "*")
) -> MathTask:
    """n seeded integer-arithmetic problems (quick runs): e.g. 'Compute 17 * 4 - 23.'; gold is the exact value."""
    if n <= 0 or num_operands < 2 or max_operand < 1:
        raise ValueError("arithmetic_task needs n > 0, num_operands >= 2, max_operand >= 1")
    bad = set(ops) - {"+", "-", "*"}
    if bad:
        raise ValueError(f"arithmetic_task: unsupported operators {sorted(bad)}; valid: +, -, *")
    rng = random.Random(seed)
    items = []
    for i in range(n):
        terms = [str(rng.randint(1, max_operand))]
        for _ in range(num_operands - 1):
            terms += [rng.choice(list(ops)), str(rng.randint(1, max_operand))]
        expr = " ".join(terms)
        value = _eval_int(terms)
        items.append(
            MathItem(
                f"arith-{seed}-{i}", f"Compute {expr}. Put the final answer in \\boxed{{}}.", str(value), "arithmetic"
            )
        )
    return MathTask(f"arithmetic(n={n},seed={seed})", tuple(items))


def _eval_int(terms: list[str]) -> int:
    """Evaluate + - * with the usual precedence, without eval()."""
    products = [int(terms[0])]
    signs = [1]
    for op, tok in zip(terms[1::2], terms[2::2]):
        if op == "*":
            products[-1] *= int(tok)
        else:
            products.append(int(tok))
            signs.append(1 if op == "+" else -1)
    return sum(s * p for s, p in zip(signs, products))


TASK_BUILDERS: Registry = Registry("task")
TASK_BUILDERS.register("arithmetic")(arithmetic_task)
TASK_BUILDERS.register("math_file")(load_math)


def build_task(kind: str, **params: Any) -> MathTask:
    """A task from config: `build_task("arithmetic", n=64, seed=0)`, `build_task("math_file", path=..., layout="gsm8k")`."""
    return TASK_BUILDERS.build(kind, **params)
