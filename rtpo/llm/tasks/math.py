"""Math tasks: local loaders for the public benchmark layouts, and a seeded arithmetic generator.

Nothing is downloaded: point a loader at a file you have (JSONL, a JSON list, or Parquet when pyarrow
is installed).  A bad file is a one-line `MathDataError` naming the file, the line (row) and the field:
non-UTF-8 bytes, invalid JSON, a record that is not an object, a missing or empty field, and a duplicate
id (an error, not a warning: per-problem Pass@k and eval results are keyed by id, so two problems under
one id would silently merge).

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
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from rtpo.core.registry import Registry


class MathDataError(ValueError):
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
    if len(text) >= 2 and text.startswith("$") and text.endswith("$"):
        text = text.strip("$").strip()
    if not text:
        raise MathDataError(f"{where}: empty answer")
    return text


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
}.items():
    LAYOUTS.register(_name)(_layout)


def _records(path: str) -> Iterator[tuple[int, Any]]:
    """(line or row number, record) from JSONL, a JSON list, or Parquet."""
    ext = os.path.splitext(path)[1].lower()
    if ext == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise MathDataError(
                f"{path}: reading Parquet needs pyarrow (pip install pyarrow), or convert to JSONL"
            ) from None
        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as e:  # noqa: BLE001 - pyarrow raises many types for a damaged file
            raise MathDataError(f"{path}: not a readable Parquet file ({type(e).__name__})") from None
        yield from enumerate(rows, start=1)
        return
    with open(path, "rb") as f:
        if ext == ".json":
            raw = f.read()
            try:
                data = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                line = raw[: e.start].count(b"\n") + 1
                raise MathDataError(f"{path}:{line}: not UTF-8 (byte 0x{raw[e.start]:02x})") from None
            except json.JSONDecodeError as e:
                raise MathDataError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
            except RecursionError:
                raise MathDataError(f"{path}: JSON nested too deeply") from None
            if isinstance(data, dict) and isinstance(data.get("data"), list):
                data = data["data"]
            if not isinstance(data, list):
                raise MathDataError(f"{path}: a .json file must hold a list of records")
            yield from enumerate(data, start=1)
            return
        for lineno, raw_line in enumerate(f, start=1):
            try:
                line = raw_line.decode("utf-8")
            except UnicodeDecodeError as e:
                raise MathDataError(f"{path}:{lineno}: not UTF-8 (byte 0x{raw_line[e.start]:02x})") from None
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                raise MathDataError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
            except (ValueError, RecursionError):  # an int past 4300 digits, nesting past the stack
                raise MathDataError(f"{path}:{lineno}: invalid JSON (too deeply nested or a number too long)") from None


def load_math(path: str | os.PathLike, layout: str, name: str | None = None, limit: int | None = None) -> MathTask:
    """Load a benchmark file in one of LAYOUTS; `limit` keeps the first items."""
    path = os.fspath(path)
    spec: Layout = LAYOUTS.get(layout)
    if not os.path.isfile(path):
        raise MathDataError(f"{path}: no such file")
    items = []
    seen: dict[str, int] = {}  # id -> line: a duplicate is an error (per-problem Pass@k and eval keys need unique ids)
    for lineno, rec in _records(path):
        where = f"{path}:{lineno}"
        if not isinstance(rec, dict):
            raise MathDataError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        q_field = next((k for k in spec.question_fields if k in rec), None)
        if q_field is None:
            raise MathDataError(f"{where}: missing field {' / '.join(spec.question_fields)!r} (layout {layout})")
        question = rec[q_field]
        if not isinstance(question, str) or not question.strip():
            raise MathDataError(f"{where}: field {q_field!r} must be a non-empty string")
        a_field = next((k for k in spec.answer_fields if k in rec), None)
        if a_field is None:
            raise MathDataError(f"{where}: missing field {' / '.join(spec.answer_fields)!r} (layout {layout})")
        answer = spec.answer_fn(rec[a_field], f"{where}: field {a_field!r}")
        id_field = next((k for k in spec.id_fields if k in rec), None)
        item_id = str(rec[id_field]) if id_field else f"{layout}-{len(items)}"
        if item_id in seen:
            raise MathDataError(f"{where}: duplicate id {item_id[:60]!r} (first at line {seen[item_id]})")
        seen[item_id] = lineno
        items.append(MathItem(item_id, question.strip(), answer, layout))
        if limit is not None and len(items) >= limit:
            break
    return MathTask(name or f"{layout}:{os.path.basename(path)}", tuple(items))


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
    fn = TASK_BUILDERS.get(kind)
    try:
        return fn(**params)
    except TypeError as e:
        raise ValueError(f"task {kind!r}: {e}") from None
