"""Demonstrations for supervised fine-tuning (rtpo.core.methods.sft): the trajectory file, its checks, and
its rendering into training rows by replaying it through the run's own environment.

The file is JSON Lines, one demonstration a line (rtpo.llm.gold writes them for the three families):

    {"problem": 3,                                   index of the training problem (task item) it solves
     "question": "What is 4821 * 3377?",             optional: must equal that problem's question
     "quality": "gold",                              "gold" | "imperfect" (documentation and a metric)
     "messages": [{"role": "assistant", "content": "<tool_call>...</tool_call>"},
                  {"role": "tool", "content": "16280517"},
                  {"role": "assistant", "content": "\\boxed{16280517}"}]}

`messages` alternates the policy's turns (role assistant: the text the model writes, without the
generation prompt; with `<think>` when the scenario thinks) and the environment's answers (role tool or
user: f_k as the environment returned it when the file was written).  Every bad line is a one-line
error naming the file, the line and the field.

Rendering replays the assistant texts through the environment (reset on `problem`, then one `step` per
assistant turn with the text's token ids + <|im_end|>): the contexts c_k = ψ(S_k) come from the same
chat template, context map and tools as the RL run's, token for token, and every tool result is the one
the environment returns now (a file whose recorded answer differs is refused: the data is stale).  The
response tokens are the assistant's ids alone, so tool output and user turns are never trained on.
Replays are made once per demonstration and cached; the environment's counters are left untouched.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rtpo.core.methods.sft import Demonstrations
from rtpo.core.types import Generation, Ragged

QUALITIES = ("gold", "imperfect")
FEEDBACK_ROLES = ("tool", "user")


class DemonstrationError(ValueError):
    """A demonstrations file that cannot be used; the message names file, line and field."""


@dataclass(frozen=True)
class Demonstration:
    """One line of the file: the problem it solves, its quality, and its messages (role, content)."""

    line: int
    problem: int
    quality: str
    messages: tuple[tuple[str, str], ...]
    question: str | None = None

    @property
    def assistant_turns(self) -> tuple[str, ...]:
        return tuple(c for r, c in self.messages if r == "assistant")


def load_demonstrations(path: str | Path) -> list[Demonstration]:
    """Every demonstration of a JSONL file, checked; a bad line is a DemonstrationError naming it."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DemonstrationError(f"{path}: no such demonstrations file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DemonstrationError(f"{path}: cannot read it ({e})") from None
    out = []
    for n, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        out.append(_parse_line(path, n, raw))
    if not out:
        raise DemonstrationError(f"{path}: holds no demonstrations")
    return out


def _parse_line(path: Path, n: int, raw: str) -> Demonstration:
    where = f"{path}:{n}"
    try:
        rec = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise DemonstrationError(f"{where}: not valid JSON ({' '.join(str(e).split())})") from None
    if not isinstance(rec, dict):
        raise DemonstrationError(f"{where}: a demonstration must be a JSON object, got {type(rec).__name__}")
    unknown = sorted(set(rec) - {"problem", "question", "quality", "messages", "note", "reward"})
    if unknown:
        raise DemonstrationError(
            f"{where}: unknown field {unknown[0]!r} (fields: problem, question, quality, messages, note, reward)"
        )
    problem = rec.get("problem")
    if not isinstance(problem, int) or isinstance(problem, bool) or problem < 0:
        raise DemonstrationError(f"{where}: field 'problem' must be a non-negative integer, got {problem!r}")
    quality = rec.get("quality", "gold")
    if quality not in QUALITIES:
        raise DemonstrationError(f"{where}: field 'quality' must be one of {', '.join(QUALITIES)}, got {quality!r}")
    question = rec.get("question")
    if question is not None and not isinstance(question, str):
        raise DemonstrationError(f"{where}: field 'question' must be a string")
    msgs = rec.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise DemonstrationError(f"{where}: field 'messages' must be a non-empty list")
    parsed = []
    for j, m in enumerate(msgs):
        f = f"{where}: messages[{j}]"
        if not isinstance(m, dict):
            raise DemonstrationError(f"{f}: must be an object with role and content")
        role, content = m.get("role"), m.get("content")
        if role not in ("assistant", *FEEDBACK_ROLES):
            raise DemonstrationError(f"{f}.role: must be assistant, tool or user, got {role!r}")
        if not isinstance(content, str):
            raise DemonstrationError(f"{f}.content: must be a string, got {type(content).__name__}")
        want_assistant = j % 2 == 0
        if (role == "assistant") != want_assistant:
            raise DemonstrationError(
                f"{f}.role: messages alternate assistant, then tool/user feedback, starting with assistant; got {role!r}"
            )
        if role == "assistant" and not content.strip():
            raise DemonstrationError(f"{f}.content: an assistant turn must not be empty")
        parsed.append((role, content))
    return Demonstration(n, problem, quality, tuple(parsed), question)


class DemonstrationReplay:
    """The environment's DemonstrationEnvironment side: demonstrations of `path` rendered by `env`.

    Attached to an environment with `attach(env, path)`; `env.demonstrations(ids)` then returns the
    rows of demonstrations `ids` (indices into the file's demonstrations, in file order)."""

    def __init__(self, env: Any, path: str | Path) -> None:
        self.env = env
        self.path = Path(path)
        self.items = load_demonstrations(self.path)
        n = len(env.task)
        for d in self.items:
            if d.problem >= n:
                raise DemonstrationError(
                    f"{self.path}:{d.line}: field 'problem' is {d.problem}, but the task has {n} problems"
                )
            if d.question is not None:
                asked = _question(env.task[d.problem])
                if asked is not None and asked != d.question:
                    raise DemonstrationError(
                        f"{self.path}:{d.line}: field 'question' differs from the task's problem {d.problem} "
                        f"({d.question[:60]!r} vs {asked[:60]!r}): the file was written for another task"
                    )
        self._cache: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {}

    def __len__(self) -> int:
        return len(self.items)

    def qualities(self) -> dict[str, int]:
        out = dict.fromkeys(QUALITIES, 0)
        for d in self.items:
            out[d.quality] += 1
        return out

    def __call__(self, ids: np.ndarray) -> Demonstrations:
        contexts: list[np.ndarray] = []
        tokens: list[np.ndarray] = []
        seq: list[int] = []
        turn: list[int] = []
        for i in np.asarray(ids, dtype=np.int64):
            i = int(i)
            if not 0 <= i < len(self.items):
                raise IndexError(f"demonstration {i} outside {self.path} ({len(self.items)} demonstrations)")
            if i not in self._cache:
                self._cache[i] = self.replay(self.items[i])
            ctx, rsp = self._cache[i]
            contexts += ctx
            tokens += rsp
            seq += [i] * len(rsp)
            turn += list(range(len(rsp)))
        return Demonstrations(
            contexts=Ragged.from_rows(contexts, dtype=np.int64),
            tokens=Ragged.from_rows(tokens, dtype=np.int64),
            seq_id=np.asarray(seq, dtype=np.int64),
            turn=np.asarray(turn, dtype=np.int64),
        )

    def replay(self, d: Demonstration) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(contexts, responses) of each assistant turn of `d`, stepping the environment through it."""
        env = self.env
        chat = env.chat
        saved = _save_counters(env)
        rng = np.random.default_rng(d.line)  # a summariser or user that samples: the same draws every time
        try:
            (ep,) = env.reset(np.array([d.problem]), rng)
            contexts, responses = [], []
            msgs = d.messages
            for j in range(0, len(msgs), 2):
                where = f"{self.path}:{d.line}: messages[{j}]"
                ids = np.concatenate([chat.ids(msgs[j][1]), [chat.im_end_id]]).astype(np.int64)
                contexts.append(np.asarray(env.contexts([ep])[0], dtype=np.int64).copy())
                responses.append(ids)
                gen = Generation(Ragged.from_rows([ids], dtype=np.int64), Ragged.from_rows([np.zeros(ids.size)]))
                (ep,), outcome = env.step([ep], gen, rng)
                done = bool(outcome.done[0])
                if done and j + 1 < len(msgs):
                    raise DemonstrationError(
                        f"{where}: the episode ends after this turn (turn {j // 2} of {env.num_turns}), "
                        f"but the demonstration goes on"
                    )
                if not done and j + 1 < len(msgs):
                    got = outcome.feedback[0]
                    if got != msgs[j + 1][1]:
                        raise DemonstrationError(
                            f"{self.path}:{d.line}: messages[{j + 1}].content differs from what the environment "
                            f"returns now ({_short(msgs[j + 1][1])} vs {_short(got)}): rebuild the file"
                        )
            return contexts, responses
        finally:
            _restore_counters(env, saved)


def _short(text: Any) -> str:
    s = repr(text)
    return s if len(s) <= 70 else s[:67] + "..."


def _question(item: Any) -> str | None:
    """The question a demonstration names: QA items keep it as raw_question, airline tasks have an id."""
    for attr in ("raw_question", "question", "id"):
        v = getattr(item, attr, None)
        if isinstance(v, str) and v:
            return v
    return None


def _save_counters(env: Any) -> tuple:
    import copy

    return (copy.copy(env.metrics), getattr(env, "_capture", None), list(getattr(env, "_captured", []) or []))


def _restore_counters(env: Any, saved: tuple) -> None:
    env.metrics = saved[0]
    if saved[1] is not None:
        env._capture, env._captured = saved[1], saved[2]


def attach(env: Any, path: str | Path) -> DemonstrationReplay:
    """Make `env` a DemonstrationEnvironment over the demonstrations file `path`."""
    replay = DemonstrationReplay(env, path)
    env.demonstrations = replay
    env.num_demonstrations = len(replay)
    return replay


def demonstration_rows(env: Any, ids: Sequence[int]) -> Demonstrations:
    """The rows of demonstrations `ids` of an environment `attach` has prepared."""
    return env.demonstrations(np.asarray(ids, dtype=np.int64))
